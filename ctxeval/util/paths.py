"""Where ctxeval keeps things: the user cache dir (converted models, extracted corpora, token ids) and the bundled
tiny model inside the package."""

from __future__ import annotations

import os
import re
from pathlib import Path


def cache_dir() -> Path:
    """$CTXEVAL_CACHE, else $XDG_CACHE_HOME/ctxeval, else ~/.cache/ctxeval (not created here)."""
    if os.environ.get("CTXEVAL_CACHE"):
        return Path(os.environ["CTXEVAL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ctxeval"


def shown_path(path: Path | str) -> str:
    """A path as tables and notes print it: under the home directory as ~/..., so a committed table names no
    machine's user."""
    text, home = str(path), str(Path.home())
    return "~" + text[len(home) :] if home not in ("/", "") and (text == home or text.startswith(home + "/")) else text


# the bundled tiny model (ctxeval/tiny/model/, trained by `python -m ctxeval.tiny train`)
TINY_MODEL_DIR: Path = Path(__file__).resolve().parent.parent / "tiny" / "model"


def safe_name(text: str) -> str:
    """A file-name-safe form of a model name or method label (the last path part of an existing path)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(text).name if Path(text).exists() else text).strip("-")[:60] or "model"
