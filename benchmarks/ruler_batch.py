"""Batched RULER generation against one prompt at a time: the time ratio and whether the predictions agree.

    python benchmarks/ruler_batch.py [--model smollm2] [--task niah_single_1] [--length 1024] [--samples 8]
                                     [--batch-sizes 1,4,8] [--out benchmarks/results/ruler_batch-cpu-smollm2.json]

Both runs generate the same RULER prompts greedily with the task's budget through RulerRunner.predict (left padding
for batches). Medians of --repeats runs; the first batch size is the baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ctxeval.evals.ruler.generate import generate
from ctxeval.evals.ruler.run import RulerRunner
from ctxeval.evals.ruler.sources import Sources
from ctxeval.evals.ruler.tasks import FAMILIES, TASKS
from ctxeval.models.load import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="niah_single_1")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lm = load_model(args.model, device="cpu")
    samples = generate(args.task, args.length, args.samples, lm.tokenizer, Sources())
    budget = FAMILIES[TASKS[args.task].family].tokens_to_generate
    runner = RulerRunner(lm.model, lm.tokenizer, lm.device, lm.name)
    results = {}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        times, predictions = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            predictions = [
                p
                for i in range(0, len(samples), batch)
                for p in runner.predict([s.prompt for s in samples[i : i + batch]], budget)[0]
            ]
            times.append(time.perf_counter() - start)
        results[batch] = {"seconds": statistics.median(times), "predictions": predictions}
    base = next(iter(results.values()))
    report = {
        "model": args.model,
        "task": args.task,
        "length": args.length,
        "samples": args.samples,
        "tokens_to_generate": budget,
        "rows": [],
    }
    for batch, r in results.items():
        same = sum(a == b for a, b in zip(r["predictions"], base["predictions"]))
        row = {
            "batch_size": batch,
            "seconds": round(r["seconds"], 2),
            "speedup": round(base["seconds"] / r["seconds"], 2),
            "same_predictions": f"{same}/{len(samples)}",
        }
        report["rows"].append(row)
        print(row, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
