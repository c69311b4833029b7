"""What one trial of `ctxeval tune` measures: the search's settings (TuneConfig) and the scorer that applies a method
in place (with the read-back check every measurement has) and measures the tuning documents: truncate perplexity at
the trained and the target length (one forward per document for a static method), and with --objective needle or
both the pass keys' answer perplexity in the same forward (needles.py)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...data.corpora import TokenDoc
from ...errors import CtxevalError
from ...models.load import LoadedModel
from ...rope.methods import START_TOKENS, compute
from ...specs import MethodSpec
from ..perplexity import PplConfig, PplRunner, token_nll
from ..sweep import applying, length_dependent
from .needles import OBJECTIVES, NeedleDoc, NeedleNll, needle_docs, split_nll

SAMPLERS = ("auto", "gp", "tpe", "cmaes", "nsga2", "random")


@dataclass(frozen=True)
class TuneConfig:
    target: int  # the length whose perplexity is minimised
    short: int  # the trained length: the guard's length
    trials: int = 100  # finished trials the study should hold (every process together)
    short_tolerance: float = 0.05  # allowed rise of the ppl at `short` over plain RoPE's
    sampler: str = "auto"
    seed: int = 0
    population: int = 32  # nsga2's population (LongRoPE's parents)
    bos: bool = True
    chunk_size: int = 1024
    objective: str = "ppl"  # ppl | needle | both (needles.py)

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise CtxevalError(f"--sampler must be one of {', '.join(SAMPLERS)}, got '{self.sampler}'")
        if self.objective not in OBJECTIVES:
            raise CtxevalError(f"--objective must be one of {', '.join(OBJECTIVES)}, got '{self.objective}'")
        if self.trials < 1:
            raise CtxevalError(f"--trials must be >= 1, got {self.trials}")
        if self.population < 2:
            raise CtxevalError(f"--population must be >= 2, got {self.population}")
        if not (self.short_tolerance >= 0 and math.isfinite(self.short_tolerance)):
            raise CtxevalError(f"--short-tolerance must be a finite number >= 0, got {self.short_tolerance}")

    @property
    def lengths(self) -> tuple[int, int]:
        return (self.short, self.target)


@dataclass(frozen=True)
class Score:
    target_ppl: float | None
    short_ppl: float | None
    tokens: int  # tokens forwarded
    forwards: int
    seconds: float
    readback_max_rel_diff: float | None
    problem: str | None = None  # why the point has no perplexity (non-finite loss, out of memory)
    answer_ppl: float | None = None  # the pass keys' answer perplexity at the target (--objective needle / both)


class TrialScorer:
    """Perplexity of a method at the trained and the target length on the tuning documents.

    A length-dependent method takes one forward per length; its forwards at the trained length are reused across
    trials whose RoPE at that length is the same (LongRoPE's long factors change nothing up to L, so a LongRoPE search
    measures the short length once per attention factor, not once per trial)."""

    def __init__(self, lm: LoadedModel, docs: list[TokenDoc], cfg: TuneConfig) -> None:
        self.lm, self.docs, self.cfg = lm, docs, cfg
        self.needles: list[NeedleDoc] = []
        if cfg.objective != "ppl":  # the pass keys are in the documents: one forward gives both perplexities
            bos = getattr(lm.tokenizer, "bos_token_id", None) if cfg.bos else None
            self.needles = needle_docs(docs, lm.tokenizer, cfg.target, bos, cfg.seed)
        self.short_needles: dict[tuple, NeedleNll] = {}
        ppl_cfg = PplConfig(cfg.lengths, bos=cfg.bos, chunk_size=cfg.chunk_size)
        self.runner = PplRunner(lm.model, lm.device, ppl_cfg, getattr(lm.tokenizer, "bos_token_id", None), lm.name)
        self.short_rows: dict[tuple, list[dict[str, Any]]] = {}  # RoPE at the short length -> its rows

    def short_key(self, spec: MethodSpec) -> tuple:
        """What decides a length-dependent method's forward at the short length: its RoPE there (exact bytes),
        LongRoPE's start tokens, the attention methods and the temperature."""
        freqs = compute(spec.method, self.lm.rope.geometry, spec.params, self.cfg.short)
        return (
            freqs.inv_freq.tobytes(),
            freqs.attention_factor,
            int(spec.resolved.get(START_TOKENS) or 0),
            spec.temperature,
            tuple((a.name, tuple(sorted(a.params.items()))) for a in spec.attention),
        )

    def score(self, spec: MethodSpec) -> Score:
        if self.needles:
            return self.needle_score(spec)
        start = time.perf_counter()
        rows: list[dict[str, Any]] = []
        dynamic = length_dependent(spec, self.lm)
        self.runner.dynamic = {spec.label} if dynamic else set()
        key = self.short_key(spec) if dynamic and spec.name != "native" else None
        cached = self.short_rows.get(key) if key is not None else None
        lengths = [self.cfg.target] if cached is not None else list(self.cfg.lengths)
        with applying(self.lm, spec, self.cfg.lengths) as (_handle, record):
            for doc in self.docs:
                self.runner.measure(spec, doc, lengths, rows.extend)
        if key is not None and cached is None:
            self.short_rows[key] = [r for r in rows if r["length"] == self.cfg.short]
        rows += cached or []
        diffs = [e["max_rel_diff"] for e in record.get("effective", [])]
        forwards = len(self.docs) * (len(lengths) if dynamic else 1)
        tokens = len(self.docs) * (sum(lengths) if dynamic else self.cfg.target)
        seconds = time.perf_counter() - start
        bad = [r for r in rows if r.get("status") != "ok"]
        if bad:
            return Score(
                None,
                None,
                tokens,
                forwards,
                seconds,
                max(diffs, default=None),
                f"{bad[0].get('status')}: {bad[0].get('note', '')}"[:300],
            )
        ppl = {}
        for length in self.cfg.lengths:
            at = [r for r in rows if r["length"] == length]
            ppl[length] = math.exp(sum(r["nll_sum"] for r in at) / sum(r["n_tokens"] for r in at))
        return Score(ppl[self.cfg.target], ppl[self.cfg.short], tokens, forwards, seconds, max(diffs, default=None))

    def needle_score(self, spec: MethodSpec) -> Score:
        """The needle documents' own-token perplexity at both lengths and the answers' perplexity at the target, from
        one forward per document (a length-dependent method: one more at the trained length, reused like
        short_rows)."""
        start = time.perf_counter()
        dynamic = length_dependent(spec, self.lm)
        key = self.short_key(spec) if dynamic and spec.name != "native" else None
        cached = self.short_needles.get(key) if key is not None else None
        target = short = NeedleNll(0.0, 0, 0.0, 0)
        forwards = tokens = 0
        try:
            with applying(self.lm, spec, self.cfg.lengths) as (_handle, record):
                for doc in self.needles:
                    ids = torch.tensor([doc.ids], dtype=torch.long, device=self.lm.device)  # (1, target)
                    nll = finite_nll(self.lm.model, ids, self.cfg.chunk_size)  # (target - 1,)
                    target, forwards, tokens = target + split_nll(doc, nll), forwards + 1, tokens + len(doc.ids)
                    if not dynamic:
                        short = short + split_nll(doc, nll, self.cfg.short)
                    elif cached is None:
                        head = finite_nll(self.lm.model, ids[:, : self.cfg.short], self.cfg.chunk_size)
                        short = short + split_nll(doc, head, self.cfg.short)
                        forwards, tokens = forwards + 1, tokens + self.cfg.short
        except NonFinite as exc:
            return Score(None, None, tokens, forwards, time.perf_counter() - start, None, f"error: {exc}")
        if key is not None:
            short = self.short_needles.setdefault(key, short) if cached is None else cached
        diffs = [e["max_rel_diff"] for e in record.get("effective", [])]
        seconds = time.perf_counter() - start
        return Score(
            target.ppl, short.ppl, tokens, forwards, seconds, max(diffs, default=None), answer_ppl=target.answer_ppl
        )


class NonFinite(Exception):
    """A forward gave an infinite or NaN loss on a needle document."""


def finite_nll(model: Any, ids: torch.Tensor, chunk_size: int) -> np.ndarray:
    """token_nll as float64 numpy; an infinite or NaN loss raises NonFinite."""
    nll = token_nll(model, ids, chunk_size).double().numpy()
    if not np.isfinite(nll).all():
        raise NonFinite("non-finite loss")
    return nll
