"""Shared fixtures: simulated meshes (torch's fake process group) and tiny TorchTitan models."""

from __future__ import annotations

import os

import pytest
import torch

from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.titan.models import build_model


@pytest.fixture(scope="session", autouse=True)
def profile_cache(tmp_path_factory):
    """Jobs with `hardware = "calibrate"` measure this machine once per test session, in a
    cache of the session's own (not the user's), and share the profile after that."""
    os.environ["TITAN_AUTOPAR_CACHE"] = str(tmp_path_factory.mktemp("titan_autopar_cache"))
    yield os.environ["TITAN_AUTOPAR_CACHE"]


@pytest.fixture
def mesh_of():
    """mesh_of(("dp_shard", "tp"), (2, 4)) -> a DeviceMesh of simulated ranks."""
    return fake_mesh


def tiny_llama(dim=256, layers=2, seq=128, **kw):
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs

    kw.setdefault("n_heads", 16)
    args = TransformerModelArgs(dim=dim, n_layers=layers, vocab_size=2048,
                                max_seq_len=seq, **kw)
    with torch.device("meta"):
        return Transformer(args)


@pytest.fixture
def debug_model():
    """debug_model("llama3", seq) -> TorchTitan's debug flavor of that model, on meta."""

    def make(name: str, seq: int = 128):
        flavor = {"qwen3": "debugmodel_moe"}.get(name, "debugmodel")
        model, _ = build_model(name, flavor, seq)
        return model

    return make
