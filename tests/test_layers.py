"""The package's layers: one whole-number rank per package, every import (module-level or inside a function) points
to a lower layer or inside its own package without a circle, packages of one layer never import each other, nothing
but the CLI imports the CLI, and no private name crosses a module. Inside a package the same holds one level down:
each sub-package has a rank among its siblings, and a sub-package imports only siblings of a lower rank. The same
check is shown to fail on a copy of the package with an upward import, a sideways import between sub-packages, a
circle and a private name injected."""

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ctxeval"
# One whole number per layer, bottom up. A module may import only packages of a strictly lower layer, or modules of
# its own package (acyclically); packages that share a layer (rope, data, runs; models, report) never import each
# other.
RANKS = {
    "errors": 0,
    "util": 1,
    "rope": 2,
    "data": 2,
    "runs": 2,
    "attention": 3,
    "specs": 4,
    "models": 5,
    "report": 5,
    "evals": 6,
    "tiny": 7,
    "cli": 8,
    "__main__": 9,
    "__init__": 9,
}
# Inside a package, one whole number per sub-package (a folder of modules), bottom up: a sub-package imports only
# sub-packages of a strictly lower rank among its siblings (the package's own modules are free to import either way,
# acyclically). ruler/ runs the retrieval suites' tasks, so it sits above retrieval/; what both share is prompts/.
SUBRANKS = {
    "evals": {"prompts": 0, "retrieval": 1, "tune": 1, "ruler": 2},
    "report": {"kinds": 0},
}


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def imports(path: Path, package: Path) -> list[tuple[str, list[str], int]]:
    """(imported ctxeval module, names taken from it, line) for every import in the file."""
    name = module_name(path, package)
    parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(parent.split(".")[: len(parent.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "ctxeval":
                continue
            for alias in node.names:  # `from . import corpora` imports a module, `from .x import y` a name
                target = f"{base}.{alias.name}"
                as_path = package.parent / target.replace(".", "/")
                is_module = as_path.with_suffix(".py").exists() or as_path.is_dir()
                found.append((target, [], node.lineno) if is_module else (base, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "ctxeval"]
    return found


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def subgroup(module: str, package: Path) -> str | None:
    """The sub-package (a folder with an `__init__.py`) of its package a module sits in (`ruler` for
    ctxeval.evals.ruler.run), None for a module of the package itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and (package / parts[1] / parts[2] / "__init__.py").exists() else None


def layer_problems(package: Path) -> list[str]:
    """Every upward or sideways import, private name crossing a module, circle, and module without a rank."""
    graph: dict[str, set[str]] = {}
    problems = []
    for path in sorted(package.rglob("*.py")):
        source = module_name(path, package)
        graph.setdefault(source, set())
        if group(source) not in RANKS:
            problems.append(f"{source}: its package has no rank")
            continue
        sub_ranks = SUBRANKS.get(group(source), {})
        sub = subgroup(source, package)
        if sub is not None and sub not in sub_ranks:
            problems.append(f"{source}: its sub-package has no rank in {group(source)}")
            continue
        for target, names, line in imports(path, package):
            graph[source].add(target)
            where = f"{path.relative_to(package.parent)}:{line} imports {target}"
            if group(target) != group(source) and not RANKS.get(group(target), 99) < RANKS[group(source)]:
                problems.append(f"{where}: upward ({group(source)} -> {group(target)})")
            to = subgroup(target, package)
            if group(target) == group(source) and None not in (sub, to) and sub != to:
                if not sub_ranks.get(to, 99) < sub_ranks[sub]:
                    problems.append(f"{where}: upward ({group(source)}.{sub} -> {group(source)}.{to})")
            private = [n for n in names if n.startswith("_")]
            if private and target != source:
                problems.append(f"{where}: private name(s) {', '.join(private)} cross a module")
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                problems.append("import circle: " + " -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif nxt in graph and not state.get(nxt):
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])
    return problems


def test_imports_point_down_and_are_acyclic():
    problems = layer_problems(PACKAGE)
    assert not problems, "\n".join(problems)


def test_every_module_has_a_rank():
    assert {group(module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py")} <= set(RANKS)
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path, PACKAGE)
        assert subgroup(name, PACKAGE) in {None, *SUBRANKS.get(group(name), {})}, name


def package_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "ctxeval"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "model"))
    assert layer_problems(copy) == []
    return copy


def test_an_injected_upward_import_fails(tmp_path):
    copy = package_copy(tmp_path)
    with open(copy / "rope" / "bound.py", "a") as f:
        f.write("\n\ndef late():\n    from ..evals.sweep import run_items\n")
    line = len((copy / "rope" / "bound.py").read_text().splitlines())
    assert layer_problems(copy) == [f"ctxeval/rope/bound.py:{line} imports ctxeval.evals.sweep: upward (rope -> evals)"]


def test_an_import_between_packages_of_one_layer_fails(tmp_path):
    copy = package_copy(tmp_path)
    with open(copy / "report" / "tables.py", "a") as f:
        f.write("\nfrom ..models.memory import GIB\n")
    assert len(problems := layer_problems(copy)) == 1 and "upward (report -> models)" in problems[0]


def test_an_import_between_sub_packages_against_their_order_fails(tmp_path):
    """prompts/ sits below retrieval/ and ruler/; retrieval/ and tune/ share a rank; ruler/ imports retrieval/, so
    retrieval/ importing ruler/ is a circle as well as upward."""
    copy = package_copy(tmp_path)
    with open(copy / "evals" / "prompts" / "sample.py", "a") as f:
        f.write("\n\ndef late():\n    from ..retrieval.litm_kv import generate_kv_example\n")
    line = len((copy / "evals" / "prompts" / "sample.py").read_text().splitlines())
    assert layer_problems(copy) == [
        f"ctxeval/evals/prompts/sample.py:{line} imports ctxeval.evals.retrieval.litm_kv: upward "
        "(evals.prompts -> evals.retrieval)"
    ]
    with open(copy / "evals" / "prompts" / "sample.py", "w") as f:
        f.write((PACKAGE / "evals" / "prompts" / "sample.py").read_text())
    with open(copy / "evals" / "tune" / "space.py", "a") as f:
        f.write("\nfrom ..retrieval import litm_kv\n")
    assert len(problems := layer_problems(copy)) == 1 and "upward (evals.tune -> evals.retrieval)" in problems[0]
    with open(copy / "evals" / "tune" / "space.py", "w") as f:
        f.write((PACKAGE / "evals" / "tune" / "space.py").read_text())
    with open(copy / "evals" / "retrieval" / "suite.py", "a") as f:
        f.write("\n\ndef late():\n    from ..ruler.run import RulerConfig\n")
    problems = layer_problems(copy)
    assert any("upward (evals.retrieval -> evals.ruler)" in p for p in problems), problems
    assert any(p.startswith("import circle:") for p in problems), problems


def test_a_sub_package_without_a_rank_fails(tmp_path):
    copy = package_copy(tmp_path)
    (copy / "evals" / "extras").mkdir()
    (copy / "evals" / "extras" / "__init__.py").write_text("")
    assert layer_problems(copy) == ["ctxeval.evals.extras: its sub-package has no rank in evals"]


def test_an_injected_circle_and_private_name_fail(tmp_path):
    copy = package_copy(tmp_path)
    with open(copy / "util" / "numbers.py", "a") as f:
        f.write("\nfrom .paths import _private_helper\n")
    with open(copy / "util" / "paths.py", "a") as f:
        f.write("\nfrom .numbers import parse_whole\n")
    problems = layer_problems(copy)
    assert any(
        p.startswith("import circle: ctxeval.util.numbers -> ctxeval.util.paths -> ctxeval.util.numbers")
        for p in problems
    ), problems
    assert any("private name(s) _private_helper cross a module" in p for p in problems), problems


def test_a_package_without_a_rank_fails(tmp_path):
    copy = package_copy(tmp_path)
    (copy / "extras").mkdir()
    (copy / "extras" / "__init__.py").write_text("")
    assert layer_problems(copy) == ["ctxeval.extras: its package has no rank"]


def test_the_tree_is_the_diagram():
    """At most 4 modules at the package root, at most 12 .py files (with __init__) in any folder, none over 600
    lines: the size limits that keep `ls` readable as the architecture."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 4, root
    crowded = {}
    for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        count = len(list(folder.glob("*.py")))
        if count > 12:
            crowded[str(folder.relative_to(PACKAGE.parent))] = count
    assert not crowded, crowded
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long


def test_every_package_says_what_lives_there():
    missing = [
        str(init.relative_to(PACKAGE.parent))
        for init in PACKAGE.rglob("__init__.py")
        if "model" not in init.parts and not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert not missing, missing
