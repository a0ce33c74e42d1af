"""The TorchTitan switch: `[parallelism] auto = true` and the `[auto_parallel]` section.

A TorchTitan 0.2.2 job names this module in `[job] custom_config_module`; TorchTitan's config
manager imports it and merges `JobConfig` below into its own, field by field. Importing it also
registers, under the same names, wrapped train specs of llama3, llama4, deepseek_v3 and qwen3
whose parallelize function plans the model when `parallelism.auto` is set and otherwise calls
the model's own recipe unchanged (`titan/parallelize.py`), and puts a clear check of the
parallelism degrees against the rank count before TorchTitan's own (`titan/degree_check.py`).

Why these two are side effects of the import, and stay so: TorchTitan 0.2.2's trainer runs no
code of an extension's but this module's import. `torchtitan.train` parses the config (which
imports the module named in `[job] custom_config_module`), then builds `ParallelDims` (whose
`_validate` runs at once) and looks the model's train spec up; there is no registration hook or
entry point in between. So the import is the one place to register the wrapped specs and the
degree check, and both are installed once (a second import finds them marked) and leave a job
with `auto = false` to the model's own recipe. Code that only needs the fields -- `titan-autopar
plan --config`, which parses a job to plan it ahead -- names `titan/config_fields.py` instead,
which installs nothing.

The fields themselves are declared in `titan/config_fields.py`.
"""

from titan_autopar.titan.config_fields import JobConfig
from titan_autopar.titan.degree_check import install_degree_check
from titan_autopar.titan.parallelize import register_auto_train_specs

__all__ = ["JobConfig"]


register_auto_train_specs()
install_degree_check()
