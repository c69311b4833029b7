"""Re-render every committed run under results/ from its rows and compare the outputs with the committed ones, byte
for byte: did a change of code (a reorganisation, say) leave every table as it was?

    python benchmarks/rerender_results.py [--only NAME ...] [--skip-runs] [--keep DIR] [--against DIR] [--out FILE.json]

Two checks, each in a scratch copy (results/ itself is never written):
- report: `ctxeval report` over the runs as results/README.md names them, compared with results/report-all/ (every
  file but the figures, whose PNG bytes carry matplotlib's version);
- runs: each run's own command from results/README.md, rerun on a copy of its directory. Every point is already in
  rows.jsonl, so the command measures nothing: it loads the model, re-renders the run's tables and figures, and
  finishes. Compared: every text file the run holds (table.md, the CSVs, tune.md, trials.csv, ...) and rows.jsonl;
  run.json is rewritten by every rerun (times, versions) and is not compared.
The committed runs' own tables were rendered by the version that measured them, and several have changed format
since (the report's columns, notes): to check a change of code, render the runs with the code before it (`--keep
DIR`, from a checkout of that commit) and compare the code after it with that (`--against DIR`).
Exit 1 when any compared file differs or a rerun fails.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
NOT_COMPARED = {"run.json", "run.log", ".lock"}  # run.json: times and versions; .lock: the holder
FIGURES = {".png", ".svg", ".pdf"}


def readme_commands() -> dict[str, str]:
    """Run directory name -> the command results/README.md gives for it: the backticked `ctxeval`/`torchrun` command
    that writes into results/<name> (a description may name a plain `ctxeval ppl` first), else the first one."""
    commands = {}
    for line in (RESULTS / "README.md").read_text().splitlines():
        name = re.match(r"\| \[`([^`/]+)/`\]", line)
        found = re.findall(r"`((?:ctxeval|torchrun) [^`]+)`", line)
        if name and found:
            own = [c for c in found if f"results/{name.group(1)}" in c]
            commands[name.group(1)] = (own or found)[0]
    return commands


def report_command() -> str:
    text = (RESULTS / "README.md").read_text()
    return re.search(r"`(ctxeval report [^`]+)`", text).group(1)


def compared_files(directory: Path) -> list[Path]:
    return sorted(
        p.relative_to(directory)
        for p in directory.rglob("*")
        if p.is_file() and p.name not in NOT_COMPARED and p.suffix not in FIGURES and "samples" not in p.parts
    )


def differences(committed: Path, rendered: Path) -> list[str]:
    problems = []
    for rel in compared_files(committed):
        other = rendered / rel
        if not other.exists():
            problems.append(f"{rel}: not written")
        elif not filecmp.cmp(committed / rel, other, shallow=False):
            problems.append(f"{rel}: differs")
    return problems


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(shlex.split(command), cwd=cwd, capture_output=True, text=True)


def check_report(scratch: Path) -> list[str]:
    copy = scratch / "results"
    shutil.copytree(RESULTS, copy, ignore=shutil.ignore_patterns("report-all"))
    done = subprocess.run(report_command(), shell=True, cwd=scratch, capture_output=True, text=True)
    if done.returncode:
        return [f"report: exit {done.returncode}: {done.stderr.strip()[-400:]}"]
    # report.html and report.json carry the time they were made
    problems = differences(RESULTS / "report-all", copy / "report-all")
    return [p for p in problems if not p.startswith(("report.html:", "report.json:"))]


def check_run(name: str, command: str, scratch: Path, keep: Path | None, against: Path | None) -> list[str]:
    (scratch / "results").mkdir(parents=True, exist_ok=True)
    target = scratch / "results" / name
    shutil.copytree(RESULTS / name, target)
    done = run(command, scratch)
    if done.returncode:
        return [f"exit {done.returncode}: {done.stderr.strip()[-400:]}"]
    if keep:
        shutil.copytree(target, keep / name, dirs_exist_ok=True)
    return differences(against / name if against else RESULTS / name, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run directory names (default: every run results/README.md names)")
    parser.add_argument("--skip-runs", action="store_true", help="only the report check (no model is loaded)")
    parser.add_argument("--keep", type=Path, help="copy each rerun's directory here")
    parser.add_argument("--against", type=Path, help="compare the reruns with an earlier --keep instead of results/")
    parser.add_argument("--out", type=Path, help="write the verdicts as JSON here")
    args = parser.parse_args()
    verdicts: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        if not args.only:
            verdicts["report-all"] = check_report(scratch / "report")
            print(f"report-all: {'identical' if not verdicts['report-all'] else verdicts['report-all']}", flush=True)
        if not args.skip_runs:
            for name, command in readme_commands().items():
                if args.only and name not in args.only:
                    continue
                verdicts[name] = check_run(name, command, scratch / name, args.keep, args.against)
                print(f"{name}: {'identical' if not verdicts[name] else verdicts[name]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(verdicts, indent=1) + "\n")
    failed = [name for name, problems in verdicts.items() if problems]
    print(
        f"{len(verdicts) - len(failed)} identical, {len(failed)} differ" + (f": {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
