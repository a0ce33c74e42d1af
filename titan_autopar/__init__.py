"""titan_autopar: automatic parallelism planning for TorchTitan models."""

from titan_autopar.api import apply_plan, auto_parallelize, plan_model
from titan_autopar.graph.manual import manual
from titan_autopar.plan import Plan

__all__ = ["plan_model", "apply_plan", "auto_parallelize", "manual", "Plan"]
