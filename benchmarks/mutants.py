"""A small mutation check: apply one plausible one-line bug at a time to a scratch copy of the checkout, run the tests
that should catch it, and report which were killed (a test failed) and which survived.

    python benchmarks/mutants.py [--only NAME] [--keep-going]

Each mutant is (name, file, the exact text, its replacement, the test files to run). The copy lives in a temporary
folder (the working tree is never touched); the tests run there with `python -m pytest -x -q`. A mutant whose text
is not found is reported as stale (the code moved on: update the list). Exit 1 if any mutant survived.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESUME = "tests/test_resume_and_rollback.py"
MUTANTS = [
    (
        "needle resume key without depth",
        "ctxeval/runs/rows.py",
        '"needle": ("model", "label", "length", "depth", "sample")',
        '"needle": ("model", "label", "length", "sample")',
        [RESUME],
    ),
    (
        "needle resume key without sample",
        "ctxeval/runs/rows.py",
        '"needle": ("model", "label", "length", "depth", "sample")',
        '"needle": ("model", "label", "length", "depth")',
        [RESUME],
    ),
    (
        "ppl resume key without doc",
        "ctxeval/runs/rows.py",
        '"ppl": ("model", "label", "length", "doc")',
        '"ppl": ("model", "label", "length")',
        [RESUME],
    ),
    (
        "entropy resume key without doc",
        "ctxeval/runs/rows.py",
        '"entropy": ("model", "label", "length", "doc")',
        '"entropy": ("model", "label", "length")',
        [RESUME],
    ),
    (
        "failed points count as done",
        "ctxeval/runs/store.py",
        'for r in self.rows() if r.get("status") == "ok"}',
        "for r in self.rows()}",
        [RESUME],
    ),
    ("read-back tolerance 1e-1", "ctxeval/rope/patching.py", "READBACK_RTOL = 1e-5", "READBACK_RTOL = 1e-1", [RESUME]),
    (
        "failed read-back leaves the model patched",
        "ctxeval/rope/patching.py",
        "                if not diff <= READBACK_RTOL:\n                    self.restore()\n",
        "                if not diff <= READBACK_RTOL:\n",
        [RESUME],
    ),
    (
        "dynamic-yarn ignores original_max_position_embeddings",
        "ctxeval/rope/methods.py",
        "    L = _length(geom, params)\n    s = max(1.0, (L if length is None else length) / L)",
        "    L = geom.original_length\n    s = max(1.0, (L if length is None else length) / L)",
        [RESUME],
    ),
    (
        "DeepSeek mscale ratio inverted",
        "ctxeval/rope/methods.py",
        'return mscale(s, params["mscale"]) / mscale(s, params["mscale_all_dim"])',
        'return mscale(s, params["mscale_all_dim"]) / mscale(s, params["mscale"])',
        [RESUME, "tests/rope/test_methods.py"],
    ),
    (
        "self-extend query shift W instead of W - W//G",
        "ctxeval/attention/methods.py",
        "return q_pos // g + w - w // g, k_pos // g",
        "return q_pos // g + w, k_pos // g",
        ["tests/attention/test_methods.py"],
    ),
    (
        "rerope window inclusive",
        "ctxeval/attention/methods.py",
        "near = (q_pos[:, rows, None] - k_pos[:, None, band]) < window",
        "near = (q_pos[:, rows, None] - k_pos[:, None, band]) <= window",
        ["tests/attention/test_methods.py"],
    ),
    (
        "logn never below 1 dropped",
        "ctxeval/attention/methods.py",
        ".clamp(min=1.0)",
        ".clamp(min=0.0)",
        ["tests/attention/test_methods.py"],
    ),
    (
        "longrope long factors at L itself",
        "ctxeval/rope/methods.py",
        "long = length is not None and length > L",
        "long = length is not None and length >= L",
        ["tests/rope/test_methods.py"],
    ),
    (
        "truncate window aggregate: the sum, not the mean",
        "ctxeval/evals/perplexity.py",
        "rows.append(self._ok(spec, length, doc.doc_id, total, n, total / n, 1,",
        "rows.append(self._ok(spec, length, doc.doc_id, total, n, total, 1,",
        [RESUME],
    ),
    (
        "sliding window aggregate sums window sums",
        "ctxeval/evals/perplexity.py",
        "window_sum += float(new.mean())",
        "window_sum += float(new.sum())",
        [RESUME],
    ),
    (
        "needle generation under a dynamic method not frozen",
        "ctxeval/models/generation.py",
        "        handle.freeze_length(frozen_length)",
        "        pass",
        [RESUME],
    ),
    (
        "needle answers matched case-sensitively",
        "ctxeval/evals/haystack.py",
        "return all(answer.lower() in response.lower() for answer in sample.answers)",
        "return all(answer in response for answer in sample.answers)",
        [RESUME],
    ),
    (
        "needle terms matched case-sensitively",
        "ctxeval/evals/haystack.py",
        "return all(term.lower() in response.lower() for term in preset.match_terms)",
        "return all(term in response for term in preset.match_terms)",
        [RESUME],
    ),
    (
        "RULER scoring all-or-nothing",
        "ctxeval/evals/ruler/generate.py",
        'return sum(found) / len(found) if metric == "string_match_all" else max(found)',
        'return min(found) if metric == "string_match_all" else max(found)',
        ["tests/evals/ruler/test_generate.py"],
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="run the mutants whose name contains this")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.only is None or args.only in m[0]]
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "tree"
        shutil.copytree(
            ROOT, scratch, ignore=shutil.ignore_patterns(".git", ".venv", "results", "__pycache__", "*.egg-info")
        )
        for name, rel, old, new, tests in chosen:
            path = scratch / rel
            original = path.read_text()
            if original.count(old) != 1:
                print(f"STALE     {name}: the text is not in {rel} exactly once")
                survived += 1
                continue
            path.write_text(original.replace(old, new))
            start = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                cwd=scratch,
                capture_output=True,
                text=True,
                env={**__import__("os").environ, "PYTHONPATH": str(scratch)},
            )
            path.write_text(original)
            verdict = "killed" if result.returncode != 0 else "SURVIVED"
            survived += verdict == "SURVIVED"
            print(f"{verdict:<9} {name}  ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"{len(chosen) - survived} of {len(chosen)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
