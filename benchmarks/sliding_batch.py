"""Sliding-window perplexity with B windows per forward vs one: time ratio and the numbers (which must agree).

    python benchmarks/sliding_batch.py [--model smollm2] [--length 1024] [--stride 256] [--doc-tokens 8192]
                                       [--batches 1,4,8] [--repeats 3] [--out FILE.json]

One document of the Austen corpus (the first with enough tokens), the same windows at every batch size; each batch
size is timed `repeats` times in alternation with the others (so that drift on a shared machine spreads over all of
them) and the median is reported; ratios are against batch size 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="austen")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--doc-tokens", type=int, default=8192)
    parser.add_argument("--batches", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from ctxeval.data.corpora import TokenDoc, select_long_documents
    from ctxeval.evals.perplexity import PplConfig, PplRunner
    from ctxeval.models.load import load_model
    from ctxeval.specs import expand_specs

    lm = load_model(args.model, dtype="auto", device="auto")
    doc = select_long_documents(args.data, lm.tokenizer, 1, args.doc_tokens)[0]
    doc = TokenDoc(doc.doc_id, doc.ids[: args.doc_tokens])
    spec = expand_specs(["none"])[0]
    batches = [int(b) for b in args.batches.split(",")]
    seconds: dict[int, list[float]] = {b: [] for b in batches}
    rows: dict[int, dict] = {}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for b in batches:
                cfg = PplConfig((args.length,), "sliding", stride=args.stride, batch_size=b)
                runner = PplRunner(lm.model, lm.device, cfg, lm.tokenizer.bos_token_id, lm.name)
                start = time.perf_counter()
                rows[b] = runner._sliding_at(spec, doc, args.length)
                seconds[b].append(time.perf_counter() - start)
    base = statistics.median(seconds[1]) if 1 in seconds else None
    report = {
        "model": args.model,
        "device": lm.device,
        "dtype": lm.dtype,
        "length": args.length,
        "stride": args.stride,
        "document": doc.doc_id,
        "doc_tokens": len(doc.ids),
        "windows": rows[batches[0]]["n_windows"],
        "repeats": args.repeats,
        "rows": [
            {
                "batch_size": b,
                "seconds": [round(s, 2) for s in seconds[b]],
                "median_s": round(statistics.median(seconds[b]), 2),
                "time_ratio": round(statistics.median(seconds[b]) / base, 3) if base else None,
                "ppl": rows[b]["ppl"],
                "nll_sum": rows[b]["nll_sum"],
                "n_tokens": rows[b]["n_tokens"],
            }
            for b in batches
        ],
    }
    print(
        f"{args.model} on {lm.device} ({lm.dtype}): sliding L={args.length} S={args.stride}, "
        f"{report['windows']} windows over {len(doc.ids):,} tokens, median of {args.repeats}"
    )
    print(f"{'batch':>5} {'median s':>9} {'x B=1':>6} {'ppl':>12} {'nll_sum':>16}")
    for r in report["rows"]:
        print(f"{r['batch_size']:>5} {r['median_s']:>9} {r['time_ratio']:>6} {r['ppl']:>12.6f} {r['nll_sum']:>16.6f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
