"""Fail fast without a network: when the Hugging Face Hub's host does not resolve, switch the hub libraries to
offline mode (cached models and datasets still load) instead of letting them retry for a minute."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from ..errors import CtxevalError

_TRUE = ("1", "true", "yes", "on")


def hub_reachable() -> bool:
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def offline_unless_reachable() -> bool:
    """Returns True when the hub libraries are (now) in offline mode."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in _TRUE and hub_reachable():
        return False
    # offline by the user's switch or for want of a network: also in libraries imported before the switch was set,
    # which would otherwise retry the unreachable hub for most of a minute before failing
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # libraries already imported read these flags at import time
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants as c

        c.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config as dc

        dc.HF_HUB_OFFLINE = True
        if hasattr(dc, "HF_DATASETS_OFFLINE"):
            dc.HF_DATASETS_OFFLINE = True
    return True


def download(urls: list[str], dest: Path, what: str, hint: str, timeout: float = 60.0) -> Path:
    """Fetch the first of `urls` that answers into `dest` (through a temporary file: a broken download leaves
    nothing behind). Raises CtxevalError, one line, when none can be fetched."""
    import urllib.request

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    failures = []
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
                shutil.copyfileobj(response, out)
            tmp.replace(dest)
            return dest
        except (OSError, ValueError) as exc:  # URLError, timeouts and HTTP errors are OSErrors
            failures.append(f"{urlparse(url).hostname or url}: {getattr(exc, 'reason', exc)}")
        finally:
            tmp.unlink(missing_ok=True)
    raise CtxevalError(f"{what} needs the network ({'; '.join(failures)[:300]}); {hint}")
