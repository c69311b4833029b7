"""Fail fast without a network: when the Hugging Face Hub's host does not resolve, switch the hub libraries to
offline mode (cached models and datasets still load) instead of letting them retry for a minute."""

from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlparse

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
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE:
        return True
    if hub_reachable():
        return False
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
