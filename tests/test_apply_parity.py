"""apply_plan on real ranks (gloo, fp32) against a single-process reference.

In CI, on 2x2 ranks: the TP and the solver's own plans on llama3, the solver's own on the MoE
model, both checkpointing modes, and the tie (1-D meshes of 4 ranks run under TorchTitan's trainer in
test_titan_auto.py and test_titan_ep.py). Every case on 2, 4 and 2x2 ranks, the MLP and the
attention block included, is `benchmarks/parity_matrix.py`. Models: an MLP, an attention block, TorchTitan's llama3 debug model
and its DeepSeek-V3 (MoE) debug model; on 2x2 also qwen3's dense debug model, whose output
projection is tied to the token embedding (the tie must stay one parameter). Plans: parameters pinned to FSDP placements,
pinned to TP column/row placements (on the tp dim), and the solver's own (output batch-sharded
over the data-parallel dim); for llama3 and the MoE model also the solver's own with activation
checkpointing ("full", "selective"), whose programs recompute block activations in backward. Plans are made here on a simulated mesh, saved, and replayed by the
ranks. Each case checks initialisation; on the same weights, the forward (1e-5) and every
gradient gathered to full (1e-4, relative to the largest entry; the input's too for the float-input
models) and the gradient norm; an eval
forward under no_grad; and the losses of five AdamW steps (1e-4 relative: after the first step
the weights themselves differ by fp32 rounding, which Adam's normalisation amplifies).
"""

from __future__ import annotations

import math

import torch

from dist_harness import read_result, run_ranks
from parity_models import BLOCKS, MODELS, MOE_MODEL, TIED_MODEL, inputs_of, meta_model, parity_worker
from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.solve.recipes import default_input_placements

KINDS = ("fsdp", "tp", "auto")
AC_CASES = (("llama3", "ac_full"), (MOE_MODEL, "ac_selective"))
FWD_TOL, GRAD_TOL, LOSS_TOL = 1e-5, 1e-4, 1e-4


def mesh_names(shape: tuple[int, ...], kind: str) -> tuple[str, ...]:
    if len(shape) == 2:
        return ("dp_shard", "tp")
    return ("tp",) if kind == "tp" else ("dp_shard",)


def make_plan(name: str, kind: str, shape: tuple[int, ...], path, names=None) -> None:
    names = names or mesh_names(shape, kind)
    mesh = fake_mesh(names, shape)
    model = meta_model(name)
    inputs = tuple(x.to("meta") for x in inputs_of(name))
    keywords = {"fsdp": {"parameter_placements": "fsdp"},
                "tp": {"parameter_placements": "fsdp_tp"},
                "auto": {"output_placements": [default_input_placements(names, torch.empty(1, 1, 1))]}}
    # activation checkpointing: the plan's program recomputes each block's activations
    keywords["ring"] = {**keywords["auto"], "cp_attention": "ring"}  # attention on cp: a ring
    for mode in ("full", "selective"):
        keywords[f"ac_{mode}"] = {**keywords["auto"], "activation_checkpointing": mode}
    plan = plan_model(model, mesh, inputs, progress=lambda s: None, **keywords[kind])
    plan.save(path)


def all_cases(shape: tuple[int, ...]) -> list[tuple[str, str]]:
    cases = [(m, k) for m in MODELS for k in KINDS] + list(AC_CASES)
    if len(shape) == 2:  # tied input/output embeddings (qwen3's dense flavors)
        cases.append((TIED_MODEL, "auto"))
    return cases


# CI: on 2x2, the TP recipe's and the solver's own plans on llama3, the solver's plan on the MoE
# model, both checkpointing modes and the tie. Every case on 2, 4 and 2x2 ranks (the FSDP recipe's
# plan among them) is the benchmark's; runtime_overhead.py also checks the FSDP plan's losses.
CI_CASES = [("llama3", "tp"), ("llama3", "auto"), (MOE_MODEL, "auto"), *AC_CASES,
            (TIED_MODEL, "auto")]


def test_parity_with_single_process_on_2x2(tmp_path):
    check_parity((2, 2), CI_CASES, tmp_path)


def check_parity(shape, cases, tmp_path, names=None) -> dict:
    """Plan, run and compare `cases` on `shape` (dims named `names`, else by `mesh_names`);
    returns each case's figures."""
    plans = tmp_path / "plans"
    plans.mkdir()
    for m, k in cases:
        make_plan(m, k, shape, plans / f"{m}-{k}.json", names)
    run_ranks(parity_worker, math.prod(shape), cases, str(plans), str(tmp_path))
    failures = []
    for m, k in cases:
        r = read_result(tmp_path, f"{m}-{k}")
        case = f"{m}/{k}"
        checks = [
            (r["init_equal"], "initialised parameters differ from the single-device ones"),
            (r["fwd_rel"][0] <= FWD_TOL, f"forward rel error {r['fwd_rel'][0]:.2e}"),
            (r["grad_rel"][0] <= GRAD_TOL,
             f"gradient rel error {r['grad_rel'][0]:.2e} ({r['worst_grad'][0]})"),
            (all(abs(a - b) <= LOSS_TOL * max(1.0, abs(b)) for a, b in zip(r["loss"], r["ref_loss"])),
             f"losses {r['loss']} vs reference {r['ref_loss']}"),
            (r.get("input_grad_rel", 0.0) <= GRAD_TOL and (m not in BLOCKS or
                                                           "input_grad_rel" in r),
             f"input gradient rel error {r.get('input_grad_rel')}"),
            (abs(r["grad_norm"] - r["ref_grad_norm"]) <= 1e-4 * r["ref_grad_norm"],
             f"grad norm {r['grad_norm']} vs {r['ref_grad_norm']}"),
            (r["dtensor_grads"], "gradients are not DTensors in their parameters' placements"),
            (r["eval_nograd_rel"] <= FWD_TOL and not r["eval_requires_grad"],
             f"eval/no_grad forward rel error {r['eval_nograd_rel']:.2e}"),
            (r["mismatches"] == 0, f"{r['mismatches']} values off their planned placement"),
            (r["parameters"][0] == r["parameters"][1] and r["tied"] in (None, m == TIED_MODEL),
             f"parameters {r['parameters']} (planned, single-device), tie kept: {r['tied']}"),
        ]
        failures += [f"{case}: {msg}" for ok, msg in checks if not ok]
        if k.startswith("ac_") and (m, "auto") in cases:  # fewer kept, more computed again
            plain = read_result(tmp_path, f"{m}-auto")
            if not (r["saved"] < plain["saved"] and
                    r["recomputed_in_blocks"] > plain["recomputed_in_blocks"] + 10):
                failures.append(f"{case}: saved {r['saved']} (without: {plain['saved']}), "
                                f"recomputed {r['recomputed_in_blocks']} in blocks "
                                f"(without: {plain['recomputed_in_blocks']})")
        if k == "fsdp" and m != "mlp":  # sharded parameters are gathered: collectives must run
            if not any("all_gather" in c for c in r["collectives"]):
                failures.append(f"{case}: no all-gather in an FSDP program: {r['collectives']}")
    assert not failures, "\n".join(failures)
    return {f"{m}-{k}": read_result(tmp_path, f"{m}-{k}") for m, k in cases}
