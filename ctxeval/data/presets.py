"""Named presets (data only, TOML) that reproduce known protocols; flags given on the command line override them.

The presets are the TOML files of the top-level `tasks/` folder. pyproject.toml ships that folder inside the package
as `ctxeval.tasks` (setuptools package-dir), so a wheel and an editable install find them the same way; a source
checkout that was never installed reads the folder itself.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ..errors import CtxevalError
from ..util.textfiles import MAX_SMALL_BYTES, parse_toml, read_text

_CHECKOUT_TASKS = Path(__file__).resolve().parents[2] / "tasks"


def tasks_folder() -> Traversable:
    """Where the presets are: the installed `ctxeval.tasks` package, else the checkout's tasks/ folder."""
    try:
        return files("ctxeval.tasks")
    except ModuleNotFoundError:
        return _CHECKOUT_TASKS


def preset_names(kind: str | None = None) -> list[str]:
    """Preset names (file names without .toml), of one kind (`ppl`, `needle`) or all."""
    names = []
    for entry in tasks_folder().iterdir():
        if entry.name.endswith(".toml") and (kind is None or entry.name.startswith(kind + "-")):
            names.append(entry.name[:-5])
    return sorted(names)


def load_task(name_or_path: str, kind: str) -> dict[str, Any]:
    """A preset by name (tasks/NAME.toml) or a TOML file path; its `kind` must match the command."""
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise CtxevalError(f"task file not found: {name_or_path}")
        text = read_text(path, "task file", MAX_SMALL_BYTES)
    else:
        entry = tasks_folder() / f"{name_or_path}.toml"
        if not entry.is_file():
            raise CtxevalError(
                f"unknown task '{name_or_path}'; presets: {', '.join(preset_names(kind))}, or a .toml path"
            )
        text = entry.read_text(encoding="utf-8")  # a preset shipped with ctxeval
    data = parse_toml(text, f"task '{name_or_path}'")
    if not isinstance(data.get("kind", kind), str):
        raise CtxevalError(f"task '{name_or_path}': kind must be text such as \"{kind}\"")
    if data.get("kind", kind) != kind:
        raise CtxevalError(f"task '{name_or_path}' is a '{data['kind']}' task, not '{kind}'")
    data.pop("kind", None)
    data.pop("description", None)
    return data
