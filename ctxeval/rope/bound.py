"""The lower bound on the RoPE base from "Base of RoPE Bounds Context Length" (Men et al. 2024).

With theta_i = b^(-2i/d), i = 0 .. d/2-1 (d the rotary dim), the paper asks of a base b and a context length L
that

    B_m(b) = sum_i cos(m * theta_i) >= 0   for every m = 0 .. L,

so that attention still tells a similar token from a random one at every distance up to L. The set of bases that
pass is not an interval: islands of passing and failing bases alternate long before every larger base passes.
So two numbers are computed per L, both on the grid of bases with two significant digits (1.1, 1.2, ..., 9.9, 10,
11, ..., 99, 100, 110, ...):

- `first_feasible`: the first grid base that passes, scanning upwards (how the paper's Table 1 reads; 6 of its
  11 rows come out the same, docs/bound.md);
- `all_feasible_above`: the grid base from which every larger grid base passes. The scan stops at `safe_base`,
  a base above which every base (on or off the grid) provably passes (`safe_base`'s docstring says why).

`first_negative` is the one hot loop (numpy, plus one torch matrix product; its docstring says how it stays fast).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import CtxevalError

# Table 1 of the paper, d = 128: context length -> lower bound of the base. The lengths are read as thousands
# (1k = 1000, 1M = 10^6): that reading reproduces more rows than k = 1024 (docs/bound.md has both).
PAPER_HEAD_DIM = 128
PAPER_TABLE: dict[int, float] = {
    1_000: 4.3e3,
    2_000: 1.6e4,
    4_000: 2.7e4,
    8_000: 8.4e4,
    16_000: 3.1e5,
    32_000: 6.4e5,
    64_000: 2.1e6,
    128_000: 7.8e6,
    256_000: 3.6e7,
    512_000: 6.4e7,
    1_000_000: 5.1e8,
}
PAPER_LENGTHS: tuple[int, ...] = tuple(PAPER_TABLE)

MAX_LENGTH = 1 << 24  # longest L (and longest scan for max_context): beyond this a table takes minutes
MAX_BASE = 1e20  # the grid scan stops here (reached only for d <= 6 and long L, where safe_base is astronomic)
_BLOCK = 1024  # positions per row of the block product in first_negative


def _screen(head_dim: int) -> float:
    """float32 values of B below this are recomputed in float64. The worst-case float32 error of the block product
    is about d * 6e-8 (rounding, d terms) * d/2 (their total size): 5e-4 for d = 128; the screen is 4x that."""
    return max(2e-3, 1.2e-7 * head_dim**2)


def check_head_dim(head_dim: int) -> None:
    if head_dim < 2 or head_dim % 2:
        raise CtxevalError(f"--head-dim must be an even number >= 2 (the rotary dim), got {head_dim}")


def inv_freq(base: float, head_dim: int) -> np.ndarray:
    """theta_i = base^(-2i/d), i = 0 .. d/2-1, float64.  # (d/2,)"""
    return float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def criterion(base: float, head_dim: int, positions: np.ndarray) -> np.ndarray:
    """B_m = sum_i cos(m theta_i) at the given positions, directly in float64 (the reference).

    positions: (n,) integers -> (n,) float64.
    """
    m = np.asarray(positions, dtype=np.float64)
    return np.cos(np.multiply.outer(m, inv_freq(base, head_dim))).sum(axis=-1)  # (n, d/2) -> (n,)


def first_negative(base: float, head_dim: int, limit: int) -> int:
    """The smallest m in 0..limit with B_m < 0, or limit + 1 when B_m >= 0 for all of them.

    Positions 0..255 are tried directly first (small bases fail there). Then blocks: with m = m0 + k, k < K = 1024,
    cos((m0 + k) theta) = cos(m0 theta) cos(k theta) - sin(m0 theta) sin(k theta), so J x K values of B are one
    matrix product [cos(m0 theta), sin(m0 theta)] (J, d) @ [cos(k theta); -sin(k theta)] (d, K). The product runs
    in float32 (torch, on one thread) on phases formed in float64 (m < 2^24 loses < 1e-8 there); every value below
    `_screen` (4x the worst float32 error) is recomputed with `criterion` in float64, which decides. J grows from
    16 to 1024 (16k to 1M positions a block): a base that fails early costs little, one that passes 1M ~5 ms.
    """
    head = np.arange(min(limit, 255) + 1)  # (n,): small bases fail within a few hundred positions
    neg = np.flatnonzero(criterion(base, head_dim, head) < 0)
    if neg.size:
        return int(head[neg[0]])
    import torch  # the block product: torch on one thread (multi-threaded BLAS stalls on a busy machine)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _scan_blocks(base, head_dim, limit)
    finally:
        torch.set_num_threads(threads)


def _scan_blocks(base: float, head_dim: int, limit: int) -> int:
    import torch

    screen = _screen(head_dim)
    theta = inv_freq(base, head_dim)  # (h,), h = d/2
    k = np.arange(_BLOCK, dtype=np.float64)
    ph = np.multiply.outer(theta, k)  # (h, K)
    right = torch.from_numpy(np.concatenate([np.cos(ph), -np.sin(ph)]).astype(np.float32))  # (d, K)
    start, rows = 0, 16
    while start <= limit:
        rows = min(rows, (limit - start) // _BLOCK + 1)
        m0 = start + _BLOCK * np.arange(rows, dtype=np.float64)  # (J,)
        ph0 = np.multiply.outer(m0, theta)  # (J, h), float64
        left = np.concatenate([np.cos(ph0), np.sin(ph0)], axis=1).astype(np.float32)  # (J, d)
        values = (torch.from_numpy(left) @ right).numpy().ravel()[: limit - start + 1]  # (J*K,): B at m = start + i
        low = start + np.flatnonzero(values < screen)  # (c,) candidate positions, ascending
        done, step = 0, 16
        while done < low.size:  # confirm in float64, first candidates first: a failing base stops early
            m = low[done : done + step]
            neg = np.flatnonzero(criterion(base, head_dim, m) < 0)
            if neg.size:
                return int(m[neg[0]])
            done, step = done + step, step * 4
        start += rows * _BLOCK
        rows = min(rows * 2, 1024)
    return limit + 1


def max_context(base: float, head_dim: int, limit: int = MAX_LENGTH) -> int:
    """Largest L with B_m >= 0 for all m <= L (scanning m upwards). Returns limit when no m <= limit fails."""
    check_head_dim(head_dim)
    return first_negative(base, head_dim, limit) - 1


def base_grid(low: float, high: float) -> list[float]:
    """Bases with two significant digits, low <= b <= high, ascending: 1.1, ..., 9.9, 10, 11, ..., 99, 100, 110, ..."""
    out: list[float] = []
    exp = math.floor(math.log10(low)) - 1
    while True:
        for mant in range(10, 100):
            b = float(f"{mant}e{exp}")
            if b > high:
                return out
            if b >= low:
                out.append(b)
        exp += 1


def _min_cos_integers(length: int) -> float:
    """min over integers m = 0..length of cos(m) (theta_0 = 1 for every base)."""
    return float(np.cos(np.arange(length + 1, dtype=np.float64)).min())


def safe_base(head_dim: int, length: int) -> float:
    """A base above which every base passes for this L; math.inf when this argument finds none below 1e300.

    For m <= L: a pair with L theta_i <= pi has cos(m theta_i) >= cos(L theta_i) (cos falls on [0, pi]); any
    other pair is >= -1, and pair 0 (theta_0 = 1 for every base) is >= min over integers m <= L of cos(m). The sum
    S(b) of these lower bounds never decreases as b grows (every theta_i, i >= 1, shrinks), so once S(b) >= 0 every
    larger base passes too. Bisection on log b finds where S turns non-negative (returned rounded up a little).
    With d = 2 (pair 0 only) no base passes any L >= 2: B_m = cos(m) for every base.
    """
    theta_exp = -np.arange(2, head_dim, 2, dtype=np.float64) / head_dim  # pairs 1 .. d/2-1: (h-1,)
    c0 = _min_cos_integers(length)
    tol = 1e-9  # S(b) must clear this, far above its float64 rounding

    def lower(log_b: float) -> float:
        x = length * (10.0**log_b) ** theta_exp  # (h-1,)
        return c0 + float(np.where(x <= math.pi, np.cos(np.minimum(x, math.pi)), -1.0).sum())

    if c0 >= 0:
        return 1.0  # L <= 1: cos(0), cos(1) >= 0 and every other pair is >= cos(1) > 0: every base passes
    if lower(300.0) < tol:
        return math.inf
    lo, hi = 0.0, 300.0  # log10 b: lower(lo) < tol <= lower(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        if lower(mid) >= tol:
            hi = mid
        else:
            lo = mid
    return 10.0**hi * (1 + 1e-9)


@dataclass(frozen=True)
class BoundRow:
    length: int
    paper: float | None  # the paper's Table 1 value (d = 128 and a length of its table), else None
    first_feasible: float | None  # first grid base that passes; None: none up to MAX_BASE
    all_feasible_above: float | None  # every grid base from here up passes; None: not settled below MAX_BASE
    safe_base: float  # every base >= this passes (proved, see safe_base); the grid scan stops at the first above it

    def to_json(self) -> dict[str, float | int | None]:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class BoundTable:
    head_dim: int
    rows: list[BoundRow]
    grid_bases: int  # grid bases checked
    seconds: float


def bound_table(head_dim: int, lengths: list[int]) -> BoundTable:
    """First-feasible and all-feasible-above bases for each L, from one ascending scan of the two-digit grid.

    For every grid base b from 1.1 up to the first grid base >= safe_base(L) of every L (at most MAX_BASE),
    M(b) = first_negative(b, d, max L) is computed once; L passes at b iff M(b) > L, which answers every length
    from the same scan.
    """
    check_head_dim(head_dim)
    if not lengths:
        raise CtxevalError("no lengths given; write e.g. --lengths 1000,2000,4000")
    bad = [n for n in lengths if not 1 <= n <= MAX_LENGTH]
    if bad:
        raise CtxevalError(f"length {bad[0]} is out of range: lengths must be between 1 and {MAX_LENGTH:,}")
    t0 = time.perf_counter()
    lengths = sorted(set(int(n) for n in lengths))
    longest = max(lengths)
    safe = {n: safe_base(head_dim, n) for n in lengths}
    top = max([min(s, MAX_BASE) for s in safe.values()] + [1.1])
    grid = base_grid(1.1, top * 10)
    grid = grid[: next(i for i, b in enumerate(grid) if b >= top) + 1]  # (G,) up to the first grid base >= top
    bases = np.array(grid)  # (G,)
    proved_top = max(safe.values()) <= grid[-1]  # the top grid base passes every L by safe_base: no scan needed
    first_neg = np.array(
        [first_negative(b, head_dim, longest) for b in grid[:-1]]  # (G,): M(b), capped
        + [longest + 1 if proved_top else first_negative(grid[-1], head_dim, longest)]
    )
    rows = []
    for n in lengths:
        paper = PAPER_TABLE.get(n) if head_dim == PAPER_HEAD_DIM else None
        ok = first_neg > n  # (G,)
        first = float(bases[np.argmax(ok)]) if ok.any() else None
        above = None
        if safe[n] <= grid[-1]:
            below = np.flatnonzero(~ok & (bases < safe[n]))
            above = float(bases[below[-1] + 1]) if below.size else float(bases[0])
        rows.append(BoundRow(n, paper, first, above, safe[n]))
    return BoundTable(head_dim, rows, len(grid), time.perf_counter() - t0)
