"""What every evaluation shares: the progress interface, the out-of-memory guard and ladder, the LM head split into
its parts, and the fields every row starts with."""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, TypeVar

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


Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class OomLadder:
    """The one out-of-memory rule of ppl, needle, passkey and RULER: a batch that runs out of memory is halved and
    tried again; when a batch of one still runs out of memory, that point is recorded as `oom` and the method's
    points at that length and longer are skipped (rows with status `skipped`). One ladder serves a whole sweep, so
    a later work item of the method starts at the batch that fitted and does not try again what ran out of memory."""

    skip_from: dict[str, int] = field(default_factory=dict)  # method label -> length where a batch of one ran out
    fitted: dict[tuple[str, int], int] = field(default_factory=dict)  # (label, length) -> the halved batch that fit

    def skipped_at(self, label: str, length: int) -> int | None:
        """The length that ran out of memory when `length` is at or past it (its points are skipped), else None."""
        first = self.skip_from.get(label)
        return first if first is not None and length >= first else None

    def skip_note(self, label: str) -> str:
        """The note of a row skipped because `label` ran out of memory."""
        return f"skipped: out of memory at {self.skip_from[label]} tokens"

    def first_batch(self, label: str, length: int, batch_size: int) -> int:
        """The batch `length` starts at: `batch_size`, or less where a halved batch fitted this length or a shorter
        one (a longer sequence needs at least as much memory)."""
        fitted = [size for (name, at), size in self.fitted.items() if name == label and at <= length]
        return min([batch_size, *fitted])

    def halve(self, label: str, length: int, batch: int, progress: Progress) -> int:
        """The batch after `batch` ran out of memory at `length` (at least 2), remembered for the method's items."""
        half = batch // 2
        self.fitted[(label, length)] = half
        progress.note(f"{label}: out of memory at {length} tokens; batch size {half}")
        return half

    def give_up(self, label: str, length: int, progress: Progress) -> None:
        """A batch of one ran out of memory at `length`: the method's points from this length on are skipped."""
        self.skip_from[label] = length
        progress.note(f"{label}: out of memory at {length} tokens; longer lengths skipped")

    def batches(
        self,
        label: str,
        length: int,
        items: list[Item],
        batch_size: int,
        progress: Progress,
        measure: Callable[[list[Item]], Result],
        same_shape: Callable[[list[Item]], list[Item]] | None = None,
    ) -> Iterator[tuple[list[Item], Result]]:
        """(batch, measure(batch)) over `items` (all of one length) in order, halving the batch on out of memory
        (`measure` raises PointOOM, as under oom_guard). `same_shape` trims a batch to the items that can share one
        forward. PointOOM propagates when a batch of one runs out of memory: the caller records it and calls
        give_up; the items from that batch on were not measured."""
        step = self.first_batch(label, length, batch_size)
        start = 0
        while start < len(items):
            chunk = items[start : start + step]
            if same_shape is not None:
                chunk = same_shape(chunk)
            try:
                result = measure(chunk)
            except PointOOM:
                if step == 1:
                    raise
                step = self.halve(label, length, step, progress)
                continue
            yield chunk, result
            start += len(chunk)


def head_parts(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """(body, LM head, logit post-processing) so that logits can be computed a chunk of positions at a time."""
    body = getattr(model, model.base_model_prefix, None)
    if body is None:  # Llama4ForCausalLM: base_model_prefix 'language_model', its body at .model
        body = getattr(model, "model", None)
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
