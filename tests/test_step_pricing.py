"""Two measured terms of a training step beyond the graph's curves: what each collective call
costs inside a step beyond its clean curve (`Hardware.collective_step_overhead`, part of its
latency, shared where merged), and the optimizer's cost per parameter tensor
(`Hardware.optimizer_time_per_tensor`, the same for every placement: it moves the predicted step,
never the plan)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from titan_autopar import plan_model
from titan_autopar.cost.comm import Topology
from titan_autopar.cost.hardware import PRESETS

CURVE = (("all_gather", 4, 1e-3, 2e-9),)


@pytest.mark.parametrize("share", [1.0, 0.25])
def test_a_call_inside_a_step_pays_the_overhead_as_part_of_its_latency(share):
    plain = Topology((4,), replace(PRESETS["cpu"], collective_fits=CURVE,
                                   collective_step_overhead=0.0))
    loaded = Topology((4,), replace(PRESETS["cpu"], collective_fits=CURVE,
                                    collective_step_overhead=3e-3))
    assert plain.collective_time("all_gather", 0, 1e6, share) == pytest.approx(1e-3 * share + 2e-3)
    assert loaded.collective_time("all_gather", 0, 1e6, share) == pytest.approx(
        4e-3 * share + 2e-3)
    # the formula's path (no curve for this kind) pays it too; a group of one moves nothing
    assert loaded.collective_time("all_reduce", 0, 1e6) - plain.collective_time(
        "all_reduce", 0, 1e6) == pytest.approx(3e-3)
    assert Topology((1,), loaded.hw).collective_time("all_gather", 0, 1e6) == 0.0


def test_the_optimizer_per_tensor_moves_the_step_not_the_plan(mesh_of, debug_model):
    """And FSDP2's runtime per group prices the recipes (which run FSDP2), not auto's plan."""
    model = debug_model("llama3")
    mesh = mesh_of(("dp_shard",), (4,))
    tokens = (torch.zeros(4, 128, dtype=torch.long),)
    plans = [plan_model(model, mesh, tokens, progress=lambda s: None,
                        hardware=replace(PRESETS["cpu"], optimizer_time_per_tensor=t,
                                         fsdp_group_overhead=g))
             for t, g in ((0.0, 0.0), (1e-3, 2e-3))]
    n = len(dict(model.named_parameters()))
    groups = len(model.layers) + 1  # a group per block, one for the root's own parameters
    a, b = (p.data["predicted"] for p in plans)
    assert b["step_time_s"] - a["step_time_s"] == pytest.approx(n * 1e-3, rel=1e-6)
    assert a["framework_s"] == b["framework_s"] == 0.0
    assert plans[0].data["parameters"] == plans[1].data["parameters"]
    ra, rb = (p.data["recipes"]["fsdp"] for p in plans)
    assert rb["framework_s"] == pytest.approx(groups * 2e-3)
    assert rb["step_time_s"] - ra["step_time_s"] == pytest.approx(n * 1e-3 + groups * 2e-3,
                                                                  rel=1e-6)


def test_the_attention_floor_and_the_loss_are_priced_once_per_call(mesh_of, debug_model):
    """Each attention call (forward and backward together) pays the measured floor once, and
    the trainer's loss is priced per element of this rank's share of the model's output."""
    model = debug_model("llama3")
    mesh = mesh_of(("dp_shard",), (4,))
    tokens = (torch.zeros(4, 128, dtype=torch.long),)
    plans = [plan_model(model, mesh, tokens, progress=lambda s: None,
                        hardware=replace(PRESETS["cpu"], attention_floor=f, loss_time_per_element=e))
             for f, e in ((0.0, 0.0), (0.035, 1e-6))]
    assert plans[0].data["parameters"] == plans[1].data["parameters"]
    a, b = (p.data["predicted"]["step_time_s"] for p in plans)
    vocab = model.output.weight.shape[0]
    logits_here = 1 * 128 * vocab  # a quarter of the batch of 4 on each rank
    assert b - a == pytest.approx(len(model.layers) * 0.035 + logits_here * 1e-6, rel=1e-6)


def test_the_trainers_own_collectives_are_priced_per_step_on_every_arm(mesh_of, debug_model):
    """TorchTitan's train_step all-reduces the valid tokens over the data dims, the gradient norm
    over every split dim and, on logged steps, three loss figures: priced per call on each dim,
    the same on the plan and on each recipe, and the plan's placements stay as they were."""
    from titan_autopar.cost.loop import loop_seconds
    from titan_autopar.titan.loop_collectives import trainer_loop_collectives

    names, sizes = ("dp_shard", "tp"), (2, 2)
    every = trainer_loop_collectives(names, sizes, log_freq=1)
    assert [(c.dims, c.per_step) for c in every] == [
        (("dp_shard",), 1.0), (("dp_shard", "tp"), 1.0), (("dp_shard",), 3.0)]
    assert trainer_loop_collectives(names, sizes, log_freq=10)[-1].per_step == pytest.approx(0.3)
    assert trainer_loop_collectives(("dp_shard",), (1,)) == ()  # one rank: nothing to reduce
    hw = PRESETS["cpu"]
    topo = Topology(sizes, hw)
    ar = topo.collective_time("all_reduce", 0, 8)
    assert loop_seconds(topo, names, every) == pytest.approx(
        ar + topo.collective_time("all_reduce", 0, 4) + topo.collective_time("all_reduce", 1, 4)
        + 3 * ar)
    assert ar > hw.collective_step_overhead  # a few bytes still pay a call's latency

    model = debug_model("llama3")
    mesh = mesh_of(names, sizes)
    tokens = (torch.zeros(2, 128, dtype=torch.long),)
    plans = [plan_model(model, mesh, tokens, progress=lambda s: None, hardware=hw,
                        loop_collectives=loop) for loop in ((), every)]
    assert plans[0].data["parameters"] == plans[1].data["parameters"]
    want = loop_seconds(topo, names, every)
    for arm in ("fsdp", "fsdp_tp"):
        a, b = (p.data["recipes"][arm] for p in plans)
        assert a["loop_s"] == 0.0 and b["loop_s"] == pytest.approx(want, rel=1e-6)
        assert b["step_time_s"] - a["step_time_s"] == pytest.approx(want, rel=1e-6)
    a, b = (p.data["predicted"] for p in plans)
    assert b["step_time_s"] - a["step_time_s"] == pytest.approx(want, rel=1e-6)
    assert "training loop's own collectives" in plans[1].explain()


def test_dtensors_runtime_prices_the_tp_recipe_once_per_matrix(mesh_of, debug_model):
    """Under TorchTitan's TP plans every matrix is a tensor-parallel module run by DTensor: the
    fsdp_tp recipe pays `tp_linear_overhead` per matrix (each repeat counted), FSDP alone does
    not, and auto's plan (its own program of local ops) keeps its placements and its price."""
    model = debug_model("llama3")
    mesh = mesh_of(("dp_shard", "tp"), (2, 2))
    tokens = (torch.zeros(2, 128, dtype=torch.long),)
    plans = [plan_model(model, mesh, tokens, progress=lambda s: None,
                        hardware=replace(PRESETS["cpu"], tp_linear_overhead=t))
             for t in (0.0, 1e-3)]
    assert plans[0].data["parameters"] == plans[1].data["parameters"]
    assert plans[0].predicted["step_time_s"] == plans[1].predicted["step_time_s"]
    matrices = sum(1 for p in model.parameters() if p.ndim >= 2)
    assert matrices == 2 + 7 * len(model.layers)
    a, b = (p.data["recipes"]["fsdp_tp"] for p in plans)
    assert b["framework_s"] - a["framework_s"] == pytest.approx(matrices * 1e-3, rel=1e-6)
    assert b["step_time_s"] - a["step_time_s"] == pytest.approx(matrices * 1e-3, rel=1e-6)
    assert plans[0].data["recipes"]["fsdp"] == plans[1].data["recipes"]["fsdp"]
    assert "DTensor's" in plans[1].explain()
