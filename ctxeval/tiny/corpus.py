"""Text of the bundled tiny model, from what every Python install has offline.

Sources
  pydoc     CPython's bundled documentation topics (`pydoc_data.topics.topics`: 79 topics, ~465k characters in 3.11).
  sources   standard-library `.py` files under `sysconfig.get_paths()["stdlib"]` (no tests, no site-packages, no
            pydoc_data, no codec tables), one document per file.
  docstrings the module/class/function docstrings of those files (English prose), one document per file.
  retrieval needle- and passkey-shaped lines generated here (the model also trains on full needle prompts, built
            in token space by `train.py` with ctxeval's own PromptBuilder).

Held-out split
  HELD_OUT_TITLES is every 4th topic of CPython 3.11's topics sorted by length (longest first, ties by title), so
  it holds the longest topic. The list is frozen so that the split is the same on every Python version (a topic
  held out in 3.11 never becomes training text elsewhere). Several pydoc topics repeat each other's text (e.g.
  `customization` is a section of `specialnames`, `compound` contains `with`, `while` and `if`), so every training
  line that also occurs in a held-out topic is removed from the training text. `held_out_documents()` leaves out a
  held-out topic whose text is mostly inside a longer held-out one (e.g. `customization` inside `specialnames`),
  so that evaluation documents do not repeat each other.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data.offline import HELD_OUT_TITLES, held_out_documents, pydoc_topics, remove_held_out_lines
from ..data.presets import load_task
from ..evals.haystack import NeedlePreset, make_sample
from ..util.textfiles import write_text

# standard-library folders that are not prose or ordinary code (tests, generated tables, other installs)
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "pydoc_data",
    "__pycache__",
    "encodings",
    "lib2to3",
    "ensurepip",
}


def training_topics() -> list[tuple[str, str]]:
    """(title, text) of the pydoc topics used for training, by title, held-out lines removed."""
    topics = pydoc_topics()
    held = set(HELD_OUT_TITLES)
    out = []
    for title in sorted(topics):
        if title in held:
            continue
        text = remove_held_out_lines(topics[title])
        if text.strip():
            out.append((title, text))
    return out


def stdlib_files() -> list[Path]:
    """Standard-library .py files in sorted relative-path order (no tests, site-packages, codecs, pydoc_data)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if set(rel.parts[:-1]) & _SKIP_DIRS or rel.parts[0].startswith("config-"):
            continue
        if path.name.startswith(("test_", "_sysconfigdata")):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=1)
def _stdlib() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(sources, docstrings): one text per standard-library file, held-out lines removed."""
    sources, docstrings = [], []
    for path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        sources.append(remove_held_out_lines(text))
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= 80:
                    docs.append(doc)
        if docs:
            docstrings.append(remove_held_out_lines("\n\n".join(docs)))
    return tuple(sources), tuple(docstrings)


def stdlib_sources() -> list[str]:
    return list(_stdlib()[0])


def stdlib_docstrings() -> list[str]:
    return list(_stdlib()[1])


def retrieval_lines(count: int = 2000, seed: int = 0) -> list[str]:
    """Needle/passkey-shaped texts (instruction, needle, question, answer), so the tokenizer learns their words.

    Built from ctxeval's presets (needle-magic-number, needle-passkey) with seeded keys and values; the haystack is left
    out here (train.py builds full prompts with real haystacks in token space)."""
    rng = np.random.default_rng(seed)
    presets = training_presets()
    out = []
    for i in range(count):
        preset = presets["passkey" if i % 4 == 3 else "ruler"]
        sample = make_sample(preset, rng)
        out.append(
            f"{preset.instruction}\n {' '.join(sample.needles)}\n{sample.question} {sample.answer_prefix}"
            f"{sample.answer_text}."
        )
    return out


def training_presets() -> dict[str, "object"]:
    """The needle presets the model trains on: the magic-number and passkey presets, plus the magic number with one
    distractor. The recipe's names for them ("ruler", ...) are kept: they label its training pools."""
    ruler = NeedlePreset.from_dict("ruler", load_task("needle-magic-number", "needle"))
    passkey = NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle"))
    return {
        "ruler": ruler,
        "passkey": passkey,
        "ruler-distractor": replace(ruler, name="ruler-distractor", distractors=1),
    }


def training_corpus() -> dict[str, list[str]]:
    """The training texts by source: pydoc (training topics), docstrings, sources, retrieval."""
    return {
        "pydoc": [text for _, text in training_topics()],
        "docstrings": stdlib_docstrings(),
        "sources": stdlib_sources(),
        "retrieval": retrieval_lines(),
    }


def write_held_out(directory: str | Path) -> list[Path]:
    """Write each held-out document to DIRECTORY/NN-title.txt (longest first, so sorted order = this order)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (title, text) in enumerate(held_out_documents()):
        path = directory / f"{i:02d}-{title}.txt"
        paths.append(write_text(path, text, "held-out document"))
    return paths
