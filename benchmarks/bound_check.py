"""Independent check of `ctxeval bound --head-dim 128` (Men et al. 2024, "Base of RoPE Bounds Context Length").

A base b passes length L when B_m(b) = sum_{i=0}^{d/2-1} cos(m * b^(-2i/d)) >= 0 for every integer m = 0..L.

This script shares no search code with ctxeval.rope.bound (only the paper's constants are copied below):

1. float64 numpy, direct cos of (m, pair) blocks (up to 65536 x 64), early exit at the first negative m. Every
   grid base with two significant digits from 1.1 upwards is scanned (no shortcut: failing bases exit early)
   until the first base with no negative B_m for m <= 2^20 (enough for both the k = 1000 and k = 1024 readings).
2. 40-digit mpmath re-checks of every decisive value: the failing m of every scanned failing base (B_m < 0);
   for each first-feasible base, every m <= L with float64 B_m < 1e-3 plus the 50 smallest (all >= 0); for the
   paper's bases, the failing m and every m below it with float64 B_m < 1e-3 (so the failing m is the first).
3. Comparison with `ctxeval bound --head-dim 128 --format json` (subprocess) and with the table in docs/bound.md.
4. Other readings of the paper's lengths: k = 1000 or 1024, and m <= L or m < L.

Run:  python benchmarks/bound_check.py [--ctxeval-src DIR]     (about a minute on 2 CPU cores)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    import mpmath
except ImportError:  # pragma: no cover
    sys.exit("mpmath is needed: pip install mpmath")

D = 128
H = D // 2
# Table 1 of the paper, d = 128, copied (not imported) so that nothing of ctxeval is used: L -> base.
PAPER = {
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
K1000 = list(PAPER)
K1024 = [n // 1000 * 1024 if n < 1_000_000 else 1 << 20 for n in K1000]  # 1k = 1024, ..., 1M = 2^20
CAP = 1 << 20  # positions 0..CAP are scanned: covers every reading below
SMALL = 1e-3  # float64 values below this are re-checked in mpmath
ROOT = Path(__file__).resolve().parents[1]
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- the grid, exactly as decimal strings
def grid():
    """(label, float) for 1.1, 1.2, ..., 9.9, 10, 11, ..., 99, 100, 110, ... (two significant digits)."""
    exp = -1
    while True:
        for mant in range(10, 100):
            if exp == -1 and mant == 10:
                continue  # start at 1.1
            s = f"{mant}e{exp}"
            yield s, float(s)
        exp += 1


def label(b: float) -> str:
    return f"{b:.1e}".replace("e+0", "e").replace("e+", "e")


# ---------------------------------------------------------------- float64 scan
def theta64(b: float) -> np.ndarray:
    return np.exp(np.log(b) * (-2.0 * np.arange(H, dtype=np.float64) / D))  # (H,)


_BUF = np.empty((65536, H))


def values64(b: float, m: np.ndarray) -> np.ndarray:
    """B_m for the integer positions m (n <= 65536), float64, direct cos."""
    buf = _BUF[: m.size]
    np.multiply.outer(m.astype(np.float64), theta64(b), out=buf)
    np.cos(buf, out=buf)
    return buf.sum(axis=1)


def first_neg64(b: float, cap: int, track: int | None = None):
    """First m in 0..cap with float64 B_m < 0 (cap + 1 if none). With track = L: also return the m <= min(L, first
    negative - 1) with B_m < SMALL or among the 50 smallest (for the mpmath re-check), with their values."""
    start, size = 0, 1024
    keep_m, keep_v = np.empty(0, np.int64), np.empty(0)
    while start <= cap:
        m = np.arange(start, min(start + size, cap + 1), dtype=np.int64)
        v = values64(b, m)
        neg = np.flatnonzero(v < 0)
        stop = neg[0] if neg.size else m.size
        if track is not None:
            lim = min(stop, max(0, track - start + 1))
            mm, vv = np.concatenate([keep_m, m[:lim]]), np.concatenate([keep_v, v[:lim]])
            sel = np.zeros(mm.size, bool)
            sel[np.argsort(vv, kind="stable")[:50]] = True
            sel |= vv < SMALL
            keep_m, keep_v = mm[sel], vv[sel]
        if neg.size:
            first = int(m[neg[0]])
            return (first, keep_m, keep_v) if track is not None else first
        start += m.size
        size = min(size * 4, 65536)
    return (cap + 1, keep_m, keep_v) if track is not None else cap + 1


# ---------------------------------------------------------------- 40 digits
mpmath.mp.dps = 40
_MP_THETA: dict[str, list] = {}


def mp_value(bstr: str, m: int):
    th = _MP_THETA.get(bstr)
    if th is None:
        b = mpmath.mpf(bstr)
        th = _MP_THETA[bstr] = [b ** (mpmath.mpf(-2 * i) / D) for i in range(H)]
    return mpmath.fsum(mpmath.cos(m * t) for t in th)


def bstr_of(b: float) -> str:
    return f"{b:.1e}"  # every base here has two significant digits: exact decimal


# ---------------------------------------------------------------- ctxeval, as a subprocess
ARGS = ["bound", "--head-dim", "128", "--format", "json"]


def run_ctxeval(problems: list[str]) -> dict[int, dict]:
    """Rows of `ctxeval bound --head-dim 128 --format json`, by length. The installed entry point by default;
    with --ctxeval-src DIR, `ctxeval.cli.main` from that source tree (e.g. a `git archive HEAD` copy, for when the
    working tree is mid-refactor). Empty dict (and a recorded problem) when the command fails."""
    if "--ctxeval-src" in sys.argv:
        src = sys.argv[sys.argv.index("--ctxeval-src") + 1]
        cmd = [sys.executable, "-c", "import sys; from ctxeval.cli import main; sys.exit(main())", *ARGS]
        env = {**__import__("os").environ, "PYTHONPATH": src}
        where, cwd = f"ctxeval.cli from {src}", src  # cwd too: `python -c` puts it first on sys.path
    else:
        exe = Path(sys.executable).with_name("ctxeval")
        cmd, env, where, cwd = [str(exe) if exe.exists() else "ctxeval", *ARGS], None, "installed ctxeval", ROOT
    log(f"running: ctxeval {' '.join(ARGS)}  ({where})")
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)
    if res.returncode:
        tail = (res.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        problems.append(f"`ctxeval {' '.join(ARGS)}` ({where}) failed, rc {res.returncode}: {tail}")
        log("  FAILED: " + tail)
        return {}
    return {r["length"]: r for r in json.loads(res.stdout)["rows"]}


# ---------------------------------------------------------------- main
def main() -> int:
    problems: list[str] = []
    log(f"d = {D}; scanning the two-digit grid from 1.1 up, float64 direct cos, m = 0..{CAP:,} (early exit)")

    # 1. one ascending scan: M(b) = first negative m (capped), until a base passes all of 0..CAP
    scanned: list[tuple[str, float, int]] = []
    last_print = 0.0
    for s, b in grid():
        M = first_neg64(b, CAP)
        scanned.append((s, b, M))
        if time.perf_counter() - last_print > 10 or M > CAP:
            log(f"  base {label(b):>7}: first negative m = {M if M <= CAP else 'none'}  ({len(scanned)} bases)")
            last_print = time.perf_counter()
        if M > CAP:
            break
    t_scan = time.perf_counter() - T0
    log(f"scan done: {len(scanned)} grid bases, from 1.1 to {label(scanned[-1][1])}, {t_scan:.1f}s")
    Ms = np.array([x[2] for x in scanned])
    bases = np.array([x[1] for x in scanned])

    # 2a. every failing base's failing m is negative in 40 digits
    log("mpmath: failing m of every failing grid base (B_m < 0?)")
    worst = None
    for s, _base, M in scanned:
        if M > CAP:
            continue
        v = mp_value(s, M)
        if v >= 0:
            problems.append(f"base {s}: float64 B_{M} < 0 but mpmath {mpmath.nstr(v, 6)} >= 0")
        if worst is None or abs(v) < abs(worst[2]):
            worst = (s, M, v)
    log(
        f"  {int((Ms <= CAP).sum())} failing bases confirmed negative; smallest |B| at a failing m: "
        f"{mpmath.nstr(worst[2], 4)} (base {label(float(worst[0]))}, m = {worst[1]})"
    )

    def first_feasible(L: int, strict: bool) -> float:
        """strict: m < L (so M >= L passes); else m <= L (M > L)."""
        ok = Ms >= L if strict else Ms > L
        return float(bases[np.argmax(ok)])

    # 2b. each first-feasible candidate (all readings) re-checked: its small float64 values >= 0 in mpmath
    readings = {
        "k=1000, m<=L": (K1000, False),
        "k=1000, m<L": (K1000, True),
        "k=1024, m<=L": (K1024, False),
        "k=1024, m<L": (K1024, True),
    }
    ff = {name: [first_feasible(L, st) for L in Ls] for name, (Ls, st) in readings.items()}
    cands = sorted(
        {(ff[name][j], Ls[j] - 1 if st else Ls[j]) for name, (Ls, st) in readings.items() for j in range(len(Ls))}
    )
    log(f"mpmath: {len(cands)} first-feasible candidates (all readings): small B_m >= 0?")
    min_margin = None
    for b, Leff in cands:
        M, km, kv = first_neg64(b, Leff, track=Leff)
        assert M > Leff
        vals = [mp_value(bstr_of(b), int(m)) for m in km]
        low = min(vals)
        if low < 0:
            problems.append(f"base {label(b)} L={Leff}: mpmath B < 0 at m={int(km[vals.index(low)])}")
        if min_margin is None or low < min_margin[0]:
            min_margin = (low, label(b), Leff, int(km[vals.index(low)]))
        # the grid base just below fails at its m <= Leff, in 40 digits (also done in 2a; restated per candidate)
        i = int(np.flatnonzero(bases == b)[0])
        if i > 0:
            sb, _, Mb = scanned[i - 1]
            assert Mb <= Leff
            if mp_value(sb, Mb) >= 0:
                problems.append(f"base {sb} (below {label(b)}) does not fail at m={Mb} in mpmath")
    log(
        f"  all {len(cands)} candidates >= 0 at every re-checked m; smallest 40-digit min B_m "
        f"{mpmath.nstr(min_margin[0], 4)} (base {min_margin[1]}, L = {min_margin[2]}, m = {min_margin[3]})"
    )

    # 2c. the paper's bases: first failing m up to CAP, and the m below it with small float64 values
    log("paper's bases: first failing m (float64) and 40-digit re-check")
    paper_fail = {}
    for L, b in PAPER.items():
        hit = np.flatnonzero(bases == b)
        M, km, kv = first_neg64(b, CAP, track=CAP)
        if hit.size and Ms[hit[0]] != M:
            problems.append(f"paper base {label(b)}: rescan M {M} != scan M {Ms[hit[0]]}")
        below_ok = all(mp_value(bstr_of(b), int(m)) >= 0 for m in km[kv < SMALL])
        if not below_ok:
            problems.append(f"paper base {label(b)}: an m below its first float64 failure is negative in mpmath")
        f64 = float(values64(b, np.array([M]))[0]) if M <= CAP else None
        mp = mp_value(bstr_of(b), M) if M <= CAP else None
        if mp is not None and mp >= 0:
            problems.append(f"paper base {label(b)}: B_{M} >= 0 in mpmath")
        paper_fail[L] = (M, f64, mp, int((kv < SMALL).sum()))

    # 3. ctxeval and the docs
    cx = run_ctxeval(problems)
    docs = {}
    for line in (ROOT / "docs" / "bound.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[\d,]+", cells[0]):
            fm = re.match(r"([\d,]+) \(([-\d.]+)\)", cells[4])
            docs[int(cells[0].replace(",", ""))] = {
                "paper": float(cells[1]),
                "first": float(cells[2].strip("*")),
                "above": float(cells[3]),
                "fail": (int(fm.group(1).replace(",", "")), float(fm.group(2))) if fm else None,
            }

    print()
    print(
        f"{'L':>9} {'paper':>6} {'ff f64':>7} {'ctxeval':>7} ok | {'paper fails at m':>20} {'B_m f64':>9} "
        f"{'B_m 40dig':>9} {'docs':>17} ok"
    )
    mine = ff["k=1000, m<=L"]
    for j, L in enumerate(K1000):
        a, c = mine[j], cx[L]["first_feasible"] if L in cx else float("nan")
        agree = a == c
        mark = "-" if not cx else "Y" if agree else "N"
        M, f64, mp, _ = paper_fail[L]
        fails = M <= L
        fs = f"{M:,}" if fails else f"none (first {M:,})" if M <= CAP else "none"
        d = docs[L]["fail"]
        ds = f"{d[0]:,} ({d[1]})" if d else ""
        dok = (
            docs[L]["first"] == a
            and docs[L]["paper"] == PAPER[L]
            and ((d is None and not fails) or (d is not None and fails and d[0] == M and abs(d[1] - f64) < 0.006))
        )
        if cx and not agree:
            problems.append(f"L={L}: first feasible {label(a)} vs ctxeval {label(c)}")
        if not dok:
            problems.append(
                f"L={L}: first feasible {label(a)}, paper base failure {fs} vs docs {label(docs[L]['first'])}, {ds}"
            )
        b64 = f"{f64:+.4f}" if fails else ""
        bmp = mpmath.nstr(mp, 5) if fails else ""
        print(
            f"{L:>9,} {label(PAPER[L]):>6} {label(a):>7} {label(c) if c == c else 'n/a':>7} {mark:>2} | "
            f"{fs:>20} {b64:>9} {bmp:>9} {ds:>17} {'Y' if dok else 'N'}"
        )
    print()
    print(
        "paper's base, first failing m anywhere up to 2^20 (max context = m - 1):",
        ", ".join(
            f"{label(PAPER[L])}: {paper_fail[L][0]:,}" if paper_fail[L][0] <= CAP else f"{label(PAPER[L])}: none"
            for L in K1000
        ),
    )

    # 4. other readings
    print()
    print("readings: rows where the first feasible grid base equals the paper's")
    best = 0
    for name in readings:
        hits = [f"{L0 // 1000}k" if L0 < 1_000_000 else "1M" for L0, a in zip(K1000, ff[name]) if a == PAPER[L0]]
        best = max(best, len(hits))
        print(f"  {name:<13} {len(hits):>2}/11   rows: {' '.join(hits)}")
        print(f"  {'':<13}        first feasible: {' '.join(label(a) for a in ff[name])}")
    # no first-feasible reading can beat the rows where the paper's own base passes (necessary condition)
    for k, Ls in (("1000", K1000), ("1024", K1024)):
        n_ok = sum(paper_fail[L0][0] >= L for L0, L in zip(K1000, Ls))  # paper base passes m < L, the weakest
        print(
            f"  k={k}: the paper's base passes even m < L in only {n_ok}/11 rows "
            f"(an upper bound on the rows any first-feasible reading with these lengths can match)"
        )
    if cx:
        print(
            f"  ctxeval all_feasible_above equal to the paper: "
            f"{sum(cx[L]['all_feasible_above'] == PAPER[L] for L in K1000)}/11 (ctxeval's value, not recomputed)"
        )

    print()
    print(f"best reading reproduces {best}/11 rows")
    print(f"total runtime {time.perf_counter() - T0:.1f}s (scan {t_scan:.1f}s)")
    if problems:
        print("DISAGREEMENTS:")
        for p in problems:
            print("  - " + p)
        return 1
    print("float64 and 40-digit checks agree with every row of `ctxeval bound` and with docs/bound.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
