"""The vLLM backend against the hf backend, through the CLI, in one environment that has both (vLLM's).

  python benchmarks/vllm_backend.py speed --out benchmarks/results/vllm_backend-speed-smollm2-4k.json
      RULER (--tasks, default niah_single_1,niah_multikey_1) on SmolLM2 at 4k, --samples 20, method none: hf at batch
      1 and at --hf-batch (default 4), then vLLM on the same prompts (--samples-from the first run); wall time of each
      command (model load or engine start included), measuring time (the rows' seconds summed), prompt tokens per
      second of that time, median seconds per point against hf at batch 1, and every prediction compared with hf at
      batch 1. --reuse keeps run directories that have rows (a run stopped part way reports the points it has).

  python benchmarks/vllm_backend.py equality --model tiny --out benchmarks/results/vllm_backend-equality-tiny.json
      For none, pi, ntk, yarn, llama3 and longrope: needle, passkey (yarn protocol) and RULER niah_single_1 on hf and
      on vLLM (same prompts), every greedy reply compared; vLLM's read-back of each method from run.json.

Each run directory is kept under --runs (default /tmp/ctxeval-vllm-bench); nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPLY = {"ruler": "prediction", "needle": "response", "passkey": "response"}
KEYS = {
    "ruler": ("label", "ruler_task", "length", "sample"),
    "needle": ("label", "length", "depth", "sample"),
    "passkey": ("label", "length", "sample"),
}


def run(args: list[str], log: Path) -> float:
    """One ctxeval command; its wall time. Its output goes to `log`; a failure stops the benchmark."""
    start = time.perf_counter()
    with open(log, "w") as fh:
        code = subprocess.call([sys.executable, "-m", "ctxeval", *args], stdout=fh, stderr=subprocess.STDOUT)
    if code != 0:
        raise SystemExit(f"failed ({code}): ctxeval {' '.join(args)}; see {log}")
    return time.perf_counter() - start


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "rows.jsonl") if line.strip()]


def compare(kind: str, hf: Path, vllm: Path) -> dict:
    """Replies of the two runs, point by point: counts and every differing sample with both replies."""

    def replies(d: Path) -> dict:
        return {tuple(r.get(k) for k in KEYS[kind]): r for r in rows(d) if r.get("status") == "ok"}

    a, b = replies(hf), replies(vllm)
    differing = [
        {
            "point": list(k),
            "hf": a[k][REPLY[kind]],
            "vllm": b[k][REPLY[kind]],
            "scores": [a[k].get("value"), b[k].get("value")],
        }
        for k in sorted(a, key=str)
        if k in b and a[k][REPLY[kind]] != b[k][REPLY[kind]]
    ]
    return {
        "points_hf": len(a),
        "points_vllm": len(b),
        "compared": len(set(a) & set(b)),
        "equal": len(set(a) & set(b)) - len(differing),
        "differing": differing,
    }


def measured(run_dir: Path) -> dict:
    ok = [r for r in rows(run_dir) if r.get("status") == "ok"]
    seconds = sum(r["seconds"] for r in ok)
    tokens = sum(r.get("prompt_tokens", 0) for r in ok)
    return {
        "points": len(ok),
        "measure_seconds": round(seconds, 1),
        "prompt_tokens": tokens,
        "seconds_per_point": round(seconds / len(ok), 3) if ok else None,
        "prompt_tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "median_seconds_per_point": round(statistics.median(r["seconds"] for r in ok), 3) if ok else None,
        "mean_score": round(statistics.mean(float(r["value"]) for r in ok), 2) if ok else None,
    }


def speed(opts: argparse.Namespace) -> dict:
    runs = Path(opts.runs)
    common = [
        "ruler",
        "--model",
        opts.model,
        "--tasks",
        opts.tasks,
        "--lengths",
        opts.length,
        "--samples",
        str(opts.samples),
        "-m",
        "none",
        "--overwrite",
    ]
    out: dict = {"command": common, "runs": {}}
    first = runs / "speed-hf-b1"
    plan = [
        ("hf batch 1", first, ["--batch-size", "1"]),
        (
            f"hf batch {opts.hf_batch}",
            runs / f"speed-hf-b{opts.hf_batch}",
            ["--batch-size", str(opts.hf_batch), "--samples-from", str(first / "samples")],
        ),
        ("vllm", runs / "speed-vllm", ["--backend", "vllm", "--samples-from", str(first / "samples")]),
    ]
    for name, run_dir, extra in plan:
        if opts.reuse and (run_dir / "rows.jsonl").is_file():  # measured earlier (possibly stopped part way)
            wall = None
        else:
            wall = round(run(common + ["--out", str(run_dir), *extra], run_dir.with_suffix(".log")), 1)
        out["runs"][name] = {
            "wall_seconds": wall,
            **measured(run_dir),
            "dir": str(run_dir),
            "vs_hf_batch_1": compare("ruler", first, run_dir) if run_dir != first else None,
        }
        print(name, json.dumps({k: v for k, v in out["runs"][name].items() if k != "vs_hf_batch_1"}), flush=True)
    base = out["runs"]["hf batch 1"]["seconds_per_point"]
    for r in out["runs"].values():  # per point (the mean: vLLM's replies finish together, so its median says
        # nothing), so that a run stopped part way compares too
        r["seconds_per_point_vs_hf_batch_1"] = round(r["seconds_per_point"] / base, 3) if base else None
    return out


def _factors(n: int, low: float, high: float) -> str:
    return ";".join(f"{low + (high - low) * i / (n - 1):.4f}" for i in range(n))


METHODS = {  # longrope: factors rising over the pairs, short ones too (the short regime is checked at 2k on SmolLM2)
    "tiny": [
        "none",
        "pi:factor=4",
        "ntk:factor=4",
        "yarn:factor=4",
        "llama3:factor=4",
        f"longrope:factor=4,short_factor={_factors(16, 1.0, 1.5)},long_factor={_factors(16, 1.0, 4.0)}",
    ],
    "smollm2": [
        "none",
        "pi:factor=2",
        "ntk:factor=2",
        "yarn:factor=2",
        "llama3:factor=2",
        f"longrope:factor=2,short_factor={_factors(32, 1.0, 1.5)},long_factor={_factors(32, 1.0, 2.0)}",
    ],
}
SIZES = {  # (needle lengths, passkey lengths, ruler lengths): tiny past its 128 trained tokens; SmolLM2 inside its 8k
    "tiny": ("256,512", "256,500", "512"),  # yarn:factor=4 has 512 rows on vLLM: passkey prompts under 500 + 10 fit
    "smollm2": ("2k", "2k", "2k"),
}


def equality(opts: argparse.Namespace) -> dict:
    runs = Path(opts.runs) / f"equality-{opts.model}"
    runs.mkdir(parents=True, exist_ok=True)
    methods = [a for m in METHODS[opts.model] for a in ("-m", m)]
    needle, passkey, ruler = SIZES[opts.model]
    commands = {
        "needle": ["needle", "--model", opts.model, "--lengths", needle, "--depths", "0,50,100", "--samples", "1"],
        "passkey": ["passkey", "--model", opts.model, "--lengths", passkey, "--samples", "3"],
        "ruler": ["ruler", "--model", opts.model, "--tasks", "niah_single_1", "--lengths", ruler, "--samples", "3"],
    }
    out: dict = {"model": opts.model, "methods": METHODS[opts.model], "commands": {}}
    for kind, args in commands.items():
        hf, vllm = runs / f"{kind}-hf", runs / f"{kind}-vllm"
        extra = ["--samples-from", str(hf / "samples")] if kind == "ruler" else []
        wall_hf = run(args + methods + ["--out", str(hf), "--overwrite"], hf.with_suffix(".log"))
        wall_vllm = run(
            args + methods + ["--out", str(vllm), "--overwrite", "--backend", "vllm", *extra], vllm.with_suffix(".log")
        )
        record = json.loads((vllm / "run.json").read_text())
        readback = {
            label: {
                "rotary_class": m.get("rotary_class"),
                "table_dtype": m.get("table_dtype"),
                "max_angle_diff": max(e["max_angle_diff"] for e in m["effective"]),
                "max_magnitude_rel_diff": max(e["max_magnitude_rel_diff"] for e in m["effective"]),
                "positions_checked": max(e["positions_checked"] for e in m["effective"]),
            }
            for label, m in record["methods"].items()
        }
        out["commands"][kind] = {
            "args": args,
            "wall_seconds": {"hf": round(wall_hf, 1), "vllm": round(wall_vllm, 1)},
            **compare(kind, hf, vllm),
            "readback": readback,
        }
        print(kind, json.dumps({k: v for k, v in out["commands"][kind].items() if k not in ("readback",)}), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("speed", "equality"))
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", default="niah_single_1,niah_multikey_1")
    parser.add_argument("--length", default="4k")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--hf-batch", type=int, default=4)
    parser.add_argument("--runs", default="/tmp/ctxeval-vllm-bench")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="speed: keep a run directory that has rows (a run stopped part way is reported with the points it has)",
    )
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    Path(opts.runs).mkdir(parents=True, exist_ok=True)
    result = speed(opts) if opts.what == "speed" else equality(opts)
    import platform

    import torch
    import transformers
    import vllm

    result["environment"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm.__version__,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPU cores",
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
