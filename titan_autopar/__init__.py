"""titan_autopar: automatic parallelism planning for TorchTitan models."""

from titan_autopar.api import apply_plan, auto_parallelize, plan_model, plan_with_options
from titan_autopar.graph.manual import manual
from titan_autopar.plan import Plan
from titan_autopar.plan_options import PlanOptions

__all__ = ["plan_model", "plan_with_options", "apply_plan", "auto_parallelize", "manual", "Plan",
           "PlanOptions"]
