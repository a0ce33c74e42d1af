"""The files `titan-autopar plan --search` writes beside `--out`, and how to know them again.

For `--out plan70b.json` the search writes the winner's plan there, its `[parallelism]` block
to `plan70b.parallelism.toml` and the ranked table to `plan70b.search.md` (`search_outputs`).
`check_search_outputs` is the guard (`files.check_out_file`) on all three before the search
starts: each may replace only what a search wrote there before -- a plan that loads, a block
whose every line is the one `block_text` writes, a table laid out as `degree_search.table`
lays it out -- unless forced.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from titan_autopar.files import FileRefused, check_out_file, read_capped, write_atomic
from titan_autopar.solve.search import Degrees

_BLOCK_HEAD = "# the degrees `titan-autopar plan --config {} --search` chose\n"
_BLOCK_FIRST = re.compile(r"^# the degrees `titan-autopar plan --config [^\n]* --search` chose\n")
TABLE_HEAD = ("| degrees | auto step (ms) | recipe step (ms) | tokens/s per GPU | peak GiB | "
              "stage |\n|---|---|---|---|---|---|")
TABLE_END = "All figures are predictions of the cost model."
_TABLE = re.compile(re.escape(TABLE_HEAD) + r"\n(?:\|[^\n]*\|\n)+\nThe winner, [^\n]*"
                    + re.escape(TABLE_END) + r"\n")
_MAX_BYTES = 1 << 20  # a block is a few lines, a table a few hundred


def search_outputs(out) -> tuple[Path, Path, Path]:
    """(the winner's plan, its [parallelism] block, the table) for `--out`."""
    out = Path(out)
    stem = out.with_suffix("")
    return out, stem.with_suffix(".parallelism.toml"), stem.with_suffix(".search.md")


def block_text(config, degrees: Degrees) -> str:
    return _BLOCK_HEAD.format(config) + degrees.toml()


def _text(path) -> str | None:
    try:
        return read_capped(path, name=str(path), what="", fix="", limit=_MAX_BYTES).decode()
    except (FileRefused, UnicodeDecodeError):
        return None


def is_block_file(path) -> bool:
    """True if `path` holds a [parallelism] block exactly as `block_text` writes one."""
    text = _text(path)
    head = _BLOCK_FIRST.match(text or "")
    if not head:
        return False
    try:
        par = tomllib.loads(text[head.end():])["parallelism"]
        d = Degrees(dp_replicate=par["data_parallel_replicate_degree"],
                    dp_shard=par["data_parallel_shard_degree"], tp=par["tensor_parallel_degree"],
                    ep=par["expert_parallel_degree"], cp=par["context_parallel_degree"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return False
    return text == head.group(0) + d.toml()


def is_table_file(path) -> bool:
    """True if `path` holds a table laid out as `degree_search.table` writes one."""
    text = _text(path)
    return text is not None and _TABLE.fullmatch(text) is not None


def write_search_outputs(out, plan, config, degrees: Degrees, table_text: str, *,
                         timings: bool = False) -> tuple[Path, Path, Path]:
    """Write the winner's `plan`, its block and the table (each whole: `files.write_atomic`)."""
    plan_path, block, md = search_outputs(out)
    plan.save(plan_path, timings=timings)
    write_atomic(block, block_text(config, degrees))
    write_atomic(md, table_text + "\n")
    return plan_path, block, md


def check_search_outputs(out, force: bool) -> tuple[Path, Path, Path]:
    """Refuse, before the search, any of its three files that cannot be written or that would
    replace what a search did not write (unless `force`)."""
    from titan_autopar.plan import is_plan_file

    plan, block, md = search_outputs(out)
    check_out_file(plan, label=f"--out {out}", what="a plan", ours=is_plan_file, force=force)
    check_out_file(block, label=f"--out {out}: its [parallelism] block {block}",
                   what="a block a search wrote", ours=is_block_file, force=force,
                   example="plan.parallelism.toml")
    check_out_file(md, label=f"--out {out}: its table {md}", what="a table a search wrote",
                   ours=is_table_file, force=force, example="plan.search.md")
    return plan, block, md
