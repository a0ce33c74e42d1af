"""TorchTitan models by name and flavor, built on the meta device for planning.

Owns `build_model`: looks the model up in TorchTitan's train-spec registry, copies the flavor's
arguments (the registry's are shared module globals), sets the sequence length, and constructs
the model under `torch.device("meta")` -- no memory, no weights. Also `global_batch`, the batch a
TorchTitan job feeds one step: local batch times the data-parallel degrees.
"""

from __future__ import annotations

import copy

import torch

from titan_autopar.solve.recipes import DATA


def build_model(name: str, flavor: str, seq_len: int) -> tuple[torch.nn.Module, object]:
    import importlib

    from torchtitan.protocols.train_spec import get_train_spec

    try:
        try:  # a built-in model: import only its own package (the full registry is slow)
            spec = importlib.import_module(f"torchtitan.models.{name}").get_train_spec()
        except (ImportError, AttributeError):
            spec = get_train_spec(name)
    except Exception as e:
        raise ValueError(f"unknown TorchTitan model {name!r} ({e}); try llama3, llama4, "
                         "deepseek_v3 or qwen3") from None
    if flavor not in spec.model_args:
        raise ValueError(f"model {name!r} has no flavor {flavor!r}: choose one of "
                         f"{', '.join(sorted(spec.model_args))}")
    args = copy.deepcopy(spec.model_args[flavor])
    args.max_seq_len = seq_len
    # torchtitan 0.2.2's DeepSeek-V3 reads `moe_impl`, which only update_from_config sets
    if not hasattr(args, "moe_impl") and hasattr(args, "expert_parallel_comm_backend"):
        args.moe_impl = args.expert_parallel_comm_backend
    with torch.device("meta"):
        model = spec.model_cls(args)
    return model, args


def global_batch(local_batch: int, dim_names, sizes) -> int:
    dp = 1
    for n, s in zip(dim_names, sizes):
        if n in DATA:
            dp *= s
    return local_batch * dp
