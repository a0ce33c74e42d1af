"""Which modules of a TorchTitan model run as manual regions under `auto = true`.

`mark_job_regions(model, ep, manual_modules, style)`: the `[auto_parallel] manual_modules`
patterns, each marked with `manual_style`; without patterns, with `expert_parallel_degree > 1`,
every MoE block as "torchtitan_ep" (TorchTitan's own ExpertParallel on the ep dim). A MoE block
left unmarked is planned data-parallel (`graph/manual.py`). Used by the switch at run time, by
`titan-autopar plan --config` and by the degree search, so all plan the same regions;
`titan-autopar plan --mesh ...,ep=N` marks them as a job with that ep degree would.

`ep_rule(manual_modules, style)` says which ep degrees those regions can run with, and
`check_job_regions` refuses a job whose ep degree and regions disagree (ep > 1 that no region
would use for expert parallelism, or torchtitan_ep regions without an ep dim), before anything
is built.
"""

from __future__ import annotations

from torch import nn

from titan_autopar.graph.manual import ManualRegionError, is_moe_block, mark_matching, mark_style
from titan_autopar.titan.config_check import ConfigError

STYLES = ("torchtitan_ep", "data_parallel")


def ep_rule(manual_modules, style: str) -> str:
    """"ep>1" where the job's regions need an ep dim (manual_modules run as torchtitan_ep),
    "ep=1" where they run no expert parallelism (data_parallel), else "any"."""
    if style == "data_parallel":
        return "ep=1"
    return "ep>1" if manual_modules else "any"


def check_job_regions(ep: int, manual_modules, style: str, source: str) -> None:
    """Refuse `[auto_parallel] manual_style` that is no style, or one that disagrees with
    `[parallelism] expert_parallel_degree` = `ep`, saying what to set."""
    if style not in STYLES:
        raise ConfigError(f"{source}: [auto_parallel] manual_style = {style!r} is not a style: "
                          'write "torchtitan_ep" or "data_parallel"')
    rule = ep_rule(manual_modules, style)
    if rule == "ep=1" and ep > 1:
        raise ConfigError(
            f'{source}: [auto_parallel] manual_style = "data_parallel" runs MoE blocks without '
            f"expert parallelism, but [parallelism] expert_parallel_degree = {ep}: set "
            'manual_style = "torchtitan_ep" to run the experts over the ep ranks, or '
            "expert_parallel_degree = 1")
    if rule == "ep>1" and ep <= 1:
        raise ConfigError(
            f"{source}: [auto_parallel] manual_modules run as manual_style = \"torchtitan_ep\" "
            "(TorchTitan's ExpertParallel on the ep dim), but [parallelism] "
            "expert_parallel_degree = 1: set it above 1 (dividing data_parallel_shard_degree and "
            'the experts), or manual_style = "data_parallel"')


def mark_job_regions(model: nn.Module, ep: int, manual_modules, style: str) -> list[str]:
    """Mark the job's manual regions on `model`; returns their qualified names."""
    if manual_modules:
        return mark_matching(model, list(manual_modules), style)
    if ep <= 1:
        return []
    blocks = [n for n, m in model.named_modules() if is_moe_block(m)]
    if not blocks:
        raise ManualRegionError(
            f"expert_parallel_degree = {ep}, but {type(model).__name__} has no MoE blocks: set "
            "expert_parallel_degree = 1")
    for n in blocks:
        mark_style(model.get_submodule(n), "torchtitan_ep")
    return blocks


def mark_mesh_regions(model: nn.Module, names, sizes) -> list[str]:
    """`plan --mesh` without a config: with an ep dim, every MoE block runs TorchTitan's
    ExpertParallel on it, as in a job with that expert_parallel_degree."""
    ep = dict(zip(names, sizes)).get("ep", 1)
    if ep > 1 and not any(is_moe_block(m) for m in model.modules()):
        raise ValueError(f"--mesh has ep={ep}, but {type(model).__name__} has no MoE blocks to "
                         "run expert-parallel: leave ep out of --mesh (dp_shard is the "
                         "data-parallel dim)")
    return mark_job_regions(model, ep, (), "torchtitan_ep")
