"""Perplexity vs. context length: two protocols, the LM head's loss in chunks, and the sweep over every pending
(method, length, document) point.

Protocols
  truncate (YaRN paper's code): for each length L, BOS + the document's first L-1 tokens, NLL over those L-1
           tokens. A causal model's prediction at position t sees only tokens <= t, so for methods that do not
           depend on the sequence length ONE forward at max(lengths) yields every shorter length's NLL.
  sliding  window of L tokens (BOS + L-1 document tokens), stride S; every token is scored once, in the window
           that first covers it (the usual Hugging Face sliding-window perplexity).
--batch-size puts sequences of one length in one forward: several documents under truncate, several windows under
sliding; a batch that runs out of memory is halved before the point is given up.

Scorers return sums and counts (nll_sum, n_tokens, window_nll_sum, n_windows) so aggregation over documents is
exact: token-weighted exp(sum nll / sum tokens), or the mean of window means (the YaRN paper's GovReport numbers).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data.corpora import TokenDoc
from ..errors import CtxevalError
from ..models.load import LoadedModel
from ..runs.rows import RESUME_FIELDS
from ..runs.store import RunStore
from ..specs import MethodSpec
from .common import OomLadder, PointOOM, Progress, SilentProgress, head_parts, oom_guard, point_row
from .positions import add_sums, bucket_sums, key_sums
from .sweep import DocumentBatch, WorkItem, document_items, length_dependent, run_items

PROTOCOLS = ("truncate", "sliding")
DEFAULT_CHUNK = 1024


@dataclass(frozen=True)
class PplConfig:
    lengths: tuple[int, ...]
    protocol: str = "truncate"
    stride: int | None = None
    bos: bool = True
    chunk_size: int = DEFAULT_CHUNK
    position_edges: tuple[int, ...] = ()  # loss-by-position buckets (positions.py); () = none recorded
    batch_size: int = 1  # sequences of one length per forward: sliding windows, or truncate's documents

    def __post_init__(self) -> None:
        if not self.lengths:
            raise CtxevalError("give at least one --lengths value")
        if min(self.lengths) < 2:
            raise CtxevalError(f"every length must be >= 2 tokens, got {min(self.lengths)}")
        if self.protocol not in PROTOCOLS:
            raise CtxevalError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got '{self.protocol}'")
        if self.chunk_size < 1:
            raise CtxevalError(f"--chunk-size must be >= 1, got {self.chunk_size}")
        if self.batch_size < 1:
            raise CtxevalError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.protocol == "sliding":
            if self.stride is None or self.stride < 1:
                raise CtxevalError(f"--protocol sliding needs --stride S >= 1, got {self.stride}")
            limit = min(self.lengths) - 1  # the next window must start no later than the first unscored token
            if self.stride > limit:
                raise CtxevalError(
                    f"--stride {self.stride} is longer than a window's scored span ({limit} tokens at length "
                    f"{min(self.lengths)}): tokens would be skipped; use --stride <= {limit}"
                )
        elif self.stride is not None:
            raise CtxevalError("--stride applies only to --protocol sliding")

    def doc_tokens_needed(self, length: int) -> int:
        """Document tokens in a sequence of `length` tokens (one slot goes to BOS)."""
        return length - 1 if self.bos else length


# ---------------------------------------------------------------------------------------------------------------
# chunked loss


@torch.inference_mode()
def token_nll(model: torch.nn.Module, input_ids: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Per-token NLL of input_ids[t+1] given input_ids[:t+1], never materialising [length x vocab] logits.

    input_ids: (1, n) -> returns (n-1,) float32 on the CPU. The LM head + cross entropy run over chunks of
    `chunk_size` positions of the body's hidden states.
    """
    return batch_token_nll(model, input_ids, chunk_size)[0]


@torch.inference_mode()
def batch_token_nll(model: torch.nn.Module, input_ids: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> torch.Tensor:
    """token_nll of B independent sequences of one length in one forward: (B, n) -> (B, n-1) float32 on the CPU.
    The LM head runs over chunks of about `chunk_size` positions in all (chunk_size // B per sequence)."""
    body, head, post = head_parts(model)
    hidden = body(input_ids=input_ids, use_cache=False).last_hidden_state  # (B, n, hidden)
    targets = input_ids[:, 1:]  # (B, n-1)
    batch, n = targets.shape
    step = max(1, chunk_size // batch)
    out = None  # (B, n-1) on the logits' device: one copy to the host at the end, not one sync per chunk
    for start in range(0, n, step):
        stop = min(start + step, n)
        logits = post(head(hidden[:, start:stop]).float())  # (B, chunk, vocab)
        if out is None:
            out = torch.empty(batch, n, dtype=torch.float32, device=logits.device)
        # under --device-map the head may sit on another GPU than the embeddings (and so the targets)
        nll = F.cross_entropy(
            logits.flatten(0, 1), targets[:, start:stop].flatten().to(logits.device), reduction="none"
        )
        out[:, start:stop] = nll.view(batch, stop - start)
    return out.cpu() if out is not None else torch.empty(batch, 0)


@torch.inference_mode()
def check_chunked_head(model: torch.nn.Module, device: str, vocab_size: int) -> float:
    """Compare the chunked path with the model's own forward on a short input; refuse models whose logits we do not
    reproduce (custom post-processing). Returns the max relative logit difference."""
    body, head, post = head_parts(model)
    ids = torch.arange(1, 17, device=device).remainder(vocab_size).unsqueeze(0)  # (1, 16)
    want = model(input_ids=ids, use_cache=False).logits[0].float()
    got = post(head(body(input_ids=ids, use_cache=False).last_hidden_state[0]).float()).to(want.device)
    diff = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
    if not diff < 1e-3:
        raise CtxevalError(
            f"{type(model).__name__}'s logits differ from body + LM head by {diff:.1e}: it post-processes logits in a "
            "way ctxeval does not reproduce, so its perplexity would be wrong; please report this model"
        )
    return diff


# ---------------------------------------------------------------------------------------------------------------
# protocols


def _sequence(doc: np.ndarray, start: int, n_doc: int, bos: int | None) -> list[int]:
    ids = doc[start : start + n_doc].tolist()
    return ([bos] if bos is not None else []) + ids


class NonFiniteLoss(Exception):
    """A forward gave an infinite or NaN loss: the point is an error row, never an `ok` perplexity."""


class PplRunner:
    """Measures the lengths it is given of one method on one document (or a batch of documents) and hands each
    point's row to `emit`: ok, error (non-finite loss), oom, or skipped past a length that ran out of memory. Which
    points are still to measure is the sweep's to decide."""

    KEY = RESUME_FIELDS["ppl"]

    def __init__(
        self,
        model: torch.nn.Module,
        device: str,
        cfg: PplConfig,
        bos_id: int | None,
        model_name: str,
        progress: Progress | None = None,
    ) -> None:
        if cfg.bos and bos_id is None:
            cfg = replace(cfg, bos=False)  # a tokenizer without BOS: sequences start with document text
        self.model, self.device, self.cfg = model, device, cfg
        self.bos = bos_id if cfg.bos else None
        self.model_name = model_name
        self.progress = progress or SilentProgress()
        self.dynamic: set[str] = set()  # labels whose RoPE depends on the length (set by sweep)
        self.key_positions: dict[str, np.ndarray] | None = None  # doc id -> LongPPL key tokens (set by sweep)
        self.forward_tokens, self.forward_seconds, self.peak_bytes = 0, 0.0, None  # of the point being measured

    def length_dependent(self, spec: MethodSpec) -> bool:
        """Whether `spec` needs one forward per length: its RoPE changes with the sequence length (the method's, or a
        checkpoint's own dynamic RoPE under native, which the sweep marks in `dynamic`)."""
        return spec.label in self.dynamic or spec.length_dependent

    def _speed(self) -> dict[str, Any]:
        """Throughput and peak memory of the forwards since the last call (a point's, or one forward's lengths')."""
        fields = {
            "tokens_per_s": round(self.forward_tokens / self.forward_seconds, 1) if self.forward_seconds else None,
            "peak_gib": round(self.peak_bytes / 2**30, 3) if self.peak_bytes is not None else None,
        }
        self.forward_tokens, self.forward_seconds, self.peak_bytes = 0, 0.0, None
        return fields

    def _nll(self, seq: list[int], finite: bool = True) -> torch.Tensor:
        """Per-token NLL of one sequence; `finite`: an infinite or NaN loss raises NonFiniteLoss."""
        return self._nll_batch([seq], finite)[0]

    def _nll_batch(self, seqs: list[list[int]], finite: bool = True) -> torch.Tensor:
        """Per-token NLL of sequences of one length, in one forward: (B, n-1)."""
        ids = torch.tensor(seqs, device=self.device)
        cuda = str(self.device).startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with oom_guard(self.device):
            nll = (
                token_nll(self.model, ids, self.cfg.chunk_size).unsqueeze(0)
                if len(seqs) == 1
                else batch_token_nll(self.model, ids, self.cfg.chunk_size)
            )
        self.forward_tokens += ids.numel()
        self.forward_seconds += time.perf_counter() - start
        if cuda:
            self.peak_bytes = max(self.peak_bytes or 0, torch.cuda.max_memory_allocated())
        bad = (~torch.isfinite(nll)).nonzero()
        if finite and len(bad):
            row, col = int(bad[0, 0]), int(bad[0, 1])
            raise NonFiniteLoss(
                f"non-finite NLL ({float(nll[row, col])}) at position {col + 1} of "
                f"{ids.shape[1]}: the forward overflowed (try --dtype float32)"
            )
        return nll

    def _row(self, spec: MethodSpec, length: int, doc: str, **fields: Any) -> dict[str, Any]:
        return point_row(self.model_name, spec, "ppl", protocol=self.cfg.protocol, length=length, doc=doc, **fields)

    def _ok(
        self,
        spec: MethodSpec,
        length: int,
        doc: str,
        nll_sum: float,
        n: int,
        window_sum: float,
        n_windows: int,
        seconds: float,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        mean = nll_sum / n
        return self._row(
            spec,
            length,
            doc,
            status="ok",
            metric="nll",
            value=mean,
            ppl=math.exp(mean),
            nll_sum=nll_sum,
            n_tokens=n,
            window_nll_sum=window_sum,
            n_windows=n_windows,
            seconds=round(seconds, 3),
            **extra,
        )

    def _by_position(self, sums: tuple[list[float], list[int]] | None) -> dict[str, Any]:
        if not self.cfg.position_edges or sums is None:
            return {}
        return {
            "position_edges": list(self.cfg.position_edges),
            "position_nll_sum": sums[0],
            "position_tokens": sums[1],
        }

    def _truncate_fields(self, nll: np.ndarray, length: int, doc: str) -> dict[str, Any]:
        """Loss by position and key-token sums of a truncate point: nll (length-1,) predicts positions 1..length-1."""
        extra = self._by_position(bucket_sums(nll, 1, self.cfg.position_edges) if self.cfg.position_edges else None)
        if self.key_positions is not None:
            key_sum, n_key = key_sums(nll, self.key_positions[doc], length)
            extra.update(key_nll_sum=key_sum, key_tokens=n_key)
        return extra

    # -- truncate ----------------------------------------------------------------------------------------------------
    def _truncate_one_forward(self, spec: MethodSpec, doc: TokenDoc, lengths: list[int]) -> list[dict[str, Any]]:
        top = max(lengths)
        start = time.perf_counter()
        nll = self._nll(_sequence(doc.ids, 0, self.cfg.doc_tokens_needed(top), self.bos), finite=False).double()
        seconds = time.perf_counter() - start  # nll: (top-1,)
        return self._rows_from_nll(spec, doc, lengths, nll, seconds, self._speed())

    def _rows_from_nll(
        self,
        spec: MethodSpec,
        doc: TokenDoc,
        lengths: list[int],
        nll: torch.Tensor,
        seconds: float,
        speed: dict[str, Any],
    ) -> list[dict[str, Any]]:
        """The truncate rows of `lengths` from one forward's per-token NLL at max(lengths): nll (max - 1,) float64."""
        top = max(lengths)
        cums = torch.cumsum(nll, 0)
        values = nll.numpy()
        finite_until = int((~torch.isfinite(nll)).nonzero()[0, 0]) if not torch.isfinite(nll).all() else len(nll)
        rows = []
        for length in lengths:
            n = length - 1
            if n > finite_until:  # causal: the lengths before the first non-finite loss are unaffected by it
                rows.append(
                    self._row(
                        spec,
                        length,
                        doc.doc_id,
                        status="error",
                        note=f"non-finite NLL ({float(nll[finite_until])}) at position "
                        f"{finite_until + 1}: the forward overflowed (try --dtype float32)",
                    )
                )
                continue
            total = float(cums[n - 1])
            # one forward serves every length; its time is attributed in proportion to the tokens
            rows.append(
                self._ok(
                    spec,
                    length,
                    doc.doc_id,
                    total,
                    n,
                    total / n,
                    1,
                    seconds * n / (top - 1),
                    {**self._truncate_fields(values[:n], length, doc.doc_id), **speed},
                )
            )
        return rows

    def _truncate_at(self, spec: MethodSpec, doc: TokenDoc, length: int) -> dict[str, Any]:
        """One length in its own forward (length-dependent methods; after an out-of-memory at the longest)."""
        return self._truncate_one_forward(spec, doc, [length])[0]

    # -- sliding -----------------------------------------------------------------------------------------------------
    def _sliding_windows(self, doc: TokenDoc, length: int) -> list[tuple[int, int, int]]:
        """(begin, end, scored_until) of each window: doc tokens begin..end-1 read, those from scored_until on new."""
        content = self.cfg.doc_tokens_needed(length)
        n = len(doc.ids)
        scored_until = 0 if self.bos is not None else 1  # first doc token index not yet scored
        windows = []
        for begin in range(0, n, self.cfg.stride):
            end = min(begin + content, n)  # > scored_until: the stride is at most a window's scored span
            if end - begin < (1 if self.bos is not None else 2):
                break
            windows.append((begin, end, scored_until))
            scored_until = end
            if end == n:
                break
        return windows

    def _window_nlls(
        self, label: str, length: int, doc: TokenDoc, windows: list[tuple[int, int, int]], ladder: OomLadder
    ) -> list[torch.Tensor]:
        """Each window's per-token NLL, `batch_size` windows of one length per forward (the ragged last ones
        alone), down the out-of-memory ladder (PointOOM when one window alone does not fit)."""

        def same_size(group: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
            size = group[0][1] - group[0][0]
            return group[: next((k for k, w in enumerate(group) if w[1] - w[0] != size), len(group))]

        def nll(group: list[tuple[int, int, int]]) -> torch.Tensor:
            return self._nll_batch([_sequence(doc.ids, b, e - b, self.bos) for b, e, _ in group])  # (B, window - 1)

        out: list[torch.Tensor] = []
        for _, rows in ladder.batches(label, length, windows, self.cfg.batch_size, self.progress, nll, same_size):
            out += [row.double() for row in rows]
        return out

    def _sliding_at(
        self, spec: MethodSpec, doc: TokenDoc, length: int, ladder: OomLadder | None = None
    ) -> dict[str, Any]:
        start_time = time.perf_counter()
        nll_sum, n_tok, window_sum, n_windows = 0.0, 0, 0.0, 0
        by_position = None  # a token's position is its index in the window that scores it
        windows = self._sliding_windows(doc, length)
        nlls = self._window_nlls(spec.label, length, doc, windows, OomLadder() if ladder is None else ladder)
        for (begin, _end, scored_until), nll in zip(windows, nlls):
            # nll[j] predicts doc token begin + j (with BOS) or begin + j + 1 (without)
            first_target = begin if self.bos is not None else begin + 1
            new = nll[scored_until - first_target :]
            if self.cfg.position_edges:  # new[0] is at window position scored_until - first_target + 1
                by_position = add_sums(
                    by_position, bucket_sums(new.numpy(), scored_until - first_target + 1, self.cfg.position_edges)
                )
            nll_sum += float(new.sum())
            n_tok += new.numel()
            window_sum += float(new.mean())
            n_windows += 1
        return self._ok(
            spec,
            length,
            doc.doc_id,
            nll_sum,
            n_tok,
            window_sum,
            n_windows,
            time.perf_counter() - start_time,
            {**self._by_position(by_position), **self._speed()},
        )

    # -- driver ------------------------------------------------------------------------------------------------------
    def cost(self, spec: MethodSpec, docs: list[TokenDoc], pending: dict[tuple[str, str], list[int]]) -> int:
        """Tokens to forward for the pending points (progress total)."""
        total = 0
        for doc in docs:
            lengths = pending.get((spec.label, doc.doc_id), [])
            if not lengths:
                continue
            if self.cfg.protocol == "sliding":
                total += sum(len(doc.ids) * length // self.cfg.stride for length in lengths)
            elif self.length_dependent(spec):
                total += sum(lengths)
            else:
                total += max(lengths)
        return total

    def measure_docs(
        self,
        spec: MethodSpec,
        docs: list[TokenDoc],
        lengths: list[int],
        emit: Callable[[list[dict]], None],
        ladder: OomLadder | None = None,
    ) -> None:
        """Measure `lengths` of several documents; under truncate with --batch-size > 1 their equal-length sequences
        share forwards (one at max(lengths) for a static method, one per length for a length-dependent one), with
        the same rows as one document at a time. Out of memory halves the batch (`ladder`: one per sweep, a fresh one
        by default); one document goes through measure."""
        ladder = OomLadder() if ladder is None else ladder
        if len(docs) == 1 or self.cfg.protocol != "truncate" or ladder.skipped_at(spec.label, max(lengths)) is not None:
            for doc in docs:
                self.measure(spec, doc, lengths, emit, ladder)
            return
        size = ladder.first_batch(spec.label, max(lengths), len(docs))
        if size < len(docs):  # a halved batch fitted these lengths before: start there
            for i in range(0, len(docs), size):
                self.measure_docs(spec, docs[i : i + size], lengths, emit, ladder)
            return
        static = not self.length_dependent(spec)
        groups = [sorted(lengths)] if static else [[L] for L in sorted(lengths)]
        done: list[int] = []
        for group in groups:
            top = max(group)
            seqs = [_sequence(d.ids, 0, self.cfg.doc_tokens_needed(top), self.bos) for d in docs]
            start = time.perf_counter()
            try:
                nll = self._nll_batch(seqs, finite=False).double()  # (B, top-1)
            except PointOOM:
                rest = [L for L in lengths if L not in done]
                half = ladder.halve(spec.label, top, len(docs), self.progress)
                self.measure_docs(spec, docs[:half], rest, emit, ladder)
                self.measure_docs(spec, docs[half:], rest, emit, ladder)
                return
            seconds, speed = (time.perf_counter() - start) / len(docs), self._speed()
            emit([r for d, row in zip(docs, nll) for r in self._rows_from_nll(spec, d, group, row, seconds, speed)])
            done += group
            self.progress.advance(top * len(docs), f"{spec.label} {docs[0].doc_id} (+{len(docs) - 1} docs) ppl@{top}")

    def measure(
        self,
        spec: MethodSpec,
        doc: TokenDoc,
        lengths: list[int],
        emit: Callable[[list[dict]], None],
        ladder: OomLadder | None = None,
    ) -> None:
        """Measure `lengths` (ascending) of one method on one document, emitting rows point by point; out of memory
        follows `ladder` (one per sweep, a fresh one by default)."""
        ladder = OomLadder() if ladder is None else ladder
        skipped = [x for x in sorted(lengths) if ladder.skipped_at(spec.label, x) is not None]
        for length in skipped:
            emit([self._row(spec, length, doc.doc_id, status="skipped", note=ladder.skip_note(spec.label))])
        lengths = sorted(x for x in lengths if x not in skipped)
        static = not self.length_dependent(spec)
        if self.cfg.protocol == "truncate" and static and len(lengths) > 1:
            try:
                rows = self._truncate_one_forward(spec, doc, lengths)
                emit(rows)
                self.progress.advance(
                    max(lengths),
                    f"{spec.label} {doc.doc_id} ppl@{max(lengths)} {rows[-1].get('ppl', float('nan')):.2f}",
                )
                return
            except PointOOM:
                self.progress.note(f"{spec.label}: out of memory at {max(lengths)} tokens; measuring length by length")
        for i, length in enumerate(lengths):
            try:
                if self.cfg.protocol == "truncate":
                    row = self._truncate_at(spec, doc, length)
                else:
                    row = self._sliding_at(spec, doc, length, ladder)
            except NonFiniteLoss as exc:
                emit([self._row(spec, length, doc.doc_id, status="error", note=str(exc)[:300])])
                self.progress.note(f"{spec.label} L={length} {doc.doc_id}: {exc}")
                continue
            except PointOOM as exc:
                emit([self._row(spec, length, doc.doc_id, status="oom", note=str(exc)[:300])])
                ladder.give_up(spec.label, length, self.progress)
                note = ladder.skip_note(spec.label)
                for longer in lengths[i + 1 :]:
                    emit([self._row(spec, longer, doc.doc_id, status="skipped", note=note)])
                return
            emit([row])
            cost = len(doc.ids) * length // self.cfg.stride if self.cfg.protocol == "sliding" else length
            self.progress.advance(cost, f"{spec.label} L={length} {doc.doc_id} ppl {row.get('ppl', float('nan')):.2f}")


def sweep(
    lm: LoadedModel,
    specs: list[MethodSpec],
    docs: list[TokenDoc],
    cfg: PplConfig,
    store: RunStore,
    progress: Progress | None = None,
    key_positions: dict[str, np.ndarray] | None = None,
) -> None:
    """Measure every (method, length, document) point not yet in `store`, one method applied at a time.

    The weights are loaded once (`lm`); methods are swapped in place with apply_method and restored after.
    `key_positions` (doc id -> LongPPL key tokens, key_tokens.find_key_tokens) adds each point's key-token sums."""
    progress = progress or SilentProgress()
    runner = PplRunner(lm.model, lm.device, cfg, getattr(lm.tokenizer, "bos_token_id", None), lm.name, progress)
    runner.key_positions = key_positions
    runner.dynamic = {s.label for s in specs if length_dependent(s, lm)}
    sliding = cfg.protocol == "sliding"
    # one forward serves a static method's lengths under truncate; sliding and dynamic methods go length by length
    items = document_items(
        specs,
        docs,
        cfg.lengths,
        store.done_points(PplRunner.KEY),
        per_length=lambda spec: sliding or spec.label in runner.dynamic,
        windows=lambda doc: len(doc.ids) // cfg.stride if sliding else 1,
        tokens=lambda spec, doc, group: runner.cost(spec, [doc], {(spec.label, doc.doc_id): group}),
    )
    if cfg.protocol == "truncate" and cfg.batch_size > 1:
        items = batch_documents(items, cfg.batch_size)
    ladder = OomLadder()
    run_items(
        lm,
        specs,
        items,
        cfg.lengths,
        store,
        progress,
        lambda spec, batch, _handle: runner.measure_docs(
            spec, list(batch.documents), list(batch.lengths), store.append, ladder
        ),
    )


def batch_documents(items: list[WorkItem[DocumentBatch]], batch_size: int) -> list[WorkItem[DocumentBatch]]:
    """Merge the items of one method whose documents wait for the same lengths into batches of `batch_size`
    documents; their sequences have equal lengths, so they share forwards."""
    groups: dict[tuple[int, tuple[int, ...]], list[WorkItem[DocumentBatch]]] = {}
    for item in items:
        groups.setdefault((item.spec_index, item.payload.lengths), []).append(item)
    merged = []
    for (_, lengths), members in groups.items():
        for i in range(0, len(members), batch_size):
            part = members[i : i + batch_size]
            merged.append(
                WorkItem(
                    part[0].spec_index,
                    DocumentBatch(tuple(doc for m in part for doc in m.payload.documents), lengths),
                    sum(m.cost for m in part),
                    sum(m.tokens for m in part),
                    part[0].length,
                )
            )
    return merged
