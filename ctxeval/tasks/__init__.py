"""Named presets (data only, TOML) that reproduce known protocols; flags given on the command line override them."""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..errors import CtxevalError


def preset_names(kind: str | None = None) -> list[str]:
    names = []
    for entry in files("ctxeval.tasks").iterdir():
        if entry.name.endswith(".toml") and (kind is None or entry.name.startswith(kind + "-")):
            names.append(entry.name[:-5])
    return sorted(names)


def load_task(name_or_path: str, kind: str) -> dict[str, Any]:
    """A preset by name (ctxeval/tasks/NAME.toml) or a TOML file path; its `kind` must match the command."""
    path = Path(name_or_path).expanduser()
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise CtxevalError(f"task file not found: {name_or_path}")
        text = path.read_text()
    else:
        entry = files("ctxeval.tasks") / f"{name_or_path}.toml"
        if not entry.is_file():
            raise CtxevalError(f"unknown task '{name_or_path}'; presets: {', '.join(preset_names(kind))}, or a .toml path")
        text = entry.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CtxevalError(f"task '{name_or_path}' is not valid TOML: {exc}") from None
    if data.get("kind", kind) != kind:
        raise CtxevalError(f"task '{name_or_path}' is a '{data['kind']}' task, not '{kind}'")
    data.pop("kind", None)
    data.pop("description", None)
    return data
