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
    """A path as tables, notes and run records print it: inside the installed package as ctxeval/..., under the home
    directory as ~/..., an installed package's file from site-packages/..., so a committed run names no machine's
    checkout, environment or user."""
    text = str(path)
    if "/site-packages/" in text:  # an installed package's file (the SmolLM2 GGUF): where it sits in any environment
        return "site-packages/" + text.split("/site-packages/", 1)[1]
    for root, shown in ((str(PACKAGE_DIR), "ctxeval"), (str(Path.home()), "~")):
        if root not in ("/", "") and (text == root or text.startswith(root + "/")):
            return shown + text[len(root) :]
    return text


PACKAGE_DIR: Path = Path(__file__).resolve().parent.parent  # the installed ctxeval package
# the bundled tiny model (ctxeval/tiny/model/, trained by `python -m ctxeval.tiny train`)
TINY_MODEL_DIR: Path = PACKAGE_DIR / "tiny" / "model"
# its position-encoding family (ctxeval/tiny/family/NAME/, `python -m ctxeval.tiny train --member NAME`)
TINY_FAMILY_DIR: Path = PACKAGE_DIR / "tiny" / "family"


def safe_name(text: str) -> str:
    """A file-name-safe form of a model name or method label (the last path part of an existing path)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(text).name if Path(text).exists() else text).strip("-")[:60] or "model"
