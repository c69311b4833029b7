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


def reproduce(
    member: str, steps: int, log: Callable[[str], None] = print, corpus: dict[str, list[str]] | None = None
) -> int:
    """Retrain `steps` steps (one torch thread, the logged config) and compare the logged losses at every 50th
    step. 0 when every compared loss is identical to the shipped log's, 1 otherwise. corpus: the training texts
    (default: tiny's own, as train builds them)."""
    import torch

    from .train import TinyConfig, train

    shipped = shipped_log(member)
    config = dict(shipped["config"])
    config.setdefault("member", "tiny")  # logs written before the family existed
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        ran = train(tmp, TinyConfig(**config), corpus=corpus, log=lambda _: None, evaluate=False, stop_after=steps)
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
    per_step = ran["train_seconds"] / max(ran["steps_run"], 1)
    log(
        f"{member}: {ran['steps_run']} steps in {ran['train_seconds']:.1f} s on this machine now ({per_step:.2f} s per "
        f"step; all {shipped['steps']:,} at this pace: about {per_step * shipped['steps'] / 60:.0f} minutes)"
    )
    return 0 if same else 1


__all__ = ["COMPARED", "reproduce", "shipped_log"]
