"""The plan corpus: a fixed list of planning cases whose plans must not change by accident.

Owns `CASES` (one declarative row per case: model, simulated mesh, planning options, or a
`titan-autopar` command line) and the baseline `benchmarks/plan_corpus.json`: for each case its
name, what it is, the sha256 of its plan, and a few readable figures (predicted step time, peak
memory, the descent's best start, the mesh). The hash is of the plan's JSON text
(`Plan.to_json()`, which has no timings) with the `planner_revision` key removed, so a revision
bump alone moves nothing.

A change that must leave every plan as it was (a refactor of the planner's entry points, say)
runs `--check` (the default) before it is committed; it exits 1 naming the plans that moved. A
change that means to change plans runs `--write` and says so, and which cases moved, in its
commit. To read a mismatch, write the plans of the commit before and of the one after
(`--out old/`, `--out new/`) and compare one case with `titan-autopar diff old/X.json new/X.json`.

  PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_corpus.py [--check | --write]
      [--case NAME ...] [--out DIR]

Every case plans on the meta device and simulated ranks, in this one process (the CLI cases call
its `main` in-process): the whole corpus takes about 140 s on a 2-core machine (the 16-rank
degree search a third of it), longer when other work shares the cores. Progress goes
to stderr; stdout gets one JSON line (per case `match` and `seconds`, `all_match`, `total_s`). Under
`--write`, `match` says whether the case's plan equals the baseline it replaces.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.tensor import Shard

from titan_autopar import cli, manual, plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.solve.recipes import default_input_placements  # the switch's output pin
from titan_autopar.titan.loop_collectives import trainer_loop_collectives
from titan_autopar.titan.manual_marks import mark_mesh_regions
from titan_autopar.titan.models import build_model, global_batch

ROOT = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).with_suffix(".json")
JOBS = Path(__file__).with_suffix("")  # the degree-search jobs' TOMLs


@dataclass
class Case:
    """One planning case. `cli` set: run `titan-autopar` with that argv (plus `--out`);
    otherwise `plan_model` on `model`/`flavor` built at `seq`, a global batch of `local_batch`
    per data-parallel rank on the simulated `mesh`."""

    name: str
    about: str
    mesh: dict = field(default_factory=lambda: {"dp_shard": 4})
    model: str = "llama3"
    flavor: str = "debugmodel"
    seq: int = 256
    local_batch: int = 2
    options: dict = field(default_factory=dict)  # plan_model keywords (hardware default h100)
    manual: dict = field(default_factory=dict)  # module name -> manual() keywords
    stage: tuple = ()  # the module names a later pipeline stage keeps (TorchTitan's split)
    switch: bool = False  # as the TorchTitan switch plans: output pinned, loop collectives
    cli: tuple = ()


BATCH_SPLIT = {"dp_shard": Shard(0)}
CASES = [
    Case("dense_1d", "llama3 debug, dp_shard=4", {"dp_shard": 4}),
    Case("dense_2d", "llama3 debug, dp_shard=2 x tp=2", {"dp_shard": 2, "tp": 2}),
    Case("dense_3d", "llama3 debug, dp_replicate=2 x dp_shard=2 x tp=2",
         {"dp_replicate": 2, "dp_shard": 2, "tp": 2}),
    Case("dense_4d", "llama3 debug, dp_replicate=2 x dp_shard=2 x cp=2 x tp=2",
         {"dp_replicate": 2, "dp_shard": 2, "cp": 2, "tp": 2}),
    Case("bf16_selective_ac", "llama3 debug, dp_shard=2 x tp=2, bf16 compute, selective AC",
         {"dp_shard": 2, "tp": 2},
         options={"param_dtype": torch.bfloat16, "activation_checkpointing": "selective"}),
    Case("full_ac", "llama3 debug, dp_shard=4, full activation checkpointing",
         options={"activation_checkpointing": "full"}),
    Case("llama3_8b", "Llama3-8B, dp_shard=8 x tp=8, h100, seq 8192, local batch 1",
         {"dp_shard": 8, "tp": 8}, flavor="8B", seq=8192, local_batch=1),
    Case("moe_ep", "deepseek_v3 debug, dp_shard=2 x ep=2, MoE blocks as TorchTitan EP regions",
         {"dp_shard": 2, "ep": 2}, model="deepseek_v3"),
    Case("moe_dp", "qwen3 debug MoE, dp_shard=4, MoE blocks as data-parallel regions",
         model="qwen3", flavor="debugmodel_moe"),
    Case("user_manual", "llama3 debug, dp_shard=2 x tp=2, layers.1.feed_forward a user's region",
         {"dp_shard": 2, "tp": 2},
         manual={"layers.1.feed_forward": dict(
             in_placements=[BATCH_SPLIT], out_placements=[BATCH_SPLIT],
             param_placements={"w1.weight": {"dp_shard": None}})}),
    Case("cp_ring", "llama3 debug, dp_shard=2 x cp=2, ring attention forced",
         {"dp_shard": 2, "cp": 2}, options={"cp_attention": "ring"}),
    Case("pp_last_stage", "llama3 debug, pp=2's last stage (layers 3-5, norm, output) as the "
         "switch plans it, dp_shard=2 x tp=2", {"dp_shard": 2, "tp": 2},
         stage=("layers.3", "layers.4", "layers.5", "norm", "output"), switch=True),
    Case("switch_2d", "llama3 debug, dp_shard=2 x tp=2 as the switch plans it: output pinned "
         "to the batch split, trainer loop collectives", {"dp_shard": 2, "tp": 2}, switch=True),
    Case("search_8", "titan-autopar plan --search: llama3 debug, 8 h100 ranks",
         cli=("plan", "--config", str(JOBS / "llama3_debug_h100_8.toml"), "--search")),
    Case("search_16", "titan-autopar plan --search: llama3 debug, 16 h100 ranks",
         cli=("plan", "--config", str(JOBS / "llama3_debug_h100_16.toml"), "--search")),
    Case("cli_config", "titan-autopar plan --config llama3_debug_cpu_auto4.toml --hardware cpu",
         cli=("plan", "--config", str(ROOT / "train_configs/llama3_debug_cpu_auto4.toml"),
              "--hardware", "cpu")),
]


def later_stage(model, keep):
    """`model` cut as TorchTitan's pipeline split leaves a stage holding `keep`: other layers
    deleted, other top-level modules None (`tok_embeddings` among them)."""
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.ModuleDict):
            for k in [k for k in child if f"{name}.{k}" not in keep]:
                del child[k]
        elif name not in keep:
            setattr(model, name, None)
    return model


def plan_api(case: Case) -> str:
    names, sizes = tuple(case.mesh), tuple(case.mesh.values())
    model, args = build_model(case.model, case.flavor, case.seq)
    mark_mesh_regions(model, names, sizes)  # an ep dim: MoE blocks expert-parallel, as a job's
    for qname, decl in case.manual.items():
        manual(model.get_submodule(qname), **decl)
    batch = global_batch(case.local_batch, names, sizes)
    if case.stage:  # a later stage takes the hidden states in the compute dtype
        later_stage(model, case.stage)
        dtype = case.options.get("param_dtype", torch.float32)
        x = torch.empty(batch, case.seq, args.dim, dtype=dtype, device="meta")
    else:
        x = torch.zeros(batch, case.seq, dtype=torch.long)
    opts = dict(case.options)
    if case.switch:
        opts.update(output_placements=[default_input_placements(names, torch.empty(1, 1, 1))],
                    loop_collectives=trainer_loop_collectives(names, sizes, 10))
    plan = plan_model(model, fake_mesh(names, sizes), (x,), progress=lambda s: None, **opts)
    return plan.to_json()


def plan_cli(case: Case) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            rc = cli.main([*case.cli, "--out", str(out)])
        if rc != 0:
            raise RuntimeError(f"{case.name}: titan-autopar exited {rc}:\n{said.getvalue()}")
        return out.read_text()


def normalized(plan_json: str) -> str:
    d = json.loads(plan_json)
    del d["planner_revision"]
    return json.dumps(d, indent=1, sort_keys=True) + "\n"


FIGURES = ("mesh", "step_time_s", "peak_memory_gib", "best_start")


def entry(case: Case, plan_json: str) -> dict:
    d = json.loads(plan_json)
    return {"name": case.name, "about": case.about,
            "sha256": hashlib.sha256(normalized(plan_json).encode()).hexdigest(),
            "mesh": dict(zip(d["mesh"]["names"], d["mesh"]["shape"])),
            "step_time_s": d["predicted"]["step_time_s"],
            "peak_memory_gib": d["predicted"]["peak_memory_gib"],
            "best_start": d["solver"]["best_start"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="store the plans as the baseline")
    mode.add_argument("--check", action="store_true", help="compare with the baseline (default)")
    ap.add_argument("--case", action="append", choices=[c.name for c in CASES],
                    help="run only this case (repeatable)")
    ap.add_argument("--out", type=Path, help="write each case's plan JSON here, as <case>.json")
    a = ap.parse_args(argv)
    cases = [c for c in CASES if not a.case or c.name in a.case]
    base = {e["name"]: e for e in json.loads(BASELINE.read_text())["cases"]} \
        if BASELINE.exists() else {}
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
    results, t_all = {}, time.perf_counter()
    for case in cases:
        t0 = time.perf_counter()
        plan_json = (plan_cli if case.cli else plan_api)(case)
        seconds = round(time.perf_counter() - t0, 2)
        new, old = entry(case, plan_json), base.get(case.name)
        match = old is not None and old["sha256"] == new["sha256"]
        results[case.name] = {"match": match, "seconds": seconds}
        if a.out:
            (a.out / f"{case.name}.json").write_text(plan_json)
        print(f"[plan_corpus] {case.name}: {seconds:.1f} s, "
              f"{'same plan' if match else 'NO BASELINE' if old is None else 'PLAN CHANGED'}",
              file=sys.stderr, flush=True)
        if old is not None and not match:
            for label, e in (("baseline", old), ("now", new)):
                print(f"  {label:8} {json.dumps({k: e.get(k) for k in FIGURES})}", file=sys.stderr)
        if a.write:
            base[case.name] = new
    all_match = all(r["match"] for r in results.values())
    if a.write:
        order = [c.name for c in CASES]  # cases no longer in CASES are dropped
        body = {"about": "benchmarks/plan_corpus.py's baseline: one plan hash per case",
                "cases": [base[n] for n in order if base.get(n)]}
        BASELINE.write_text(json.dumps(body, indent=1) + "\n")
        print(f"[plan_corpus] wrote {BASELINE}", file=sys.stderr)
    print(json.dumps({"benchmark": "plan_corpus", "mode": "write" if a.write else "check",
                      "cases": results, "all_match": all_match,
                      "total_s": round(time.perf_counter() - t_all, 2)}))
    return 0 if a.write or all_match else 1


if __name__ == "__main__":
    sys.exit(main())
