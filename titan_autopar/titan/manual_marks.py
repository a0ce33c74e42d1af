"""Which modules of a TorchTitan model run as manual regions under `auto = true`.

`mark_job_regions(model, ep, manual_modules, style)`: the `[auto_parallel] manual_modules`
patterns, each marked with `manual_style`; without patterns, with `expert_parallel_degree > 1`,
every MoE block as "torchtitan_ep" (TorchTitan's own ExpertParallel on the ep dim). A MoE block
left unmarked is planned data-parallel (`graph/manual.py`). Used by the switch at run time and by
`titan-autopar plan --config`, so both plan the same regions.
"""

from __future__ import annotations

from torch import nn

from titan_autopar.graph.manual import ManualRegionError, is_moe_block, mark_matching, mark_style


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
