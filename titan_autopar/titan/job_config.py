"""The TorchTitan switch: `[parallelism] auto = true` and the `[auto_parallel]` section.

A TorchTitan 0.2.2 job names this module in `[job] custom_config_module`; TorchTitan's config
manager imports it and merges `JobConfig` below into its own, field by field. Importing it also
registers, under the same names, wrapped train specs of llama3, llama4, deepseek_v3 and qwen3
whose parallelize function plans the model when `parallelism.auto` is set and otherwise calls
the model's own recipe unchanged (`titan/parallelize.py`), and puts a clear check of the
parallelism degrees against the rank count before TorchTitan's own (`titan/degree_check.py`).

The fields themselves are declared in `titan/config_fields.py`.
"""

from titan_autopar.titan.config_fields import JobConfig
from titan_autopar.titan.degree_check import install_degree_check
from titan_autopar.titan.parallelize import register_auto_train_specs

__all__ = ["JobConfig"]


register_auto_train_specs()
install_degree_check()
