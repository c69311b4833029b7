"""One forward at a long length with each attention method vs plain sdpa: time ratio and peak memory; or, with
--decode N, greedy decoding of N tokens after a prompt of that length vs YaRN: time per generated token.

    python benchmarks/attention_methods.py [--model smollm2] [--length 16384] [--out FILE.json]
    python benchmarks/attention_methods.py --decode 64 [--baseline yarn:factor=2] [--length 16384] [--out FILE.json]

Each method runs in its own subprocess (peak memory during the timed forward: CUDA's max_memory_allocated on a GPU;
on a CPU the resident set sampled every 2 ms by a thread while the forward runs, so that the transients of loading
the model (dequantising a GGUF) do not count; the process's high-water mark is kept as `load_peak_gib`), on the same random token ids, the baseline `none` (transformers' sdpa)
first and last so that drift on a shared machine shows; ratios are against the median of the baseline runs.
Each row records the attention kernel the method ran on (ctxeval.attention.kernels.choose_kernel; set
CTXEVAL_ATTENTION_KERNEL=chunked to measure the exact reference loop instead). Decoding: one prefill of the prompt
with a KV cache (timed apart), then N single-token steps through the cache, each step's argmax fed back; the
per-token time is the median step, and the generated ids are recorded so that runs can be compared token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

METHODS = [
    "none",
    "self-extend:group_size=4,neighbor_window=2048",
    "rerope:window=2048",
    "leaky-rerope:window=2048,k=16",
    "ntk:factor=2+logn",
]

CHILD = r"""
import json, os, resource, statistics, sys, threading, time, torch
from ctxeval.attention.patching import attention_methods, kernel_of
from ctxeval.rope.patching import apply_method
from ctxeval.models.load import load_model
from ctxeval.rope.patching import find_rotary_modules
from ctxeval.specs import expand_specs
model, length, text, decode = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
lm = load_model(model, dtype="auto", device="auto")
spec = expand_specs([text])[0]
rotary = find_rotary_modules(lm.model)[0][1]
ids = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(0)).to(lm.device)
sync = torch.cuda.synchronize if lm.device.startswith("cuda") else (lambda: None)
if lm.device.startswith("cuda"):
    torch.cuda.reset_peak_memory_stats()
steps, generated = [], []
with apply_method(lm.model, spec.name, lm.rope.geometry, **spec.params), \
        attention_methods(lm.model, spec.attention, lambda: rotary.inv_freq, lm.trained_length), torch.inference_mode():
    lm.model.model(input_ids=ids[:, :256])  # warm-up: first-call costs stay out of the timing
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    sampled, done = [rss()], threading.Event()
    def sample():
        while not done.is_set():
            sampled.append(rss())
            time.sleep(0.002)
    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    if not decode:  # the decoder only: the LM head's L x vocab logits are the same for every method
        lm.model.model(input_ids=ids)
    else:
        out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    sync()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    for _ in range(decode):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        generated.append(int(token))
        start = time.perf_counter()
        out = lm.model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        sync()
        steps.append(time.perf_counter() - start)
peak = torch.cuda.max_memory_allocated() if lm.device.startswith("cuda") else max(sampled)
load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
kernel = kernel_of(lm.model, spec.attention) if spec.attention else "model's own"
print(json.dumps({"method": text, "seconds": seconds, "peak_bytes": peak, "load_peak_bytes": load_peak,
                  "device": lm.device, "dtype": lm.dtype,
                  "kernel": kernel, "step_seconds": statistics.median(steps) if steps else None,
                  "generated": generated}))
"""


def run(model: str, length: int, text: str, decode: int = 0) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(length), text, str(decode)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{text}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def forward_report(args: argparse.Namespace, methods: list[str]) -> dict:
    baseline = [run(args.model, args.length, "none")]
    measured = [run(args.model, args.length, m) for m in methods]
    baseline.append(run(args.model, args.length, "none"))
    base_s = statistics.median(b["seconds"] for b in baseline)
    base_mem = statistics.median(b["peak_bytes"] for b in baseline)
    rows = [
        {
            "method": "none (sdpa)",
            "kernel": baseline[0]["kernel"],
            "seconds": [round(b["seconds"], 2) for b in baseline],
            "time_ratio": 1.0,
            "peak_gib": round(base_mem / 2**30, 3),
            "memory_ratio": 1.0,
            "load_peak_gib": [round(b["load_peak_bytes"] / 2**30, 3) for b in baseline],
        }
    ]
    for m in measured:
        rows.append(
            {
                "method": m["method"],
                "kernel": m["kernel"],
                "seconds": [round(m["seconds"], 2)],
                "time_ratio": round(m["seconds"] / base_s, 2),
                "peak_gib": round(m["peak_bytes"] / 2**30, 3),
                "memory_ratio": round(m["peak_bytes"] / base_mem, 2),
                "load_peak_gib": [round(m["load_peak_bytes"] / 2**30, 3)],
            }
        )
    return {
        "model": args.model,
        "length": args.length,
        "device": baseline[0]["device"],
        "dtype": baseline[0]["dtype"],
        "rows": rows,
    }


def decode_report(args: argparse.Namespace, methods: list[str]) -> dict:
    baseline = [run(args.model, args.length, args.baseline, args.decode)]
    measured = [run(args.model, args.length, m, args.decode) for m in methods]
    baseline.append(run(args.model, args.length, args.baseline, args.decode))
    base_step = statistics.median(b["step_seconds"] for b in baseline)
    rows = [
        {
            "method": args.baseline,
            "kernel": baseline[0]["kernel"],
            "prefill_seconds": [round(b["seconds"], 2) for b in baseline],
            "ms_per_token": [round(1000 * b["step_seconds"], 1) for b in baseline],
            "token_ratio": 1.0,
            "generated": baseline[0]["generated"],
        }
    ]
    for m in measured:
        rows.append(
            {
                "method": m["method"],
                "kernel": m["kernel"],
                "prefill_seconds": [round(m["seconds"], 2)],
                "ms_per_token": [round(1000 * m["step_seconds"], 1)],
                "token_ratio": round(m["step_seconds"] / base_step, 2),
                "generated": m["generated"],
            }
        )
    return {
        "model": args.model,
        "length": args.length,
        "decode_tokens": args.decode,
        "device": baseline[0]["device"],
        "dtype": baseline[0]["dtype"],
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--methods", default=";".join(METHODS), help="';'-separated method specs")
    parser.add_argument("--decode", type=int, default=0, help="time N greedy decoding steps after the prompt")
    parser.add_argument("--baseline", default="yarn:factor=2", help="the decoding baseline (a frequency method)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    methods = [m for m in args.methods.split(";") if m and m != "none"]
    report = decode_report(args, methods) if args.decode else forward_report(args, methods)
    what = f"{args.decode} tokens decoded after" if args.decode else "one forward of"
    print(f"{args.model}, {what} {args.length:,} tokens on {report['device']} ({report['dtype']})")
    if args.decode:
        print(f"{'method':<48} {'kernel':>12} {'prefill s':>14} {'ms/token':>12} {'x base':>7}")
        for r in report["rows"]:
            print(
                f"{r['method']:<48} {r['kernel']:>12} {'/'.join(str(s) for s in r['prefill_seconds']):>14} "
                f"{'/'.join(str(s) for s in r['ms_per_token']):>12} {r['token_ratio']:>7}"
            )
    else:
        print(f"{'method':<48} {'kernel':>12} {'seconds':>14} {'x sdpa':>7} {'peak GiB':>9} {'x sdpa':>7}")
        for r in report["rows"]:
            print(
                f"{r['method']:<48} {r['kernel']:>12} {'/'.join(str(s) for s in r['seconds']):>14} "
                f"{r['time_ratio']:>7} {r['peak_gib']:>9} {r['memory_ratio']:>7}"
            )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
