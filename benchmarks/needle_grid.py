"""Benchmark: one needle grid scored by `forced` (one teacher-forced pass, batched per length) and by `generate`
(greedy decoding per cell), in one process on one model. Prints the wall-time ratio generate / forced and the
fraction of samples where both scorings agree on correct / incorrect.

    python benchmarks/needle_grid.py --model smollm2 --haystack austen --lengths 1k,2k --depths 0:100:5
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    from ctxeval.cli.options import parse_depths, parse_lengths
    from ctxeval.data.presets import load_task
    from ctxeval.evals.haystack import NeedlePreset, PromptBuilder, haystack_tokens
    from ctxeval.evals.needle import NeedleConfig, NeedleRunner
    from ctxeval.models.load import load_model
    from ctxeval.rope.patching import apply_method
    from ctxeval.specs import expand_specs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--haystack", default="austen")
    ap.add_argument("--needle", default="magic-number")
    ap.add_argument("--lengths", default="1k,2k")
    ap.add_argument("--depths", default="0:100:5")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--method", default="none")
    ap.add_argument("--batch-size", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    lm = load_model(args.model)
    lengths, depths = parse_lengths(args.lengths), parse_depths(args.depths, "linear")
    preset = NeedlePreset.from_dict(args.needle, load_task(f"needle-{args.needle}", "needle"))
    hay, _ = haystack_tokens(lm.tokenizer, args.haystack, max(lengths))
    builder = PromptBuilder(lm.tokenizer, preset, hay, chat_template=bool(lm.tokenizer.chat_template))
    spec = expand_specs([args.method])[0]
    results, seconds = {}, {}
    with apply_method(lm.model, spec.name, lm.rope.geometry, **spec.params) as handle:
        for scoring in ("forced", "generate"):
            cfg = NeedleConfig(tuple(lengths), tuple(depths), args.samples, scoring, batch_size=args.batch_size)
            runner = NeedleRunner(lm.model, lm.tokenizer, lm.device, builder, cfg, lm.name, "needle")
            rows: list[dict] = []
            start = time.perf_counter()
            runner.measure(spec, cfg.cells(), rows.extend, handle)
            seconds[scoring] = time.perf_counter() - start
            results[scoring] = {(r["length"], r["depth"], r["sample"]): r["correct"] for r in rows}
    keys = sorted(results["forced"])
    agree = float(np.mean([results["forced"][k] == results["generate"][k] for k in keys]))
    summary = {
        "model": args.model,
        "method": spec.label,
        "haystack": args.haystack,
        "needle": args.needle,
        "lengths": lengths,
        "depths": depths,
        "samples": args.samples,
        "cells": len(keys),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "time_ratio_generate_over_forced": round(seconds["generate"] / seconds["forced"], 3),
        "agreement": round(agree, 4),
        "accuracy": {k: round(float(np.mean(list(v.values()))), 4) for k, v in results.items()},
        "disagreements": [
            {
                "length": k[0],
                "depth": k[1],
                "sample": k[2],
                "forced": results["forced"][k],
                "generate": results["generate"][k],
            }
            for k in keys
            if results["forced"][k] != results["generate"][k]
        ],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    main()
