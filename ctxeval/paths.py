"""Where ctxeval keeps what it can rebuild: the user cache dir (converted models, extracted corpora, token ids)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$CTXEVAL_CACHE, else $XDG_CACHE_HOME/ctxeval, else ~/.cache/ctxeval (not created here)."""
    if os.environ.get("CTXEVAL_CACHE"):
        return Path(os.environ["CTXEVAL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ctxeval"
