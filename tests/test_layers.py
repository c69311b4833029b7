"""The package's layers: every import (module-level or inside a function) points down, evals and report are peers
that never import each other, nothing but the CLI imports the CLI, and no private name crosses a module."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ctxeval"
# lower rank = lower layer; a module may import only strictly lower ranks, or its own subpackage (acyclically)
RANKS = {"errors": 0, "paths": 0, "textfiles": 0.5, "numbers": 0.5, "hub": 1, "rows": 1, "runlock": 1, "methods": 2, "attention_methods": 2.5, "attention_kernels": 2.6, "specs": 3, "rope_config": 3.2, "vllm_rope": 3.3, "geometry": 3, "search_spaces": 3.5,
         "bound": 3, "presets": 3, "store": 4, "offline_corpora": 4, "distributed": 4, "attention": 4, "corpora": 5,
         "patching": 5, "models": 5, "memory": 6, "evals": 7, "report": 7, "tiny": 8, "cli": 9, "__main__": 10,
         "__init__": 10}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported ctxeval module, names taken from it, line) for every import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "ctxeval":
                continue
            for alias in node.names:  # `from . import corpora` imports a module, `from .x import y` a name
                target = f"{base}.{alias.name}"
                found.append((target, [], node.lineno) if (PACKAGE.parent / target.replace(".", "/")).with_suffix(
                    ".py").exists() or (PACKAGE.parent / target.replace(".", "/")).is_dir() else (base, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "ctxeval"]
    return found


def group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_point_down_and_are_acyclic():
    graph: dict[str, set[str]] = {}
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        graph.setdefault(source, set())
        for target, names, line in imports(path):
            graph[source].add(target)
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
            if group(target) != group(source) and not RANKS[group(target)] < RANKS[group(source)]:
                problems.append(f"{where}: upward ({group(source)} -> {group(target)})")
            private = [n for n in names if n.startswith("_")]
            if private and target != source:
                problems.append(f"{where}: private name(s) {', '.join(private)} cross a module")
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                problems.append("import circle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt in graph and not state.get(nxt):
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])
    assert not problems, "\n".join(problems)


def test_every_module_has_a_rank():
    assert {group(module_name(p)) for p in PACKAGE.rglob("*.py")} <= set(RANKS)

