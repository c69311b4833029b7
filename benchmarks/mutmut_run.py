"""mutmut (3.8, from PyPI) over one group of ctxeval's core modules, in a scratch tree of a given commit.

    python benchmarks/mutmut_run.py GROUP [--commit REV] [--max-children N] [--out FILE]

GROUP is one of GROUPS below: the modules mutated and the test files run against them (mutmut runs, for each
mutant, only the selected tests that called the mutated function); ONLY narrows a group to some of its functions. The scratch tree is `git archive REV` (default
HEAD) in a temporary folder, so a commit before a test was written can be measured with the same command. Torch runs
with one thread (OMP_NUM_THREADS=1): mutmut forks its workers after torch is imported, and an OpenMP pool inherited
through fork hangs, which mutmut would report as a timeout. Every mutant mutmut reports as timeout, suspicious or
segfault is run again here directly (the same tests, MUTANT_UNDER_TEST set, a wall limit of 10x the clean run's
time plus 60 s), so the summary tells a mutant that hangs from one that fails or passes. The summary (counts, and
each survivor's diff) is written as JSON to --out (default benchmarks/results/mutmut-GROUP-REV.json).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESUME = "tests/test_resume_and_rollback.py"
# issue 27's behaviour tests, in the files of the modules they test
ROUND2 = ["tests/cli/test_ruler.py", "tests/report/test_tables.py", "tests/evals/test_perplexity.py"]
# the console script, not `python -m mutmut`: -m would put the scratch tree (the unmutated ctxeval) first on sys.path
MUTMUT = str(Path(sys.executable).parent / "mutmut")
GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "store": (
        ["ctxeval/runs/store.py", "ctxeval/runs/rows.py"],
        ["tests/runs/test_store.py", "tests/runs/test_rows.py", "tests/runs/test_lock.py", RESUME],
    ),
    "patching": (
        ["ctxeval/rope/patching.py"],
        ["tests/rope/test_patching.py", "tests/attention/test_patching.py", "tests/gpu/test_readiness.py", RESUME],
    ),
    "methods": (["ctxeval/rope/methods.py"], ["tests/rope/test_methods.py", "tests/rope/test_patching.py", RESUME]),
    "perplexity": (
        ["ctxeval/evals/perplexity.py"],
        [
            "tests/evals/test_perplexity.py",
            "tests/gpu/test_readiness.py",
            "tests/evals/test_positions.py",
            "tests/evals/test_key_tokens.py",
            "tests/report/test_tables.py",
            "tests/cli/test_ppl.py",
            RESUME,
        ],
    ),
    "needle": (
        ["ctxeval/evals/needle.py", "ctxeval/evals/haystack.py"],
        [
            "tests/data/test_presets.py",
            "tests/evals/test_needle.py",
            "tests/evals/test_needle_runner.py",
            "tests/cli/test_options.py",
            "tests/cli/test_needle.py",
            "tests/models/test_generation.py",
            "tests/gpu/test_readiness.py",
            RESUME,
        ],
    ),
    # issue 27: the modules added since
    "ruler": (
        [
            f"ctxeval/evals/{m}.py"
            for m in ("ruler", "ruler_tasks", "ruler_sources", "ruler_niah", "ruler_vt", "ruler_words", "ruler_qa")
        ],
        ["tests/evals/ruler/test_generate.py", "tests/conformance/test_ruler_yarn.py", *ROUND2],
    ),
    "ruler_eval": (
        ["ctxeval/evals/ruler/run.py"],
        ["tests/cli/test_ruler.py", "tests/evals/ruler/test_generate.py", *ROUND2, RESUME],
    ),
    "attention": (
        ["ctxeval/attention/methods.py"],
        ["tests/attention/test_methods.py", "tests/conformance/test_attention.py"],
    ),
    "key_tokens": (
        ["ctxeval/evals/key_tokens.py"],
        [
            "tests/evals/test_positions.py",
            "tests/evals/test_key_tokens.py",
            "tests/report/test_tables.py",
            "tests/cli/test_ppl.py",
            "tests/conformance/test_longppl_original.py",
            *ROUND2,
        ],
    ),
    "positions": (
        ["ctxeval/evals/positions.py"],
        [
            "tests/evals/test_positions.py",
            "tests/evals/test_key_tokens.py",
            "tests/report/test_tables.py",
            "tests/cli/test_ppl.py",
            "tests/evals/test_perplexity.py",
            *ROUND2,
        ],
    ),
    "entropy": (["ctxeval/evals/entropy.py"], ["tests/evals/test_entropy.py"]),
    "tables": (
        ["ctxeval/report/tables.py"],
        [
            "tests/report/test_tables.py",
            "tests/runs/test_store.py",
            "tests/report/test_merged.py",
            "tests/evals/test_passkey.py",
            *ROUND2,
        ],
    ),
    "runs": (
        ["ctxeval/report/runs.py"],
        [
            "tests/report/test_merged.py",
            "tests/report/test_tables.py",
            "tests/runs/test_store.py",
            "tests/report/test_html.py",
        ],
    ),
    "sweep": (
        ["ctxeval/evals/sweep.py"],
        [
            "tests/evals/test_perplexity.py",
            "tests/data/test_presets.py",
            "tests/evals/test_needle.py",
            "tests/evals/test_needle_runner.py",
            "tests/cli/test_options.py",
            "tests/cli/test_needle.py",
            "tests/models/test_generation.py",
            "tests/cli/test_ruler.py",
            RESUME,
        ],
    ),
}
# groups measured on part of their module: the functions that turn a forward into the numbers a row holds (fnmatch
# patterns over mutmut's mutant names; the sweep, scheduling and config code of perplexity.py is left out for time)
ONLY: dict[str, list[str]] = {
    "perplexity": [
        f"ctxeval.evals.perplexity.{name}*"
        for name in (
            "x_token_nll",
            "x_batch_token_nll",
            "x__sequence",
            "xǁPplRunnerǁ_nll",
            "xǁPplRunnerǁ_ok",
            "xǁPplRunnerǁ_by_position",
            "xǁPplRunnerǁ_truncate",
            "xǁPplRunnerǁ_rows_from_nll",
            "xǁPplRunnerǁ_sliding",
            "xǁPplRunnerǁ_window_nlls",
        )
    ],
}
# issue 27's tests written against each group's survivors join its selection
for _group in ("positions", "key_tokens", "entropy", "attention"):
    GROUPS[_group][1].extend(
        [
            "tests/evals/test_positions.py",
            "tests/evals/test_key_tokens.py",
            "tests/evals/test_entropy.py",
            "tests/attention/test_methods.py",
        ]
    )
for _group in ("sweep", "tables", "ruler_eval", "runs", "ruler"):
    GROUPS[_group][1].extend(
        [
            "tests/evals/test_sweep.py",
            "tests/report/test_tables.py",
            "tests/evals/ruler/test_run.py",
            "tests/report/test_runs.py",
            "tests/evals/ruler/test_generate.py",
            "tests/evals/ruler/test_tasks.py",
        ]
    )
# the second pass's tests (the rest of tables, runs, ruler_eval and RULER's generators)
for _group in ("tables", "runs", "ruler_eval", "ruler"):
    GROUPS[_group][1].extend(
        [
            "tests/report/test_runs.py",
            "tests/report/test_tables.py",
            "tests/evals/ruler/test_run.py",
            "tests/evals/ruler/test_generate.py",
            "tests/evals/ruler/test_words.py",
        ]
    )
# issue 27's groups measured on part of their modules (a run per group had to fit in about 15 minutes on one child)
ONLY.update(
    {
        "tables": [
            f"ctxeval.report.tables.{name}__mutmut_*"
            for name in (
                "x_latest_rows",
                "x_valid_lengths",
                "x_effective_length",
                "x_yarn_passkey_figures",
                "x_ruler_effective_length",
            )
        ],
        "ruler_eval": [
            f"ctxeval.evals.ruler.run.{name}__mutmut_*"
            for name in ("xǁRulerConfigǁ__post_init__", "x_sample_problem", "x_sweep")
        ],
        "runs": [
            f"ctxeval.report.runs.{name}__mutmut_*" for name in ("x_merge_rows", "x_row_order", "x_display_models")
        ],
        "ruler": [f"ctxeval.evals.ruler.generate.{name}__mutmut_*" for name in ("x__upper", "x_postprocess", "x_score")]
        + [
            f"ctxeval.evals.ruler.tasks.{name}__mutmut_*"
            for name in ("xǁRulerSampleǁrecord", "x_check_template", "x_task_template", "x_split_prefix")
        ],
    }
)
# the rest of issue 27's partial groups, measured after the first pass: RULER's generators (its qa and source
# readers, whose outputs the parity tests pin, left out for time) and the rest of its runner
GROUPS["ruler_gen"] = (
    GROUPS["ruler"][0],
    [
        *GROUPS["ruler"][1],
        "tests/evals/ruler/test_vt.py",
        "tests/evals/ruler/test_words.py",
        "tests/evals/test_passkey.py",
        "tests/evals/ruler/test_generate.py",
    ],
)
ONLY["ruler_gen"] = [
    f"ctxeval.evals.ruler.generate.{name}__mutmut_*" for name in ("x_generate", "x__vt_example", "x__fwe_samples")
] + [f"ctxeval.evals.ruler_{module}.*" for module in ("niah", "vt", "words")]
# without cli/test_ruler.py, whose every test generates with the tiny model (about 40 s a surviving mutant): a mutant
# only it would kill counts as a survivor here
GROUPS["ruler_eval_rest"] = (
    GROUPS["ruler_eval"][0],
    [t for t in GROUPS["ruler_eval"][1] if t != "tests/cli/test_ruler.py"]
    + [
        "tests/evals/ruler/test_vt.py",
        "tests/evals/ruler/test_words.py",
        "tests/evals/test_passkey.py",
        "tests/evals/ruler/test_generate.py",
    ],
)
ONLY["ruler_eval_rest"] = [
    f"ctxeval.evals.ruler.run.{name}__mutmut_*"
    for name in (
        "x_samples_path",
        "x_read_samples",
        "x_write_samples",
        "x_prepare",
        "xǁRulerRunnerǁ__init__",
        "xǁRulerRunnerǁpredict",
        "xǁRulerRunnerǁmeasure",
    )
]
# report functions only the single-run report calls (no test of the tables group's selection reaches them), against
# the second pass's tests written for them
GROUPS["tables_single"] = (
    GROUPS["tables"][0],
    [
        "tests/report/test_runs.py",
        "tests/report/test_tables.py",
        "tests/evals/ruler/test_run.py",
        "tests/evals/ruler/test_generate.py",
        "tests/evals/ruler/test_words.py",
    ],
)
ONLY["tables_single"] = [f"ctxeval.report.tables.{name}__mutmut_*" for name in ("x_entropy_tables", "x_valid_cells")]
if os.environ.get("RULER_SEARCH_ONLY"):  # the size search alone (its mutants hang without the bound)
    ONLY["ruler"] = ["ctxeval.evals.ruler.generate.x__search__mutmut_*"]
SPINNER = re.compile(r"^\W*(Generating mutants|Running stats|Listing all tests|Running clean tests)")
# mutmut's own reading of a worker's exit code (mutmut/stats.py), for the statuses it reports
STATUS = {
    0: "survived",
    1: "killed",
    3: "killed",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
    None: "not checked",
}


def scratch_tree(commit: str, dest: Path, *paths: str) -> list[str]:
    archive = subprocess.run(["git", "archive", commit, *paths], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return [
        line
        for line in subprocess.run(
            ["git", "rev-parse", "--short", commit], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    ]


def write_config(tree: Path, modules: list[str], tests: list[str]) -> None:
    lines = [
        "[mutmut]",
        "source_paths = ctxeval/",
        "only_mutate =",
        *(f"    {m}" for m in modules),
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in tests),
        "also_copy =",
        "    tasks/",
    ]
    (tree / "setup.cfg").write_text("\n".join(lines) + "\n")


def exit_codes(tree: Path) -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in (tree / "mutants").rglob("*.py.meta"):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def rerun_directly(tree: Path, env: dict, mutant: str, limit_s: float) -> str:
    tests = subprocess.run(
        [MUTMUT, "tests-for-mutant", mutant], cwd=tree, env=env, capture_output=True, text=True
    ).stdout.splitlines()
    tests = [t.strip() for t in tests if "::" in t]  # one per line: parametrised ids may hold spaces
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "", *tests],
            cwd=tree / "mutants",
            env={**env, "MUTANT_UNDER_TEST": mutant},
            capture_output=True,
            text=True,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        return "hangs"
    return {0: "survived", 1: "killed"}.get(result.returncode, f"exit {result.returncode}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("group", choices=sorted(GROUPS))
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="use this folder for the scratch tree and keep it")
    parser.add_argument(
        "--recheck-limit",
        type=float,
        default=120.0,
        help="seconds a mutant mutmut reports as timed out may run when rechecked directly",
    )
    parser.add_argument(
        "--whole", action="store_true", help="mutate the group's whole modules, ignoring ONLY's narrowing"
    )
    parser.add_argument(
        "--summarise",
        action="store_true",
        help="with --keep of an earlier run: only recheck its timeouts and write the summary",
    )
    parser.add_argument(
        "--retest",
        action="store_true",
        help="with --keep of an earlier run: take the tests of --commit and run only the mutants that "
        "survived there (a mutant killed stays killed when tests are only added)",
    )
    parser.add_argument(
        "--earlier",
        type=Path,
        action="append",
        default=[],
        help="with --retest: a summary of an earlier pass over the same tree; a mutant it does not list "
        "as a survivor was killed there and stays killed (a chain of retests)",
    )
    parser.add_argument(
        "--also-test",
        action="append",
        default=[],
        help="with --new-tests-only: a test file of the group's selection that gained tests (repeatable)",
    )
    parser.add_argument(
        "--new-tests-only",
        action="store_true",
        help="with --retest, run the survivors against the --also-test files only (they survived every "
        "other selected test, which did not change); the round-2 files it once named are dissolved into the "
        "module test files (issue 38), so name those with --also-test",
    )
    args = parser.parse_args()
    modules, tests = GROUPS[args.group]
    if args.whole:
        ONLY.pop(args.group, None)
    with tempfile.TemporaryDirectory() as tmp:
        tree = args.keep or Path(tmp) / "tree"
        if args.summarise:
            if args.keep is None or not (tree / "mutants").is_dir():
                parser.error("--summarise needs --keep DIR of an earlier run")
            short = subprocess.run(
                ["git", "rev-parse", "--short", args.commit], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        elif args.retest:
            if args.keep is None or not (tree / "mutants").is_dir():
                parser.error("--retest needs --keep DIR of an earlier run")
            before_codes = exit_codes(tree)
            only_ = ONLY.get(args.group, [])
            survivors_before = [
                name
                for name, code in before_codes.items()
                if code in (0, 5, 33) and (not only_ or any(fnmatch.fnmatch(name, p) for p in only_))
            ]
            for dest in (tree, tree / "mutants"):
                shutil.rmtree(dest / "tests")
                (short,) = scratch_tree(args.commit, dest, "tests")
            tests = [t for t in tests if (tree / t).exists()]
            if args.new_tests_only:
                tests = [t for t in tests if t in args.also_test]
            write_config(tree, modules, tests)
            shutil.copy(tree / "setup.cfg", tree / "mutants" / "setup.cfg")
        else:
            tree.mkdir(parents=True, exist_ok=True)
            (short,) = scratch_tree(args.commit, tree)
            tests = [t for t in tests if (tree / t).exists()]  # an older commit may not have every test file yet
            write_config(tree, modules, tests)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(tree / "mutants")}
        start = time.perf_counter()
        clean = (
            subprocess.CompletedProcess([], 0)
            if args.summarise
            else subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                cwd=tree,
                env={**env, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
            )
        )
        clean_s = time.perf_counter() - start
        if clean.returncode != 0:
            print(clean.stdout[-3000:])
            return 2
        # mutants/ must exist when mutmut starts: Python caches "no such folder" for a sys.path entry for good
        (tree / "mutants").mkdir(exist_ok=True)
        only = ONLY.get(args.group, [])
        run = (
            subprocess.CompletedProcess([], 0, "", "")
            if args.summarise
            else subprocess.run(
                [MUTMUT, "run", "--max-children", str(args.max_children), *(survivors_before if args.retest else only)]
                if not (args.retest and not survivors_before)
                else ["true"],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
            )
        )
        # no second run: a changed test selection makes mutmut reset every verdict (a full rerun);
        # with tests only added, a mutant killed before stays killed, so it keeps its earlier verdict here
        kept = {}
        if args.retest and not args.summarise:
            after = exit_codes(tree)
            kept = {n: c for n, c in before_codes.items() if n not in survivors_before and after.get(n) is None}
            for summary_file in args.earlier:  # killed in an earlier pass, before this tree's last reset
                earlier = json.loads(summary_file.read_text())
                if "statuses" in earlier:
                    killed_there = {n for n, status in earlier["statuses"].items() if status == "killed"}
                elif set(earlier["mutmut_counts"]) <= {"killed", "survived"}:  # then every non-survivor was killed
                    killed_there = {n for n in after if n not in earlier["survivors"]}
                else:
                    parser.error(f"{summary_file} does not say which mutants it killed; leave it out")
                kept.update({n: 1 for n in killed_there if after.get(n) is None and before_codes.get(n) is None})
            if args.new_tests_only:  # no new test calls it: it still survives the group's selection
                kept.update({n: before_codes[n] for n in survivors_before if after.get(n) in (5, 33)})
        run_s = time.perf_counter() - start - clean_s
        codes = {
            name: code
            for name, code in {**exit_codes(tree), **kept}.items()
            if not only or any(fnmatch.fnmatch(name, pattern) for pattern in only)
        }
        statuses = {name: STATUS.get(code, "suspicious") for name, code in codes.items()}
        rechecked = {}
        for name, status in sorted(statuses.items()):
            if status in ("timeout", "suspicious", "segfault") and name in kept:
                rechecked[name] = "as before (kept verdict; see the before run's summary)"
            elif status in ("timeout", "suspicious", "segfault"):
                rechecked[name] = rerun_directly(tree, env, name, args.recheck_limit)
        survivors = {}
        for name, status in sorted(statuses.items()):
            if status == "survived" or rechecked.get(name) == "survived":
                survivors[name] = subprocess.run(
                    [MUTMUT, "show", name], cwd=tree, env=env, capture_output=True, text=True
                ).stdout
        summary = {
            "group": args.group,
            "commit": short,
            "retest_of_survivors": args.retest,
            "retested": sorted(survivors_before) if args.retest else [],
            "retest_tests": "the --also-test files only" if args.new_tests_only else "the group's selection",
            "earlier": [str(p.name) for p in args.earlier],
            "only": only,
            "modules": modules,
            "tests": tests,
            "mutmut": subprocess.run([MUTMUT, "--version"], capture_output=True, text=True).stdout.strip(),
            "clean_run_s": round(clean_s, 1),
            "mutmut_run_s": round(run_s, 1),
            "mutants": len(codes),
            "mutmut_counts": dict(Counter(statuses.values())),
            "rechecked": rechecked,
            "rechecked_counts": dict(Counter(rechecked.values())),
            "survivors": survivors,
            "statuses": dict(sorted(statuses.items())),
            "mutmut_output_tail": "\n".join(
                line for line in (run.stdout + run.stderr).splitlines() if line.strip() and not SPINNER.match(line)
            )[-1500:],
        }
    out = args.out or ROOT / "benchmarks" / "results" / f"mutmut-{args.group}-{short}.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("group", "commit", "mutants", "mutmut_counts", "rechecked_counts")}))
    print(f"{len(survivors)} survived; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
