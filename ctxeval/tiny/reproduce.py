"""Retrain a shipped family member's first steps and compare their losses with the member's own training log: the
check that `python -m ctxeval.tiny train --member NAME` is the recipe the shipped weights came from."""

from __future__ import annotations

import json
import tempfile
from typing import Any, Callable

from .family import member_dir

COMPARED = ("loss", "lm_loss", "answer_loss", "recall_loss")


def shipped_log(member: str) -> dict[str, Any]:
    path = member_dir(member) / "training_log.json"
    if not path.is_file():
        from ..errors import CtxevalError

        raise CtxevalError(f"{member} ships no training log at {path}; train it first: python -m ctxeval.tiny train")
    return json.loads(path.read_text(encoding="utf-8"))


def reproduce(member: str, steps: int, log: Callable[[str], None] = print) -> int:
    """Retrain `steps` steps (one torch thread, the logged config) and compare the logged losses at every 50th
    step. 0 when every compared loss is identical to the shipped log's, 1 otherwise."""
    import torch

    from .train import TinyConfig, train

    shipped = shipped_log(member)
    config = dict(shipped["config"])
    config.setdefault("member", "tiny")  # logs written before the family existed
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        ran = train(tmp, TinyConfig(**config), log=lambda _: None, evaluate=False, stop_after=steps)
    logged = {row["step"]: row for row in shipped["history"]}
    same = True
    for row in ran["history"]:
        before = logged.get(row["step"], {})
        cells = []
        for key in COMPARED:
            equal = before.get(key) == row[key]
            same &= equal
            cells.append(f"{key} {row[key]} {'==' if equal else '!='} {before.get(key)}")
        log(f"step {row['step']}: " + ", ".join(cells))
    log(f"{member}: the first {steps} steps {'reproduce' if same else 'DO NOT reproduce'} the shipped log")
    return 0 if same else 1


__all__ = ["COMPARED", "reproduce", "shipped_log"]
