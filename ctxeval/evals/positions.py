"""Loss by position (the NLL of the tokens a model predicts with p tokens of context, summed in position buckets)
and LongPPL's key-token sums (key_tokens.py finds the key tokens).

A token's position p is its index in the sequence the model reads (BOS, if any, is index 0), so it was predicted
from p tokens of context: the truncate protocol's token t of a document (BOS first) has position t + 1; under the
sliding protocol a token's position is its index within the window that scored it. Bucket i holds the positions
edges[i] <= p < edges[i + 1]. Rows carry the sums and counts (not means) so that documents aggregate exactly,
token-weighted, as the ppl table does.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import CtxevalError
from ..util.numbers import parse_token_count, parse_whole

MAX_BUCKETS = 1024  # more buckets than a table or a plot can show; a larger count is a typo
FIRST_EDGE = 32  # the first bucket holds positions 1..31: octaves below it hold a handful of tokens per document


def default_edges(max_length: int, trained_length: int | None = None) -> tuple[int, ...]:
    """Positions 1..31, then one bucket per octave (32, 64, ... up to the longest length), with the trained length as
    an edge so that the curve's step past it is its own bucket."""
    edges = {1, max_length}
    power = FIRST_EDGE
    while FIRST_EDGE <= power < max_length:  # bounded: a power that stops doubling ends the loop, never hangs
        edges.add(power)
        power *= 2
    if trained_length and 1 < trained_length < max_length:
        edges.add(trained_length)
    return tuple(sorted(edges))


def log_edges(n_buckets: int, max_length: int) -> tuple[int, ...]:
    """`n_buckets` log-spaced buckets over positions 1 .. max_length - 1 (rounded; fewer where short ones
    coincide)."""
    if n_buckets < 1:
        raise CtxevalError(f"--position-buckets must be >= 1 bucket, got {n_buckets}")
    raw = np.geomspace(1, max_length, n_buckets + 1)
    return tuple(sorted({int(round(x)) for x in raw} | {1, max_length}))


def parse_position_buckets(text: str | None, max_length: int, trained_length: int | None) -> tuple[int, ...]:
    """--position-buckets: empty = one per octave (default_edges); N = N log-spaced buckets; 'E0,E1,...' = the
    bucket edges themselves (k = 1024), strictly increasing."""
    if text is None or not str(text).strip():
        return default_edges(max_length, trained_length)
    text = str(text).strip()
    if "," not in text:
        try:
            n = parse_whole(text, "--position-buckets", maximum=MAX_BUCKETS)
        except CtxevalError as exc:
            if "must be <=" in str(exc) or "must be >=" in str(exc):
                raise CtxevalError(
                    f"--position-buckets must be a bucket count in 1..{MAX_BUCKETS}, got '{text}'"
                ) from None
            raise CtxevalError(
                f"--position-buckets takes a bucket count (e.g. 16) or edges (e.g. 1,1k,4k,8k,16k), got '{text}'"
            ) from None
        return log_edges(n, max_length)
    parts = [part for part in text.split(",") if part.strip()]
    if len(parts) > MAX_BUCKETS + 1:
        raise CtxevalError(f"--position-buckets takes at most {MAX_BUCKETS + 1} edges, got {len(parts)}")
    edges = [parse_token_count(part, "--position-buckets") for part in parts]
    if len(edges) < 2:
        raise CtxevalError(f"--position-buckets needs at least two edges, got '{text}'")
    bad = [f"{a} then {b}" for a, b in zip(edges, edges[1:]) if b <= a]
    if bad:
        raise CtxevalError(f"--position-buckets edges must increase strictly, got {bad[0]} in '{text}'")
    if edges[0] < 0:
        raise CtxevalError(f"--position-buckets edges must be >= 0, got {edges[0]}")
    return tuple(edges)


def bucket_sums(nll: np.ndarray, first_position: int, edges: Sequence[int]) -> tuple[list[float], list[int]]:
    """Per bucket, the summed NLL and the count of the tokens nll[j] at positions first_position + j.

    nll: (n,) float. Tokens outside [edges[0], edges[-1]) are not counted."""
    positions = first_position + np.arange(len(nll))
    bucket = np.searchsorted(np.asarray(edges), positions, side="right") - 1  # edges[b] <= p < edges[b + 1]
    inside = (bucket >= 0) & (bucket < len(edges) - 1)
    n_buckets = len(edges) - 1
    sums = np.bincount(bucket[inside], weights=np.asarray(nll, dtype=np.float64)[inside], minlength=n_buckets)
    counts = np.bincount(bucket[inside], minlength=n_buckets)
    return [float(s) for s in sums], [int(c) for c in counts]


def add_sums(
    total: tuple[list[float], list[int]] | None, part: tuple[list[float], list[int]]
) -> tuple[list[float], list[int]]:
    """Elementwise sum of two bucket_sums results (windows of one sliding-protocol point)."""
    if total is None:
        return list(part[0]), list(part[1])
    return [a + b for a, b in zip(total[0], part[0])], [a + b for a, b in zip(total[1], part[1])]


def key_sums(nll: np.ndarray, positions: np.ndarray, length: int) -> tuple[float, int]:
    """(summed NLL, count) of the key tokens inside a sequence of `length` tokens; nll[t - 1] is token t's loss."""
    inside = positions[positions < length]
    return float(np.asarray(nll, dtype=np.float64)[inside - 1].sum()), int(len(inside))
