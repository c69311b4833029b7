"""The attention methods on a GPU: Self-Extend, ReRoPE, leaky ReRoPE and log-n against the model's own attention, on
random-weight models built from configs alone (benchmarks/configs/, as benchmarks/gpu.py).

    python benchmarks/gpu_attention.py --config llama-2-7b,llama-3.1-8b --lengths 8k:128k:x2 --out DIR
    python benchmarks/gpu_attention.py --device cpu --dtype float32 --config tiny --lengths 64,128 --out DIR  # the test

Per model, first an exactness check at `--check-length` (default 2k): each method's fast kernel
(ctxeval.attention.kernels.choose_kernel: fused or query-scale) against the exact chunked reference
(CTXEVAL_ATTENTION_KERNEL=chunked), the largest difference of the decoder's last hidden state, in the run's dtype.
Then per length and method: one forward of the decoder (seconds, tokens/s, MFU with the FLOPs of plain causal
attention, 2 N L + 2 n_layers L^2 d_attn as in gpu.py: the methods' useful work; peak memory) and `--new-tokens`
greedy decoding steps after the prompt through the KV cache (median ms per token). Each time is over `--repeats`
runs after a warm-up; ratios are against the baseline (`none`, the model's sdpa or flash-attention 2) measured at the
same length, and decoding against `--decode-baseline` (YaRN). A method stops at its first out-of-memory.
Output: DIR/gpu-attention.json and DIR/gpu-attention.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu import build, flash_installed, forward_flops, hardware, parse_lengths, timed  # noqa: E402

METHODS = [
    "none",
    "yarn:factor=4",
    "self-extend:group_size=8,neighbor_window=1024",
    "rerope:window=1024",
    "leaky-rerope:window=1024,k=16",
    "ntk:factor=4+logn",
]


@contextlib.contextmanager
def applied(model: Any, text: str, kernel: str = "") -> Iterator[None]:
    """The method of `text` on `model` (RoPE in place, attention methods installed) on the kernel asked."""
    from ctxeval.attention.kernels import KERNEL_ENV
    from ctxeval.attention.patching import attention_methods
    from ctxeval.rope.geometry import rope_info_from_config
    from ctxeval.rope.patching import apply_method, find_rotary_modules
    from ctxeval.specs import expand_specs

    spec = expand_specs([text])[0]
    geometry = rope_info_from_config(model.config).geometry
    rotary = find_rotary_modules(model)[0][1]
    before = os.environ.get(KERNEL_ENV)
    os.environ[KERNEL_ENV] = kernel
    try:
        with (
            apply_method(model, spec.name, geometry, **spec.params),
            attention_methods(model, spec.attention, lambda: rotary.inv_freq, geometry.original_length),
        ):
            yield
    finally:
        if before is None:
            os.environ.pop(KERNEL_ENV, None)
        else:
            os.environ[KERNEL_ENV] = before


def kernel_name(model: Any, text: str) -> str:
    from ctxeval.attention.patching import kernel_of
    from ctxeval.specs import expand_specs

    spec = expand_specs([text])[0]
    return kernel_of(model, spec.attention) if spec.attention else "model's own"


def exactness(model: Any, methods: list[str], length: int, device: str) -> dict[str, float]:
    """Per attention method: max |fast - chunked| of the decoder's last hidden state at `length`."""
    import torch

    ids = torch.randint(
        0, model.config.vocab_size, (1, length), device=device, generator=torch.Generator(device=device).manual_seed(1)
    )
    diffs = {}
    for text in methods:
        if kernel_name(model, text) in ("model's own", "chunked"):
            continue
        outputs = []
        for kernel in ("", "chunked"):
            with applied(model, text, kernel), torch.inference_mode():
                outputs.append(model.model(input_ids=ids).last_hidden_state.float())
        diffs[text] = float((outputs[0] - outputs[1]).abs().max())
    return diffs


def decode_ms(model: Any, ids: Any, steps: int, device: str) -> float:
    """Median ms of one greedy decoding step through the KV cache after prefilling `ids`."""
    import torch

    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    times = []
    for _ in range(steps):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(model: Any, text: str, length: int, args: argparse.Namespace, peak: float | None) -> dict[str, Any]:
    import torch

    from ctxeval.evals.common import is_oom

    ids = torch.randint(
        0,
        model.config.vocab_size,
        (1, length),
        device=args.device,
        generator=torch.Generator(device=args.device).manual_seed(length),
    )
    point: dict[str, Any] = {"method": text, "kernel": kernel_name(model, text), "length": length}
    try:
        with applied(model, text), torch.inference_mode():
            seconds, memory = timed(lambda: model.model(input_ids=ids), args.device, args.repeats)
            point.update(
                status="ok",
                seconds=round(seconds, 4),
                tokens_per_s=round(length / seconds, 1),
                peak_gib=round(memory / 2**30, 3),
            )
            if peak:
                point["mfu"] = float(f"{forward_flops(model, length) / seconds / (peak * 1e12):.4g}")
            if args.new_tokens:
                point["decode_ms_per_token"] = round(decode_ms(model, ids, args.new_tokens, args.device), 3)
    except Exception as exc:  # noqa: BLE001 - an OOM ends this method at this length, anything else is a bug
        if not is_oom(exc):
            raise
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        point["status"] = "oom"
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="llama-2-7b,llama-3.1-8b")
    parser.add_argument("--lengths", default="8k:128k:x2")
    parser.add_argument("--methods", default=";".join(METHODS), help="';'-separated specs; the first is the baseline")
    parser.add_argument("--decode-baseline", default="yarn:factor=4")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--attn",
        default="sdpa",
        help="sdpa | eager: the implementations the remapping methods replace (the baseline runs the same one)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--check-length", type=int, default=2048)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch

    dtype, gpu, peak = hardware(args.device, args.dtype, args.peak_tflops)
    methods = [m for m in args.methods.split(";") if m]
    attn = args.attn
    report: dict[str, Any] = {
        "device": args.device,
        "gpu": gpu,
        "dtype": args.dtype,
        "peak_tflops": peak,
        "torch": torch.__version__,
        "flash_attn_installed": flash_installed(),
        "models": [],
    }
    for name in args.config.split(","):
        model = build(name, args.device, dtype, attn)
        entry = {
            "config": name,
            "attn": attn,
            "exactness": exactness(model, methods, args.check_length, args.device),
            "points": [],
        }
        print(json.dumps({"config": name, "exactness": entry["exactness"]}), flush=True)
        stopped: set[str] = set()
        for length in parse_lengths(args.lengths):
            points = {t: measure(model, t, length, args, peak) for t in methods if t not in stopped}
            base, decode_base = points.get(methods[0]), points.get(args.decode_baseline)
            for text, point in points.items():
                if point["status"] != "ok":
                    stopped.add(text)
                    continue
                if base and base["status"] == "ok":
                    point["time_ratio"] = round(point["seconds"] / base["seconds"], 3)
                    point["memory_ratio"] = round(point["peak_gib"] / base["peak_gib"], 3)
                if decode_base and decode_base["status"] == "ok" and "decode_ms_per_token" in point:
                    point["decode_ratio"] = round(point["decode_ms_per_token"] / decode_base["decode_ms_per_token"], 3)
                print(json.dumps({"config": name, **point}), flush=True)
            entry["points"].extend(points.values())
        report["models"].append(entry)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-attention.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# ctxeval attention methods: {gpu or args.device}, {args.dtype}\n",
        "| model | length | method | kernel | s | x none | tokens/s | MFU | peak GiB | x none | ms/token | x yarn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["models"]:
        for p in entry["points"]:
            if p["status"] != "ok":
                lines.append(
                    f"| {entry['config']} | {p['length']} | {p['method']} | {p['kernel']} | {p['status']} "
                    "| | | | | | | |"
                )
                continue
            mfu = f"{p['mfu']:.1%}" if "mfu" in p else "—"
            lines.append(
                f"| {entry['config']} | {p['length']} | {p['method']} | {p['kernel']} | {p['seconds']} | "
                f"{p.get('time_ratio', '—')} | {p['tokens_per_s']:,.0f} | {mfu} | {p['peak_gib']} | "
                f"{p.get('memory_ratio', '—')} | {p.get('decode_ms_per_token', '—')} | "
                f"{p.get('decode_ratio', '—')} |"
            )
        lines.append("")
        lines.append(
            f"{entry['config']}: fast kernel vs the chunked reference at {args.check_length} tokens "
            f"(max abs diff of the last hidden state): "
            + ", ".join(f"{k} {v:.2e}" for k, v in entry["exactness"].items())
        )
        lines.append("")
    (args.out / "gpu-attention.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
