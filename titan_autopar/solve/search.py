"""Which parallelism degrees a job could use: enumeration and the cheap bounds that prune it.

Owns `candidate_degrees`: every way to factor a job's ranks into TorchTitan's
dp_replicate x dp_shard x tp (x ep for a model with experts, its ranks carved out of dp_shard as
TorchTitan's dp2ep does), each either kept for planning or set aside with the reason, by rules
that need no trace:

  - tp divides the attention heads and the KV heads (TorchTitan's TP splits heads), and ep divides
    the routed experts;
  - tp and ep stay within a node (their collectives run per layer), unless no degree would fit
    otherwise;
  - the parameter state -- weights, gradients and AdamW's two moments, each in its own dtype --
    spread over every rank that can shard it (dp_shard x tp) must fit the memory budget: no plan
    on that mesh can do better.

cp > 1 is a second round (`candidate_degrees(cp=True)`), taken only when no degrees with cp = 1
fit or the job itself has cp > 1: it splits each sequence, which pays where activations do not
fit otherwise. cp must divide the sequence into 2 x cp equal halves (the load-balanced ring),
stays within a node as tp and ep do (unless nothing else fits), and is not combined with ep
(not planned under auto). pp stays 1: pipeline stages are planned per stage when a job runs
(their bubbles are not priced). The memory floor with
activations, which needs the traced graph, and the plans themselves are the caller's
(`titan/degree_search.py`); `rank_rows` orders what they found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1024 ** 3


@dataclass(frozen=True)
class ModelShape:
    """What the bounds need to know of a model."""

    params: int  # all parameters
    n_heads: int
    n_kv_heads: int
    experts: int = 0  # routed experts per MoE layer, 0 for a dense model
    state_bytes_per_param: int = 16  # fp32 weight + gradient + AdamW's two moments


@dataclass(frozen=True)
class Degrees:
    dp_replicate: int
    dp_shard: int
    tp: int
    ep: int = 1
    cp: int = 1

    @property
    def label(self) -> str:
        parts = [f"dp_replicate={self.dp_replicate}", f"dp_shard={self.dp_shard}", f"tp={self.tp}"]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        return " ".join(parts)

    def toml(self) -> str:
        """The [parallelism] block TorchTitan reads for these degrees."""
        return ("[parallelism]\n"
                f"data_parallel_replicate_degree = {self.dp_replicate}\n"
                f"data_parallel_shard_degree = {self.dp_shard}\n"
                f"tensor_parallel_degree = {self.tp}\n"
                f"context_parallel_degree = {self.cp}\n"
                "pipeline_parallel_degree = 1\n"
                f"expert_parallel_degree = {self.ep}\n")


@dataclass
class Candidate:
    degrees: Degrees
    reason: str = ""  # why it is not planned; empty when it is
    floor_gib: float = 0.0  # parameter-state floor per rank
    results: dict = field(default_factory=dict)  # filled by the caller


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def state_floor_gib(shape: ModelShape, d: Degrees) -> float:
    return shape.params * shape.state_bytes_per_param / (d.dp_shard * d.cp * d.tp) / GiB


def candidate_degrees(world: int, gpus_per_node: int, shape: ModelShape,
                      budget_gib: float, *, cp: bool = False,
                      seq_len: int = 0) -> list[Candidate]:
    """Every factorization of `world`, in a fixed order (tp, then ep, then dp_replicate
    ascending), each with the reason it is set aside or none; with `cp`, those with cp > 1
    instead (cp, then tp, then dp_replicate), for a sequence of `seq_len` tokens."""
    if world < 1:
        raise ValueError(f"the job has {world} ranks: the degree search needs at least 1")
    out: list[Candidate] = []
    for c_ in (divisors(world)[1:] if cp else [1]):
        for tp in divisors(world // c_):
            for ep in (divisors(world // tp) if shape.experts and not cp else [1]):
                for rep in divisors(world // c_ // tp):
                    shard = world // c_ // tp // rep
                    if shard % ep:
                        continue  # the ep ranks are carved out of dp_shard
                    d = Degrees(rep, shard, tp, ep, c_)
                    c = Candidate(d, floor_gib=state_floor_gib(shape, d))
                    c.reason = _divisibility(shape, d, seq_len) or ""
                    if not c.reason and c.floor_gib > budget_gib:
                        over = "dp_shard x cp x tp" if d.cp > 1 else "dp_shard x tp"
                        c.reason = (f"parameter state alone needs {c.floor_gib:.3g} GiB per rank "
                                    f"over {over} = {d.dp_shard * d.cp * d.tp} ranks "
                                    f"(budget {budget_gib:.3g})")
                    out.append(c)
    def spans(d: Degrees) -> bool:
        return max(d.tp, d.ep, d.cp) > gpus_per_node

    within = [c for c in out if not c.reason and not spans(c.degrees)]
    if within:  # tp, ep and cp across nodes only if nothing else fits
        for c in out:
            if not c.reason and spans(c.degrees):
                c.reason = (f"tp or ep spans nodes of {gpus_per_node} GPUs" if not cp else
                            f"tp or cp spans nodes of {gpus_per_node} GPUs")
    return out


def _divisibility(shape: ModelShape, d: Degrees, seq_len: int = 0) -> str | None:
    if d.cp > 1 and seq_len % (2 * d.cp):
        return f"cp={d.cp} does not cut the {seq_len} tokens into {2 * d.cp} equal halves"
    if shape.n_heads % d.tp or shape.n_kv_heads % d.tp:
        return (f"tp={d.tp} does not divide the {shape.n_heads} heads / {shape.n_kv_heads} "
                "KV heads")
    if d.ep > 1 and shape.experts % d.ep:
        return f"ep={d.ep} does not divide the {shape.experts} experts"
    return None


def rank_rows(cands: list[Candidate], key: str) -> list[Candidate]:
    """Candidates with `key` (tokens/s per GPU) first, most first (ties: fewer replicate groups,
    then smaller tp, so the order is fixed); the others after, in enumeration order."""
    have = [c for c in cands if key in c.results]
    rest = [c for c in cands if key not in c.results]
    have.sort(key=lambda c: (-round(c.results[key], 6), c.degrees.dp_replicate, c.degrees.tp,
                             c.degrees.ep))
    return have + rest
