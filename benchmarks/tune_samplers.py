"""How many trials each sampler of `ctxeval tune` needs for the same held-out perplexity.

Runs `ctxeval tune` (the CLI, as a user would) once per sampler and seed on the same search, then follows each run's
best-so-far winner (the lowest tuning objective among the trials so far that kept the guard) and measures every
distinct one on the run's held-out documents (with --objective needle / both, the held-out documents carry pass keys
drawn as the search draws its own). The reference is the best held-out value of any run's final winner; a run
reaches it at the first measured trial whose best-so-far winner is within --within of it on the held-out documents.

    python benchmarks/tune_samplers.py --out results/tune-tiny-samplers \
        [--model tiny] [-m yarn] [--target-length 1k] [--run tpe:200 --run gp:60] [--seeds 0,1,2] [--within 0.01]

Writes OUT/<sampler>-seed<k>/ (each an ordinary tune run directory), OUT/curves.csv (trial, best-so-far tuning and
held-out perplexity), OUT/samplers.md (the table) and OUT/samplers.png (held-out best-so-far by trial).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run_tune(
    out: Path, model: str, method: str, target: str, sampler: str, trials: int, seed: int, objective: str
) -> float:
    """One `ctxeval tune` run (resumed when its directory exists); its wall time in seconds."""
    command = [
        sys.executable, "-m", "ctxeval", "tune", "--model", model, "-m", method, "--target-length", target,
        "--trials", str(trials), "--sampler", sampler, "--seed", str(seed), "--out", str(out),
        "--objective", objective,
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def best_so_far(rows: list[dict]) -> list[tuple[int, dict | None]]:
    """(measured trials so far, the winner among them) after each measured trial, in trial order."""
    out, best, count = [], None, 0
    for row in sorted((r for r in rows if r.get("phase") == "search"), key=lambda r: r["trial"]):
        if row.get("status") != "ok":
            continue
        count += 1
        if row.get("feasible") and (best is None or row["value"] < best["value"]):
            best = row
        out.append((count, best))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("-m", "--method", default="yarn")
    parser.add_argument("--target-length", default="1k")
    parser.add_argument("--run", action="append", help="SAMPLER:TRIALS (repeatable; default tpe:200 and gp:60)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--within", type=float, default=0.01, help="relative distance to the reference held-out ppl")
    parser.add_argument("--objective", default="ppl", help="ppl | needle | both (held out: the same objective)")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctxeval.data.corpora import select_long_documents
    from ctxeval.evals.tune.needles import objective_name, objective_value
    from ctxeval.evals.tune.search import TrialScorer, TuneConfig
    from ctxeval.models.load import load_model
    from ctxeval.specs import MethodSpec

    runs = [(s.split(":")[0], int(s.split(":")[1])) for s in (args.run or ["tpe:200", "gp:60"])]
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    walls = {}
    for sampler, trials in runs:
        for seed in seeds:
            name = f"{sampler}-seed{seed}"
            walls[name] = run_tune(
                args.out / name, args.model, args.method, args.target_length, sampler, trials, seed, args.objective
            )
            print(f"{name}: {trials} trials in {walls[name]:.1f} s", flush=True)

    lm = load_model(args.model)
    first = json.loads((args.out / f"{runs[0][0]}-seed{seeds[0]}" / "run.json").read_text())
    heldout_ids = [d["doc"] for d in first["data"]["documents"] if d["role"] == "heldout"]
    target, short = int(first["spec"]["target"]), int(first["spec"]["short"])
    wanted = len(first["data"]["documents"])
    docs = {d.doc_id: d for d in select_long_documents("pydoc", lm.tokenizer, wanted, target - 1)}
    # the held-out documents scored as the search scores its own (their pass keys drawn from the same seed)
    scorer = TrialScorer(lm, [docs[i] for i in heldout_ids], TuneConfig(target, short, objective=args.objective))
    heldout_ppl: dict[str, float] = {}

    def held(label: str, params: dict) -> float:
        if label not in heldout_ppl:
            score = scorer.score(MethodSpec(first["spec"]["methods"][0].split("(")[0], params))
            heldout_ppl[label] = objective_value(args.objective, score.target_ppl, score.answer_ppl)
        return heldout_ppl[label]

    curves: dict[str, list[tuple[int, float, float]]] = {}
    trial_seconds: dict[str, float] = {}
    for sampler, _ in runs:
        for seed in seeds:
            name = f"{sampler}-seed{seed}"
            rows = [json.loads(x) for x in (args.out / name / "rows.jsonl").read_text().splitlines() if x.strip()]
            # each trial's own time (its forwards and read-back; the sampler's proposal not included), which a
            # resumed run keeps, where the command's wall time would count only what it measured now
            trial_seconds[name] = sum(float(r.get("seconds") or 0) for r in rows)
            curves[name] = [
                (n, b["value"], held(b["label"], b["method_params"])) for n, b in best_so_far(rows) if b is not None
            ]
    what = {"ppl": "perplexity", "needle": "answer perplexity", "both": "√(ppl·answer ppl)"}[args.objective]
    # the reference: the best final held-out value of any run (a run's own winner can generalise badly: the first
    # run's would make the bar as low as its luck)
    reference_name = min(curves, key=lambda name: curves[name][-1][2])
    reference = curves[reference_name][-1][2]
    limit = reference * (1 + args.within)

    with open(args.out / "curves.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "measured_trials", "best_tuning_ppl", "best_heldout_ppl"])
        for name, curve in curves.items():
            writer.writerows([name, n, f"{t:.4f}", f"{h:.4f}"] for n, t, h in curve)

    lines = [
        f"# Trials to the same held-out {what}: {args.method} on {args.model}, target {args.target_length}",
        "",
        f"Objective: {objective_name(args.objective)}. Reference: the best held-out {what} of any run's final winner, "
        f"{reference_name}'s after {curves[reference_name][-1][0]} "
        f"measured trials, {reference:.2f} at {target:,} on {', '.join(heldout_ids)}. A run reaches it at the first "
        f"measured trial (seed points included) whose best-so-far winner (lowest tuning objective among trials that kept "
        f"the guard) is within {args.within:.0%} of it ({limit:.2f}) on those held-out documents.",
        "",
        "| sampler | seed | measured trials | trials to reach | final held-out value | trial time (summed) |",
        "|---|---|---|---|---|---|",
    ]
    reached: dict[str, list[int | None]] = {}
    for sampler, trials in runs:
        for seed in seeds:
            name = f"{sampler}-seed{seed}"
            hit = next((n for n, _, h in curves[name] if h <= limit), None)
            reached.setdefault(sampler, []).append(hit)
            lines.append(
                f"| {sampler} | {seed} | {curves[name][-1][0]} | {hit if hit is not None else f'not in {trials}'} "
                f"| {curves[name][-1][2]:.2f} | {trial_seconds[name]:.0f} s |"
            )
    lines += ["", "Median trials to reach it (a run that never did counts as its budget + 1, shown as >):", ""]
    for sampler, trials in runs:
        hits = [h if h is not None else trials + 1 for h in reached[sampler]]
        med = statistics.median(hits)
        lines.append(f"- {sampler}: {'>' if med > trials else ''}{min(med, trials):g} ({hits})")
    (args.out / "samplers.md").write_text("\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = {"tpe": "#1f77b4", "gp": "#d62728", "cmaes": "#2ca02c", "random": "#7f7f7f", "nsga2": "#9467bd"}
    styles = ["-", "--", ":", "-."]
    for name, curve in curves.items():
        sampler, seed = name.split("-seed")
        ax.step([n for n, _, _ in curve], [h for _, _, h in curve], where="post", color=colors.get(sampler),
                linestyle=styles[seeds.index(int(seed)) % 4], alpha=0.85, label=name)  # fmt: skip
    ax.axhline(limit, color="black", linestyle=":", linewidth=0.8, label=f"reference + {args.within:.0%}")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("measured trials (log)")
    ax.set_ylabel(f"held-out {objective_name(args.objective)} at {target:,}, best-so-far winner")
    ax.set_title(f"tune {args.method} on {args.model}: samplers to the same held-out perplexity")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out / "samplers.png", dpi=120)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    record = {
        "command": ["python", "benchmarks/tune_samplers.py", *sys.argv[1:]],
        "git_commit": commit,
        "reference": {"run": reference_name, "heldout": reference, "within": args.within},
        "runs": {
            name: {"trials_to_reach": next((n for n, _, h in c if h <= limit), None)} for name, c in curves.items()
        },
        "note": "each run's own run.json records its tune command, versions and machine",
    }
    (args.out / "benchmark.json").write_text(json.dumps(record, indent=2) + "\n")
    print((args.out / "samplers.md").read_text())
    print("command wall times this call:", {k: round(v, 1) for k, v in walls.items()})


if __name__ == "__main__":
    main()
