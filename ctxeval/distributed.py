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
from typing import Any, Callable, Sequence, TypeVar

from .errors import CtxevalError

T = TypeVar("T")


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
            raise CtxevalError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) on this node; "
                               "use --nproc-per-node <= the GPU count")
        torch.cuda.set_device(local_rank)
    if not td.is_initialized():
        td.init_process_group(backend="nccl" if use_cuda else "gloo")
    # torchrun stops the other ranks with SIGTERM when one fails: finish run.json as interrupted, keep the rows
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    _CURRENT = Dist(rank, world, local_rank)
    return _CURRENT, (f"cuda:{local_rank}" if use_cuda else "cpu")


def shutdown() -> None:
    global _CURRENT
    if _CURRENT.active:
        import torch.distributed as td

        if td.is_initialized():
            td.barrier()
            td.destroy_process_group()
    _CURRENT = Dist()


def open_store(store_cls: Any, run_dir: Any, spec: dict[str, Any], overwrite: bool, provenance: dict[str, Any]) -> Any:
    """Rank 0 creates (or resumes, or replaces) the run directory and writes run.json; the others then open it."""
    d = current()
    store = None
    if d.is_main:
        store = store_cls(run_dir, spec, overwrite=overwrite)
        store.start({**provenance, "methods": store.record.get("methods", {}), "distributed": {"world_size": d.world}})
    d.barrier()
    if not d.is_main:
        store = store_cls(run_dir, spec, overwrite=False, rank=d.rank)
    return store


def finish_rows(store: Any) -> None:
    """Wait for every rank, then rank 0 folds the rank files into rows.jsonl."""
    d = current()
    d.barrier()
    if d.is_main:
        store.merge_rank_files()
