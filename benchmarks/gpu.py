"""How close ctxeval's forwards come to the hardware: random-weight models built from configs alone (no hub access).

    python benchmarks/gpu.py --config llama-2-7b,llama-3.1-8b,qwen2.5-7b --lengths 4k:128k:x2 --out DIR
    python benchmarks/gpu.py --device cpu --config tiny --lengths 64,128 --out DIR      # the CPU test runs this

For each model and length (stopping at the first out-of-memory): one ctxeval ppl forward (body + chunked LM head +
loss, `perplexity.token_nll`), the naive `model(ids, labels=ids)` (full [L x vocab] logits), a needle cell scored
forced (one forward over prompt + answer, the batch size 1 path) and generated (prefill + `--new-tokens` greedy
steps). Random token ids of the model's vocabulary: perplexities are meaningless, speed and memory are not.

Reported per point: seconds (median of `--repeats`, after one warm-up), tokens/s, model FLOP utilisation (MFU) =
FLOPs / seconds / peak FLOP/s, with FLOPs of a forward = 2 x N x L (N = parameters without the embedding table,
L = tokens) + 2 x n_layers x L^2 x d_attn (causal attention: QK^T and AV over the L(L+1)/2 visible pairs, 2 FLOPs per
multiply-add, d_attn = heads x head_dim); peak memory (torch.cuda.max_memory_allocated; the process's resident
high-water mark on a CPU); the attention kernel torch ran (from the profiler's kernel names of one short forward);
and the ratio ctxeval / naive. Peak FLOP/s: `--peak-tflops` (default: 989 for an H100/H200 in dense bf16, else
none, and MFU is left out). Output: DIR/gpu-benchmark.json and DIR/gpu-benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16 tensor-core peaks


def hardware(device: str, dtype: str, peak_tflops: float | None) -> tuple[Any, str | None, float | None]:
    """The torch dtype, the GPU's name (None on CPU) and its peak TFLOP/s (given, or known by name, else None)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return (
        getattr(torch, dtype),
        gpu,
        peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if gpu and k in gpu), None),
    )


def flash_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def parse_lengths(text: str) -> list[int]:
    from ctxeval.cli.options import parse_lengths as parse

    return parse(text)


def build(name: str, device: str, dtype: Any, attn: str) -> Any:
    """A random-weight model from a config file in benchmarks/configs/ (or the tiny test config)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(TINY_CONFIG) if name == "tiny" else json.loads((HERE / "configs" / f"{name}.json").read_text())
    values.pop("_note", None)
    values.pop("architectures", None)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation=attn)
    return model.eval()


def forward_flops(model: Any, length: int) -> float:
    cfg = model.config.get_text_config()
    params = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d_attn = cfg.num_attention_heads * head_dim
    return 2.0 * params * length + 2.0 * cfg.num_hidden_layers * length * length * d_attn


def attention_kernel(model: Any, device: str) -> str:
    """Which attention kernel torch runs for this model (from the profiler's event names of a short forward)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, model.config.vocab_size, (1, 256), device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        model.model(input_ids=ids)
    names = {e.key for e in prof.key_averages()}
    for needle, kernel in (
        ("flash", "flash"),
        ("efficient_attention", "mem-efficient"),
        ("cudnn", "cudnn"),
        ("_scaled_dot_product_attention_math", "math"),
        ("scaled_dot_product", "sdpa (math on CPU)"),
    ):
        if any(needle in n.lower() for n in names):
            return kernel
    return "unknown"


def timed(fn: Any, device: str, repeats: int) -> tuple[float, int]:
    """Median seconds over `repeats` runs after a warm-up, and the peak memory of those runs (bytes)."""
    import torch

    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = (
        torch.cuda.max_memory_allocated()
        if device.startswith("cuda")
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return statistics.median(times), peak


def forced(model: Any, ids: Any, answer_tokens: int) -> Any:
    """A forced needle cell as ctxeval scores it: the body over prompt + answer, the LM head on the answer only."""
    body, head, post = head_parts(model)
    hidden = body(input_ids=ids, use_cache=False).last_hidden_state  # (1, L, hidden)
    return post(head(hidden[:, -answer_tokens - 1 : -1]).float()).argmax(-1)


def head_parts(model: Any) -> Any:
    from ctxeval.evals.common import head_parts as parts

    return parts(model)


def measure(model: Any, length: int, device: str, repeats: int, new_tokens: int, chunk: int) -> dict[str, Any]:
    import torch

    from ctxeval.evals.common import is_oom
    from ctxeval.evals.perplexity import token_nll

    ids = torch.randint(
        0,
        model.config.vocab_size,
        (1, length),
        device=device,
        generator=torch.Generator(device=device).manual_seed(length),
    )
    prompt = ids[:, : length - new_tokens]
    paths = {
        "ctxeval ppl (chunked loss)": lambda: token_nll(model, ids, chunk),
        "naive model(ids, labels=ids)": lambda: model(input_ids=ids, labels=ids, use_cache=False).loss.item(),
        "needle forced (one forward)": lambda: forced(model, ids, new_tokens),
        f"needle generated (prefill + {new_tokens} steps)": lambda: model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        ),
    }
    out = {"length": length, "paths": {}}
    for name, fn in paths.items():
        try:
            with torch.inference_mode():
                seconds, peak = timed(fn, device, repeats)
        except Exception as exc:  # noqa: BLE001 - an OOM ends this path at this length, anything else is a bug
            if not is_oom(exc):
                raise
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            out["paths"][name] = {"status": "oom"}
            continue
        out["paths"][name] = {
            "status": "ok",
            "seconds": round(seconds, 4),
            "tokens_per_s": round(length / seconds, 1),
            "peak_gib": round(peak / 2**30, 3),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="llama-2-7b,llama-3.1-8b,qwen2.5-7b")
    parser.add_argument("--lengths", default="4k:128k:x2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--attn",
        default="auto",
        help="sdpa | flash_attention_2 | auto (sdpa, and flash-attention 2 when it is installed)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per point after one warm-up (median)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch

    dtype, gpu, peak = hardware(args.device, args.dtype, args.peak_tflops)
    report: dict[str, Any] = {
        "device": args.device,
        "gpu": gpu,
        "dtype": args.dtype,
        "peak_tflops": peak,
        "torch": torch.__version__,
        "models": [],
    }
    attns = [args.attn] if args.attn != "auto" else ["sdpa"] + (["flash_attention_2"] if flash_installed() else [])
    for name, attn in ((n, a) for n in args.config.split(",") for a in attns):
        model = build(name, args.device, dtype, attn)
        entry = {
            "config": name,
            "attn": attn,
            "parameters": sum(p.numel() for p in model.parameters()),
            "attention_kernel": attention_kernel(model, args.device),
            "lengths": [],
        }
        for length in parse_lengths(args.lengths):
            point = measure(model, length, args.device, args.repeats, args.new_tokens, args.chunk_size)
            flops = forward_flops(model, length)
            point["forward_tflops"] = float(f"{flops / 1e12:.4g}")
            for path in point["paths"].values():
                if path["status"] == "ok" and peak:
                    path["mfu"] = float(f"{flops / path['seconds'] / (peak * 1e12):.4g}")
            ours, naive = (point["paths"][k] for k in ("ctxeval ppl (chunked loss)", "naive model(ids, labels=ids)"))
            if ours["status"] == naive["status"] == "ok":
                point["ctxeval_over_naive_time"] = round(ours["seconds"] / naive["seconds"], 3)
                point["ctxeval_over_naive_memory"] = round(ours["peak_gib"] / naive["peak_gib"], 3)
            entry["lengths"].append(point)
            print(json.dumps({"config": name, **point}), flush=True)
            if ours["status"] == "oom":
                break
        report["models"].append(entry)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-benchmark.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# ctxeval forward benchmark: {gpu or args.device}, {args.dtype}\n",
        "| model | attn (kernel) | length | path | s | tokens/s | MFU | peak GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["models"]:
        for point in entry["lengths"]:
            for path, r in point["paths"].items():
                if r["status"] != "ok":
                    lines.append(
                        f"| {entry['config']} | {entry['attn']} ({entry['attention_kernel']}) | {point['length']} "
                        f"| {path} | {r['status']} | | | |"
                    )
                    continue
                mfu = f"{r['mfu']:.1%}" if "mfu" in r else "—"
                lines.append(
                    f"| {entry['config']} | {entry['attn']} ({entry['attention_kernel']}) | {point['length']} "
                    f"| {path} | {r['seconds']} | {r['tokens_per_s']:,.0f} | {mfu} | {r['peak_gib']} |"
                )
    (args.out / "gpu-benchmark.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
