"""TorchTitan's own trainer on CPU ranks: the tiny tokenizer/dataset, and a real 4-rank FSDP run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from titan_autopar.titan import data
from titan_autopar.titan.corpus import generate_documents
from titan_autopar.titan.launch import launch, parse_losses, tensorboard_scalars

REPO = Path(__file__).resolve().parents[1]
LLAMA3_FSDP4 = "train_configs/llama3_debug_cpu_fsdp4.toml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return data.ensure_assets(tmp_path_factory.mktemp("assets") / "tiny")


def test_tiny_assets_are_deterministic(tiny, tmp_path):
    again = data.ensure_assets(tmp_path / "again")
    for name in (data.CORPUS_FILE, "tokenizer.json", "tokenizer_config.json", data.STAMP_FILE):
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    assert generate_documents(20, seed=1) == generate_documents(20, seed=1)
    assert generate_documents(20, seed=1) != generate_documents(20, seed=2)
    stamp = json.loads((tiny / data.STAMP_FILE).read_text())
    assert stamp["version"] == data.VERSION and data.is_current(tiny)


def test_tokenizer_fits_debug_models_and_round_trips(tiny):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.models.llama3 import llama3_args

    tok = HuggingFaceTokenizer(str(tiny))
    vocab = tok.get_vocab_size()
    assert 256 < vocab <= 2000 and vocab <= llama3_args["debugmodel"].vocab_size
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    text = "Mara carried the warm bread to the table. Unseen: Zebra-42, naïve café!"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert max(ids) < vocab
    assert tok.decode(ids[1:-1]) == text
    # the corpus compresses: BPE learned its words, fewer tokens than bytes
    doc = data.read_documents(tiny)[0]
    assert len(tok.encode(doc)) < len(doc.encode()) / 3


def test_registered_dataset_feeds_torchtitan(tiny):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    data.register_dataset()
    tok = HuggingFaceTokenizer(str(tiny))

    def first_batches(rank):
        ds = HuggingFaceTextDataset(data.DATASET_NAME, str(tiny), tok, seq_len=64,
                                    dp_rank=rank, dp_world_size=2)
        it = iter(ds)
        return [next(it) for _ in range(3)]

    rank0, rank1 = first_batches(0), first_batches(1)
    for (x, label) in rank0:
        assert x["input"].shape == label.shape == (64,)
        assert torch.equal(x["input"][1:], label[:-1])
    assert all(torch.equal(a[1], b[1]) for a, b in zip(rank0, first_batches(0)))
    assert not torch.equal(rank0[0][1], rank1[0][1])  # the ranks read different documents


def test_assets_refuse_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not ours")
    with pytest.raises(FileExistsError, match="not made by titan_autopar"):
        data.ensure_assets(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not ours"


def test_dataset_path_may_name_an_own_jsonl_file(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text('{"text": "first document"}\n\n{"text": "second"}\n')
    assert data.read_documents(own) == ["first document", "second"]
    with pytest.raises(FileNotFoundError, match="no JSONL text file"):
        data.read_documents(tmp_path / "missing.jsonl")
    own.write_text('{"body": "no text field"}\n')
    with pytest.raises(ValueError, match="own.jsonl:1"):
        data.read_documents(own)


def test_cpu_patches_refuse_when_cuda_is_available(monkeypatch):
    from titan_autopar.titan import cpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is available"):
        cpu.apply_cpu_patches()


def test_llama3_fsdp4_trains_on_four_cpu_ranks(tmp_path):
    steps = 5
    start = time.monotonic()
    # with TorchTitan's profiler on, as a user debugging a slow step turns it (a CPU patch)
    run = launch(LLAMA3_FSDP4, nproc=4, cwd=REPO, timeout=240,
                 extra_args=["--training.steps", str(steps), "--job.dump_folder", str(tmp_path),
                             "--profiling.enable_profiling", "--profiling.profile_freq", "4",
                             "--profiling.profiler_warmup", "1"])
    elapsed = time.monotonic() - start
    assert run.returncode == 0, run.stdout[-4000:]
    losses = parse_losses(run.stdout)
    assert sorted(losses) == list(range(1, steps + 1)), run.stdout[-4000:]
    assert all(math.isfinite(v) for v in losses.values()), losses
    assert losses[steps] < losses[1] - 0.5, losses  # learning, not noise
    # every rank reports the same global loss, and TensorBoard recorded what the log says
    assert parse_losses(run.stdout, rank=3) == losses
    board = tensorboard_scalars(tmp_path)
    assert sorted(board) == sorted(losses)
    assert all(abs(board[s] - losses[s]) < 1e-4 for s in losses), (board, losses)
    # the profiled step's trace, per rank, with the step's matmuls in it
    traces = sorted(tmp_path.glob("profile_traces/iteration_4/rank*_trace.json"))
    assert [t.name for t in traces] == [f"rank{r}_trace.json" for r in range(4)]
    assert '"aten::mm"' in traces[0].read_text()
    print(f"llama3 FSDP=4 on CPU: {steps} steps in {elapsed:.1f} s, losses {losses}")
