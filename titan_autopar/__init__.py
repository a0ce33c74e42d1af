"""titan_autopar: automatic parallelism planning for TorchTitan models."""

from titan_autopar.api import plan_model
from titan_autopar.plan import Plan

__all__ = ["plan_model", "Plan"]
