"""Tiny tokenizer and text dataset for TorchTitan runs, built locally and deterministically.

Owns the "tiny assets" directory and the TorchTitan dataset name `DATASET_NAME`. One directory
holds everything a CPU debug run needs, generated on first use (nothing is downloaded):

    corpus.jsonl            one {"text": ...} document a line, from `corpus.generate_documents`
    tokenizer.json          byte-level BPE trained on that corpus, at most `VOCAB_SIZE` ids
    tokenizer_config.json   BOS/EOS names, the way TorchTitan's HuggingFaceTokenizer reads them
    titan_autopar_tiny.json stamp: generator version, vocabulary size, corpus checksum

Where it lives: wherever the job's TOML points both `[model] hf_assets_path` and
`[training] dataset_path` (the configs in train_configs/ use ./out/assets/tiny, relative to the
working directory as TorchTitan's own configs are). Without a path, `default_dir()`:
$TITAN_AUTOPAR_CACHE/tiny-v<VERSION>, else ~/.cache/titan_autopar/tiny-v<VERSION>.

Same version, same bytes: the corpus comes from a seeded generator and BPE training on it is
deterministic, so two runs (or two machines) train on the same tokens. Several ranks may ask at
once: building holds a file lock and moves a finished directory into place, and a directory
stamped by an older generator version is rebuilt; one not made here is never overwritten.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from titan_autopar.titan.corpus import generate_documents

DATASET_NAME = "titan_autopar_tiny"
VERSION = 1
VOCAB_SIZE = 1024  # target; fits the 2048-entry embedding of TorchTitan's debug flavors
N_DOCS = 1500  # ~425 KB of text
SEED = 0
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

CORPUS_FILE = "corpus.jsonl"
STAMP_FILE = "titan_autopar_tiny.json"


def default_dir() -> Path:
    root = os.environ.get("TITAN_AUTOPAR_CACHE") or Path.home() / ".cache" / "titan_autopar"
    return Path(root) / f"tiny-v{VERSION}"


def _stamp() -> dict:
    return {"generator": DATASET_NAME, "version": VERSION, "n_docs": N_DOCS, "seed": SEED,
            "vocab_size_target": VOCAB_SIZE}


def is_current(path: str | os.PathLike) -> bool:
    """True if `path` holds tiny assets made by this version of the generator."""
    try:
        stamp = json.loads((Path(path) / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return all(stamp.get(k) == v for k, v in _stamp().items())


def train_tokenizer(docs: list[str]):
    """A byte-level BPE (`tokenizers.Tokenizer`) trained on `docs`, with BOS and EOS as ids 0, 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def _write_assets(out: Path) -> None:
    docs = generate_documents(N_DOCS, SEED)
    corpus = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    (out / CORPUS_FILE).write_text(corpus)
    tok = train_tokenizer(docs)
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": BOS, "eos_token": EOS, "model_max_length": 1 << 20,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    stamp = {**_stamp(), "vocab_size": tok.get_vocab_size(),
             "corpus_sha256": hashlib.sha256(corpus.encode()).hexdigest()}
    (out / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")


def ensure_assets(path: str | os.PathLike | None = None) -> Path:
    """The tiny-assets directory at `path` (default: `default_dir()`), built if absent or stale."""
    target = Path(path).expanduser() if path is not None else default_dir()
    if is_current(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait, then find it built
        if is_current(target):
            return target
        if target.exists() and not (target / STAMP_FILE).exists() and any(target.iterdir()):
            raise FileExistsError(
                f"{target} exists and was not made by titan_autopar: refusing to write tiny "
                f"assets into it. Point hf_assets_path/dataset_path at a new directory.")
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _write_assets(tmp)
            if target.exists():  # empty, or ours from an older generator version
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _names_assets_dir(p: Path) -> bool:
    """A dataset path names a tiny-assets directory unless it is (or looks like) a JSONL file."""
    return p.is_dir() or (not p.exists() and p.suffix not in (".jsonl", ".json"))


def read_documents(path: str | os.PathLike) -> list[str]:
    """The texts of a tiny-assets directory (built if needed) or of any {"text": ...} JSONL file."""
    p = Path(path).expanduser()
    if _names_assets_dir(p):
        p = ensure_assets(p) / CORPUS_FILE
    elif not p.exists():
        raise FileNotFoundError(f"no JSONL text file at {p} (a directory path there would get "
                                "the tiny assets built into it)")
    docs = []
    with open(p) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    docs.append(json.loads(line)["text"])
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{p}:{i}: expected a JSON object with a \"text\" field") \
                        from None
    return docs


def _load_dataset(path: str):
    from datasets import Dataset

    return Dataset.from_dict({"text": read_documents(path)})


def _sample_text(sample: dict) -> str:
    return sample["text"]


def register_dataset() -> None:
    """Make `[training] dataset = "titan_autopar_tiny"` known to TorchTitan's text dataloader.

    `dataset_path` names the tiny-assets directory (built on first use) or a {"text": ...} JSONL
    file; left out, `default_dir()` is used.
    """
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    DATASETS[DATASET_NAME] = DatasetConfig(path=str(default_dir()), loader=_load_dataset,
                                           sample_processor=_sample_text)


def prepare_job_assets(job_config) -> None:
    """Before a TorchTitan job on the tiny dataset starts: build the assets its config names.

    The dataset directory (`training.dataset_path`, else `default_dir()`) is built if absent or
    stale. So is the tokenizer directory (`model.hf_assets_path`) unless it already holds a
    tokenizer of someone else's, which is left alone. Jobs on other datasets are untouched.
    """
    if job_config.training.dataset.lower() != DATASET_NAME:
        return
    data = Path(job_config.training.dataset_path or default_dir()).expanduser()
    if _names_assets_dir(data):
        ensure_assets(data)
    tok = Path(job_config.model.hf_assets_path).expanduser()
    if not (tok / "tokenizer.json").exists() or (tok / STAMP_FILE).exists():
        ensure_assets(tok)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m titan_autopar.titan.data",
                                     description="Build the tiny tokenizer and text corpus.")
    parser.add_argument("dir", nargs="?", help=f"target directory (default: {default_dir()})")
    args = parser.parse_args(argv)
    out = ensure_assets(args.dir)
    print(json.dumps({"dir": str(out), **json.loads((out / STAMP_FILE).read_text())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
