"""What every evaluation shares: the progress interface, the out-of-memory guard, the LM head split into its parts,
and the fields every row starts with."""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterator, Protocol

import torch

from ..errors import CtxevalError
from ..runs.rows import METRICS
from ..specs import MethodSpec


class Progress(Protocol):
    """What the evaluation reports while it runs; only the CLI knows how to draw it."""

    def start(self, total: int) -> None: ...
    def advance(self, amount: int, description: str) -> None: ...
    def note(self, message: str) -> None: ...


class SilentProgress:
    """A Progress that shows nothing (library use, tests)."""

    def start(self, total: int) -> None: ...
    def advance(self, amount: int, description: str) -> None: ...
    def note(self, message: str) -> None: ...


def numbered(noun: str, ordinals: list[int], total: int) -> str:
    """Which of `total` items a progress line is about (1-based): 'sample 3/25', 'samples 1-4/25' (consecutive),
    'samples 2,5,9/25'; two different batches never read alike."""
    got = sorted(set(ordinals))
    if len(got) == 1:
        return f"{noun} {got[0]}/{total}"
    if got == list(range(got[0], got[-1] + 1)):
        return f"{noun}s {got[0]}-{got[-1]}/{total}"
    return f"{noun}s {','.join(map(str, got))}/{total}"


class PointOOM(Exception):
    """Out of memory while measuring one point (the message is the first line of the original error)."""


OOM_MESSAGES = (
    "out of memory",
    "can't allocate",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_enough_workspace",
)


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, a host MemoryError, or a RuntimeError that says it could not allocate (also cuBLAS's
    and cuDNN's allocation failures, which surface as plain RuntimeErrors)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MESSAGES)


@contextlib.contextmanager
def oom_guard(device: str) -> Iterator[None]:
    """Turn running out of memory inside the block into PointOOM; anything else passes. CUDA's cache is freed once
    the original exception has let go of its traceback, whose frames hold the failed forward's tensors."""
    message = None
    try:
        yield
    except Exception as exc:
        if not is_oom(exc):
            raise
        message = (str(exc).splitlines() or ["out of memory"])[0][:300] or "out of memory"
        exc.__traceback__ = None  # the traceback's frames hold the failed forward's activations
    if message is not None:
        if str(device).startswith("cuda"):
            gc.collect()
            torch.cuda.empty_cache()
        raise PointOOM(message) from None


def head_parts(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """(body, LM head, logit post-processing) so that logits can be computed a chunk of positions at a time."""
    body = getattr(model, model.base_model_prefix, None)
    head = model.get_output_embeddings()
    if body is None or head is None or body is model:
        raise CtxevalError(f"{type(model).__name__} has no separate body and LM head; ctxeval cannot score it")
    cfg = model.config.get_text_config()
    cap = getattr(cfg, "final_logit_softcapping", None)
    scale = getattr(cfg, "logit_scale", None)

    def post(logits: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            logits = logits * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return body, head, post


def point_row(model_name: str, spec: MethodSpec, task: str, **fields: Any) -> dict[str, Any]:
    """A row's leading fields (model, method, label, params, task, metric) followed by `fields` (which may set
    `value`; a failed point has value None)."""
    return {
        "model": model_name,
        "method": spec.method_name,
        "label": spec.label,
        "params": spec.record_params,
        "task": task,
        "metric": METRICS[task],
        "value": None,
        **fields,
    }
