"""One forward at a long length with each attention method vs plain sdpa: time ratio and peak memory.

    python benchmarks/attention_methods.py [--model smollm2] [--length 16384] [--repeats 1] [--out FILE.json]

Each method runs in its own subprocess (peak memory is the process's: CUDA's max_memory_allocated on a GPU, the
resident set's high-water mark on a CPU), on the same random token ids, the baseline `none` (transformers' sdpa)
first and last so that drift on a shared machine shows; ratios are against the median of the baseline runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

METHODS = ["none", "self-extend:group_size=4,neighbor_window=2048", "rerope:window=2048",
           "leaky-rerope:window=2048,k=16", "ntk:factor=2+logn"]

CHILD = r"""
import json, resource, sys, time, torch
from ctxeval.attention import attention_methods
from ctxeval.models import load_model
from ctxeval.patching import find_rotary_modules
from ctxeval.specs import expand_specs
model, length, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lm = load_model(model, dtype="auto", device="auto")
spec = expand_specs([text])[0]
rotary = find_rotary_modules(lm.model)[0][1]
ids = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(0)).to(lm.device)
if lm.device.startswith("cuda"):
    torch.cuda.reset_peak_memory_stats()
with attention_methods(lm.model, spec.attention, lambda: rotary.inv_freq, lm.trained_length), torch.inference_mode():
    lm.model.model(input_ids=ids[:, :256])  # warm-up: first-call costs stay out of the timing
    start = time.perf_counter()
    lm.model.model(input_ids=ids)  # the decoder only: the LM head's L x vocab logits are the same for every method
    if lm.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
peak = (torch.cuda.max_memory_allocated() if lm.device.startswith("cuda")
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(json.dumps({"method": text, "seconds": seconds, "peak_bytes": peak, "device": lm.device, "dtype": lm.dtype}))
"""


def run(model: str, length: int, text: str) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, model, str(length), text], capture_output=True, text=True,
                            timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{text}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--methods", default=";".join(METHODS), help="';'-separated method specs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    methods = [m for m in args.methods.split(";") if m and m != "none"]
    baseline = [run(args.model, args.length, "none")]
    measured = [run(args.model, args.length, m) for m in methods]
    baseline.append(run(args.model, args.length, "none"))
    base_s = statistics.median(b["seconds"] for b in baseline)
    base_mem = statistics.median(b["peak_bytes"] for b in baseline)
    rows = [{"method": "none (sdpa)", "seconds": [round(b["seconds"], 2) for b in baseline], "time_ratio": 1.0,
             "peak_gib": round(base_mem / 2**30, 3), "memory_ratio": 1.0}]
    for m in measured:
        rows.append({"method": m["method"], "seconds": [round(m["seconds"], 2)],
                     "time_ratio": round(m["seconds"] / base_s, 2), "peak_gib": round(m["peak_bytes"] / 2**30, 3),
                     "memory_ratio": round(m["peak_bytes"] / base_mem, 2)})
    report = {"model": args.model, "length": args.length, "device": baseline[0]["device"],
              "dtype": baseline[0]["dtype"], "rows": rows}
    print(f"{args.model}, one forward of {args.length:,} tokens on {report['device']} ({report['dtype']})")
    print(f"{'method':<48} {'seconds':>16} {'x sdpa':>7} {'peak GiB':>9} {'x sdpa':>7}")
    for r in rows:
        print(f"{r['method']:<48} {'/'.join(str(s) for s in r['seconds']):>16} {r['time_ratio']:>7} "
              f"{r['peak_gib']:>9} {r['memory_ratio']:>7}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
