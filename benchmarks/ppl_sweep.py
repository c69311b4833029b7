"""Benchmark: ctxeval's one-forward chunked-loss perplexity vs. a naive per-length `model(ids, labels=ids)` loop.

Same model, same document, same lengths, one process. Prints the wall-time ratio (naive / ctxeval, medians over
--repeats), the peak-memory ratio (CPU: peak RSS growth over the phase's start, sampled every 5 ms; CUDA: max
allocated) and the largest relative ppl difference between the two paths, next to sum(lengths) / max(lengths),
the ratio the one-forward trick should approach when the forward dominates.

    python benchmarks/ppl_sweep.py --model smollm2 --data austen --lengths 512,1k,2k,4k
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time

import torch


class PeakMemory:
    """Peak memory growth during a block: CUDA max allocated, or CPU RSS sampled by a thread."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def __enter__(self) -> "PeakMemory":
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            import psutil

            self.proc = psutil.Process()
            self.base = self.proc.memory_info().rss
            self.stop = threading.Event()
            self.samples = [self.base]

            def sample() -> None:
                while not self.stop.is_set():
                    self.samples.append(self.proc.memory_info().rss)
                    time.sleep(0.005)

            self.thread = threading.Thread(target=sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.samples) - self.base


def main() -> None:
    from ctxeval.cli.options import parse_lengths
    from ctxeval.data.corpora import select_long_documents
    from ctxeval.evals.perplexity import PplConfig, PplRunner
    from ctxeval.models.load import load_model
    from ctxeval.specs import expand_specs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default="austen")
    ap.add_argument("--lengths", default="512,1k,2k,4k")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    lengths = parse_lengths(args.lengths)
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    doc = select_long_documents(args.data, lm.tokenizer, 1, max(lengths) - 1)[0]
    bos = lm.tokenizer.bos_token_id
    spec = expand_specs(["none"])[0]
    runner = PplRunner(lm.model, lm.device, PplConfig(tuple(lengths), chunk_size=args.chunk_size), bos, lm.name)

    def ctxeval_path() -> dict[int, float]:
        rows: list[dict] = []
        runner.measure(spec, doc, list(lengths), rows.extend)
        return {r["length"]: r["ppl"] for r in rows}

    @torch.inference_mode()
    def naive_path() -> dict[int, float]:
        out = {}
        for length in lengths:
            ids = torch.tensor([[bos] + doc.ids[: length - 1].tolist()], device=lm.device)
            out[length] = math.exp(float(lm.model(input_ids=ids, labels=ids, use_cache=False).loss))
        return out

    def sync() -> None:
        if lm.device.startswith("cuda"):
            torch.cuda.synchronize()

    results = {"ctxeval": {"seconds": [], "peak": []}, "naive": {"seconds": [], "peak": []}}
    ppls = {}
    ctxeval_path(), naive_path()  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        for name, fn in (("naive", naive_path), ("ctxeval", ctxeval_path)):
            with PeakMemory(lm.device) as mem:
                start = time.perf_counter()
                ppls[name] = fn()
                sync()
                results[name]["seconds"].append(time.perf_counter() - start)
            results[name]["peak"].append(mem.peak)

    med = {k: {m: statistics.median(v[m]) for m in v} for k, v in results.items()}
    rel = max(abs(ppls["ctxeval"][L] - ppls["naive"][L]) / ppls["naive"][L] for L in lengths)
    summary = {
        "model": args.model,
        "device": lm.device,
        "dtype": lm.dtype,
        "document": doc.doc_id,
        "lengths": lengths,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "median_seconds": {k: round(v["seconds"], 3) for k, v in med.items()},
        "median_peak_mib": {k: round(v["peak"] / 2**20, 1) for k, v in med.items()},
        "time_ratio_naive_over_ctxeval": round(med["naive"]["seconds"] / med["ctxeval"]["seconds"], 3),
        "memory_ratio_naive_over_ctxeval": round(med["naive"]["peak"] / max(med["ctxeval"]["peak"], 1), 3),
        "sum_over_max_lengths": round(sum(lengths) / max(lengths), 3),
        "max_rel_ppl_diff": rel,
        "ppl": {k: {str(L): round(v[L], 4) for L in lengths} for k, v in ppls.items()},
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
