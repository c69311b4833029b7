"""Every `ctxeval` import in tests/, benchmarks/ and examples/ names a module or attribute that exists, checked
statically so that files skipped here (the vLLM tests, the GPU tests) cannot carry a stale path into CI, where they
run. A move of a module that forgets one such file fails here, not after twenty minutes of CI."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["tests", "benchmarks", "examples"]


def ctxeval_imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name taken from it or None, line) for every absolute ctxeval import in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "ctxeval":
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "ctxeval"]
    return found


def unresolved(module: str, name: str | None) -> str | None:
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] == "ctxeval":
            return f"no module {module}"
        return None  # an optional dependency (vllm, flash-attn) absent here: the path itself is not in question
    if name is None or name == "*" or hasattr(imported, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError as error:
        if (error.name or "") == f"{module}.{name}":
            return f"{module} has no {name}"
    return None


def python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts)


def test_every_ctxeval_import_in_tests_benchmarks_and_examples_resolves():
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {problem}"
        for path in python_files()
        for module, name, line in ctxeval_imports(path)
        if (problem := unresolved(module, name))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ctxeval.evals import vllm_engine\n", "ctxeval.evals has no vllm_engine"),
        ("import ctxeval.evals.vllm_engine\n", "no module ctxeval.evals.vllm_engine"),
        ("from ctxeval.rope.methods import no_such_name\n", "ctxeval.rope.methods has no no_such_name"),
    ],
)
def test_a_stale_path_is_reported(tmp_path, source, expected):
    stale = tmp_path / "test_stale.py"
    stale.write_text(source)
    ((module, name, _line),) = ctxeval_imports(stale)
    assert unresolved(module, name) == expected


def test_a_moved_module_still_resolves():
    assert unresolved("ctxeval.models", "vllm_engine") is None
    assert unresolved("ctxeval.models.vllm_engine", "load_vllm_model") is None
