"""torch.distributed for sweeps: `torchrun --nproc-per-node N -m ctxeval ppl|needle|passkey|entropy ...`.

Every rank loads the model once (on its own GPU, cuda:LOCAL_RANK, or the CPU with the gloo backend), computes the
same list of pending work items from the run directory, and takes its share: items are sorted by cost (tokens to
forward) and dealt greedily to the least-loaded rank (longest-processing-time first), so the split is
deterministic and balanced by length. Rank r appends its rows to rows.rank<r>.jsonl; only rank 0 writes run.json;
at the end rank 0 merges the rank files into rows.jsonl and renders the reports. A run directory left by a crash
(rank files and all) resumes with any number of ranks, because every rank reads rows.jsonl and every rank file.
Without torchrun (WORLD_SIZE unset or 1) nothing here does anything.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

from ..errors import CtxevalError

T = TypeVar("T")
# a rank that finishes its share early waits for the slowest one at the end: allow long sweeps (hours)
TIMEOUT_HOURS = float(os.environ.get("CTXEVAL_DIST_TIMEOUT_HOURS", "24"))


class FollowerExit(CtxevalError):
    """Rank 0 already reported the error; the other ranks exit with code 2 without repeating it."""

    def __init__(self) -> None:
        super().__init__("")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as td

            td.barrier()

    def agree(self, value: T) -> T:
        """Rank 0's value on every rank (e.g. the default run directory, built from rank 0's clock)."""
        if not self.active:
            return value
        import torch.distributed as td

        box = [value]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def all_ok(self, ok: bool) -> bool:
        """True when every rank says ok (a collective: every rank must call it, failed or not)."""
        if not self.active:
            return ok
        import torch
        import torch.distributed as td

        flag = torch.tensor([1 if ok else 0], device=f"cuda:{self.local_rank}" if td.get_backend() == "nccl" else "cpu")
        td.all_reduce(flag, op=td.ReduceOp.MIN)
        return bool(flag.item())

    def shard(self, items: Sequence[T], cost: Callable[[T], float]) -> list[T]:
        """This rank's items, in their original order: LPT assignment by cost, ties by position."""
        if not self.active:
            return list(items)
        loads = [0.0] * self.world
        owner = [0] * len(items)
        for i in sorted(range(len(items)), key=lambda i: (-cost(items[i]), i)):
            r = min(range(self.world), key=lambda r: (loads[r], r))
            owner[i] = r
            loads[r] += cost(items[i])
        return [it for i, it in enumerate(items) if owner[i] == self.rank]


_CURRENT = Dist()


def current() -> Dist:
    return _CURRENT


def init_from_env(device: str) -> tuple[Dist, str]:
    """Join the process group torchrun set up (if any); returns the Dist and the device this rank uses."""
    global _CURRENT
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        _CURRENT = Dist()
        return _CURRENT, device
    import torch
    import torch.distributed as td

    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if device.startswith("cuda:"):
        raise CtxevalError("under torchrun each rank uses cuda:LOCAL_RANK; use --device cuda (or auto), not cuda:N")
    if device == "cuda" and not torch.cuda.is_available():
        raise CtxevalError("--device cuda but no CUDA GPU is visible to torch; use --device cpu (gloo backend)")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise CtxevalError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) on this node; "
                "use --nproc-per-node <= the GPU count"
            )
        torch.cuda.set_device(local_rank)
    if not td.is_initialized():
        td.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(hours=TIMEOUT_HOURS))
    # torchrun stops the other ranks with SIGTERM when one fails: finish run.json as interrupted, keep the rows
    signal.signal(signal.SIGTERM, _interrupt)
    _CURRENT = Dist(rank, world, local_rank)
    return _CURRENT, (f"cuda:{local_rank}" if use_cuda else "cpu")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def shutdown(together: bool = False) -> None:
    """Leave the process group. together=True (every rank finished normally): wait for all ranks first, so no rank
    tears its connections down while another still uses them (gloo can abort the process then). After a failure
    no barrier: a failed rank must not pair with the others' collectives."""
    global _CURRENT
    if _CURRENT.active:
        import torch.distributed as td

        if td.is_initialized():
            if together:
                td.barrier()
            td.destroy_process_group()
    _CURRENT = Dist()


def open_store(store_cls: Any, run_dir: Any, spec: dict[str, Any], overwrite: bool, provenance: dict[str, Any]) -> Any:
    """Rank 0 creates (or resumes, or replaces) the run directory, folds rank files a crashed run left into
    rows.jsonl and writes run.json; the others then open it. An error on rank 0 stops every rank."""
    d = current()
    store, problem = None, None
    if d.is_main:
        try:
            store = store_cls(run_dir, spec, overwrite=overwrite)
            store.merge_rank_files()
            store.start(
                {**provenance, "methods": store.record.get("methods", {}), "distributed": {"world_size": d.world}}
            )
        except CtxevalError as exc:
            problem = exc
    if d.agree(str(problem) if problem else None) is not None:
        raise problem if d.is_main else FollowerExit()
    if not d.is_main:
        store = store_cls(run_dir, spec, overwrite=False, rank=d.rank)
    return store


def conclude(store: Any, failed: BaseException | None) -> None:
    """Every rank, after its share (or its failure): agree whether all succeeded, let rank 0 fold the rank files
    into rows.jsonl, then re-raise this rank's error or report another rank's."""
    d = current()
    everyone_ok = d.all_ok(failed is None)
    if d.is_main:
        store.merge_rank_files()
    if failed is not None:
        raise failed
    if not everyone_ok:
        raise (
            CtxevalError(
                "another rank failed (its error is above); the rows measured so far are kept: rerun the "
                "same command to resume"
            )
            if d.is_main
            else FollowerExit()
        )
