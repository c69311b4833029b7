"""Needle in a haystack and passkey, measured: every (method, length, depth, sample) scored without an LLM judge,
by teacher-forcing the answer (`forced`) or by greedy generation (`generate`), one row per sample, resumable.

The prompts come from haystack.py (built in token space at exact lengths). This is `ctxeval needle` and `ctxeval
passkey --protocol ctxeval`; passkey.py holds `--protocol yarn` (the YaRN repository's own passkey test), which runs
on NeedleRunner. Out of memory follows common.OomLadder; generation is models.generation's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..errors import CtxevalError
from ..models.generation import greedy_replies, stop_ids, streams, timed_replies, until_stop
from ..models.protocol import LanguageModel
from ..models.vllm_engine import VllmModel
from ..runs.rows import RESUME_FIELDS, point_key
from ..runs.store import RunStore
from ..specs import MethodSpec
from .common import OomLadder, PointOOM, Progress, SilentProgress, head_parts, numbered, oom_guard, point_row
from .haystack import Prompt, PromptBuilder, Sample, make_sample, score_response
from .sweep import WorkItem, forward_cost, run_items

SCORINGS = ("generate", "forced")


@dataclass(frozen=True)
class NeedleConfig:
    lengths: tuple[int, ...]
    depths: tuple[float, ...]  # ignored when random_depth
    samples: int = 1
    scoring: str = "generate"
    max_new_tokens: int | None = None  # None: the answer's token count + 8
    seed: int = 0
    random_depth: bool = False  # passkey: a uniform random depth per sample
    batch_size: int = 4  # prompts of one length per forward (generate: of one token length and budget)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise CtxevalError("give at least one --lengths value")
        if self.samples < 1:
            raise CtxevalError(f"--samples must be >= 1, got {self.samples}")
        if self.scoring not in SCORINGS:
            raise CtxevalError(f"--scoring must be one of {', '.join(SCORINGS)}, got '{self.scoring}'")
        bad = [d for d in self.depths if not 0 <= d <= 100]
        if bad:
            raise CtxevalError(f"depths are percentages in 0..100, got {bad[0]:g}")
        if not self.random_depth and not self.depths:
            raise CtxevalError("give at least one --depths value")
        if self.batch_size < 1:
            raise CtxevalError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise CtxevalError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")

    def cells(self) -> list[tuple[int, int, int]]:
        """(length, depth index, sample) for every sample; with random_depth the depth index is 0."""
        depth_count = 1 if self.random_depth else len(self.depths)
        return [(L, d, s) for L in self.lengths for d in range(depth_count) for s in range(self.samples)]

    def rng(self, length: int, depth_index: int, sample: int) -> np.random.Generator:
        """The same seed gives the same needle, key, offset (and passkey depth) for every method."""
        return np.random.default_rng([self.seed, length, depth_index, sample])


@dataclass
class NeedleItem:
    """One sample of one cell: its seeded sample, depth and prompt (`prompt` is a Prompt, or any object with `ids`,
    `answer_ids` and `haystack_tokens`, such as passkey.YarnPrompt)."""

    length: int
    depth_index: int
    sample_index: int
    depth: float
    sample: Sample
    prompt: Prompt


class NeedleRunner:
    KEY = RESUME_FIELDS["needle"]

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        device: str,
        builder: PromptBuilder,
        cfg: NeedleConfig,
        model_name: str,
        task: str,
        progress: Progress | None = None,
    ) -> None:
        self.model, self.tok, self.device, self.builder, self.cfg = model, tokenizer, device, builder, cfg
        self.model_name, self.task = model_name, task
        self.progress = progress or SilentProgress()

    def budget(self, sample: Sample) -> int:
        if self.cfg.scoring == "forced":
            return len(self.builder.answer_ids(sample))
        return self.cfg.max_new_tokens or len(self.builder.answer_ids(sample)) + 8

    def _sample_and_depth(
        self, length: int, depth_index: int, sample_index: int
    ) -> tuple[np.random.Generator, Sample, float]:
        rng = self.cfg.rng(length, depth_index, sample_index)
        sample = make_sample(self.builder.preset, rng)
        depth = round(float(rng.uniform(0, 100)), 2) if self.cfg.random_depth else self.cfg.depths[depth_index]
        return rng, sample, depth

    def depth(self, cell: tuple[int, int, int]) -> float:
        return self._sample_and_depth(*cell)[2]

    def item(self, length: int, depth_index: int, sample_index: int) -> NeedleItem:
        rng, sample, depth = self._sample_and_depth(length, depth_index, sample_index)
        prompt = self.builder.build(length, depth, sample, rng, self.budget(sample))
        return NeedleItem(length, depth_index, sample_index, depth, sample, prompt)

    def score(self, sample: Sample, response: str) -> bool:
        """Whether a generated `response` answers `sample` (the preset's rule: score_response)."""
        return score_response(self.builder.preset, sample, response)

    def row_fields(self, it: NeedleItem) -> dict[str, Any]:
        """Fields a row of `it` carries besides the common ones (none here; a subclass's protocol adds its own)."""
        return {}

    def batch_order(self, items: list[NeedleItem]) -> list[NeedleItem]:
        """The order in which the prompts of one measure call run (as built here; generate batches the leading
        prompts of one shape, so a subclass whose prompt lengths vary sorts them to batch more)."""
        return items

    def describe(self, spec: MethodSpec, chunk: list[NeedleItem], results: list[dict[str, Any]]) -> str:
        """The progress line of one scored batch, naming its prompts: 'none L=600 depth 50% sample 2/5 ok', or
        'none L=600 prompts 3-6/10 (depth 25-50%) 3/4 ok' (prompts numbered depth by depth within the length)."""
        samples = self.cfg.samples
        depth_count = 1 if self.cfg.random_depth else len(self.cfg.depths)
        hits = sum(bool(r["correct"]) for r in results)
        if len(chunk) == 1:
            it = chunk[0]
            return (
                f"{spec.label} L={it.length} depth {it.depth:g}% "
                f"{numbered('sample', [it.sample_index + 1], samples)} {'ok' if hits else 'miss'}"
            )
        noun = "sample" if depth_count == 1 else "prompt"
        which = numbered(noun, [it.depth_index * samples + it.sample_index + 1 for it in chunk], depth_count * samples)
        low, high = min(it.depth for it in chunk), max(it.depth for it in chunk)
        depth = f"{low:g}%" if low == high else f"{low:g}-{high:g}%"
        return f"{spec.label} L={chunk[0].length} {which} (depth {depth}) {hits}/{len(chunk)} ok"

    def _row(self, spec: MethodSpec, it: NeedleItem, **fields: Any) -> dict[str, Any]:
        return point_row(
            self.model_name,
            spec,
            self.task,
            value=fields.get("correct"),
            preset=self.builder.preset.name,
            scoring=self.cfg.scoring,
            length=it.length,
            depth=it.depth,
            sample=it.sample_index,
            answer=", ".join(it.sample.answers),
            prompt_tokens=len(it.prompt.ids),
            answer_tokens=len(it.prompt.answer_ids),
            haystack_tokens=it.prompt.haystack_tokens,
            **self.row_fields(it),
            **fields,
        )

    # -- forced: one forward over prompt + answer, batched by length ---------------------------------------------
    @torch.inference_mode()
    def _forced(self, items: list[NeedleItem]) -> list[dict[str, Any]]:
        body, head, post = head_parts(self.model)
        seqs = [it.prompt.ids + it.prompt.answer_ids for it in items]
        batch = torch.tensor(seqs, device=self.device)  # (B, length): equal lengths by construction
        hidden = body(input_ids=batch, use_cache=False).last_hidden_state  # (B, length, hidden)
        out = []
        for b, it in enumerate(items):
            n_prompt, n_answer = len(it.prompt.ids), len(it.prompt.answer_ids)
            logits = post(head(hidden[b, n_prompt - 1 : n_prompt - 1 + n_answer]).float())  # (n_answer, vocab)
            target = torch.tensor(it.prompt.answer_ids, device=logits.device)
            nll = float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
            pred = logits.argmax(-1)
            out.append(
                {
                    "correct": int(bool((pred == target).all())),
                    "answer_nll": nll,
                    "response": self.tok.decode(pred.tolist()),
                }
            )
        return out

    # -- generate: greedy decoding ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def _generate(self, it: NeedleItem, handle: Any) -> dict[str, Any]:
        return self._generate_batch([it], handle)[0]

    def _generate_batch(self, items: list[NeedleItem], handle: Any) -> list[dict[str, Any]]:
        """Greedy replies to prompts of one token length and one budget, in one generate call (no padding), the RoPE
        of a length-dependent method frozen at the longest sequence this generation can reach (prompt + budget: the
        length itself wherever the prompt is built to it)."""
        ids = torch.tensor([it.prompt.ids for it in items], device=self.device)  # (B, prompt tokens)
        budget = self.budget(items[0].sample)
        replies = greedy_replies(self.model, self.tok, ids, torch.ones_like(ids), budget, handle, ids.shape[1] + budget)
        stops = stop_ids(self.tok, self.model)
        out = []
        for it, new in zip(items, replies):
            response = self.tok.decode(until_stop(new, stops), skip_special_tokens=True)
            out.append({"correct": int(self.score(it.sample, response)), "response": response})
        return out

    def _stream(
        self, spec: MethodSpec, items: list[NeedleItem], emit: Callable[[list[dict]], None], handle: Any
    ) -> None:
        """vLLM: every prompt of one length submitted at once, each row written as its reply finishes (`seconds`: the
        wall time since the previous reply, so that a length's rows add up to its wall time)."""
        prompts = [it.prompt.ids for it in items]
        for index, new, seconds in timed_replies(handle, prompts, [self.budget(it.sample) for it in items]):
            it = items[index]
            response = self.tok.decode(until_stop(new, handle.stop_ids), skip_special_tokens=True)
            result = {"correct": int(self.score(it.sample, response)), "response": response}
            emit([self._row(spec, it, status="ok", seconds=round(seconds, 3), **result)])
            self.progress.advance(it.length, self.describe(spec, [it], [result]))

    def _same_shape(self, chunk: list[NeedleItem]) -> list[NeedleItem]:
        """The leading items of `chunk` whose prompts share the first one's token length and budget."""
        first = (len(chunk[0].prompt.ids), self.budget(chunk[0].sample))
        n = next((i for i, it in enumerate(chunk) if (len(it.prompt.ids), self.budget(it.sample)) != first), len(chunk))
        return chunk[:n]

    def measure(
        self,
        spec: MethodSpec,
        cells: list[tuple[int, int, int]],
        emit: Callable[[list[dict]], None],
        handle: Any = None,
        ladder: OomLadder | None = None,
    ) -> None:
        """Score `cells` of one method (shortest lengths first), emitting one row per sample as it finishes. Out of
        memory follows `ladder` (one per sweep, so that it carries across calls; a fresh one by default)."""
        ladder = OomLadder() if ladder is None else ladder
        by_length: dict[int, list[tuple[int, int, int]]] = {}
        for cell in sorted(cells):
            by_length.setdefault(cell[0], []).append(cell)
        for length, group in sorted(by_length.items()):
            items = self.batch_order([self.item(*cell) for cell in group])
            if ladder.skipped_at(spec.label, length) is not None:
                note = ladder.skip_note(spec.label)
                emit([self._row(spec, it, status="skipped", correct=None, note=note) for it in items])
                continue
            if streams(handle) and self.cfg.scoring != "forced":
                self._stream(spec, items, emit, handle)
                continue
            self._measure_length(spec, length, items, emit, handle, ladder)

    def _measure_length(
        self,
        spec: MethodSpec,
        length: int,
        items: list[NeedleItem],
        emit: Callable[[list[dict]], None],
        handle: Any,
        ladder: OomLadder,
    ) -> None:
        """The prompts of one length in batches (generate: of one token length and budget) down the ladder."""
        forced = self.cfg.scoring == "forced"

        def timed(chunk: list[NeedleItem]) -> tuple[list[dict[str, Any]], float]:
            t0 = time.perf_counter()
            with oom_guard(self.device):
                results = self._forced(chunk) if forced else self._generate_batch(chunk, handle)
            return results, (time.perf_counter() - t0) / len(chunk)

        measured = 0
        batches = ladder.batches(
            spec.label,
            length,
            items,
            self.cfg.batch_size,
            self.progress,
            timed,
            None if forced else self._same_shape,
        )
        try:
            for chunk, (results, seconds) in batches:
                emit(
                    [
                        self._row(spec, it, status="ok", seconds=round(seconds, 3), **res)
                        for it, res in zip(chunk, results)
                    ]
                )
                self.progress.advance(length * len(chunk), self.describe(spec, chunk, results))
                measured += len(chunk)
        except PointOOM as exc:
            emit([self._row(spec, it, status="oom", correct=None, note=str(exc)) for it in items[measured:]])
            ladder.give_up(spec.label, length, self.progress)


def sweep(lm: LanguageModel, specs: list[MethodSpec], runner: NeedleRunner, store: RunStore) -> None:
    """Every (method, length, depth, sample) not yet in `store`, one method applied at a time (under torchrun:
    this rank's share of the (method, length, cells) work items)."""
    done = store.done_points(NeedleRunner.KEY)
    cells = runner.cfg.cells()
    depths = {c: runner.depth(c) for c in cells}
    # vLLM batches itself: all prompts of a length go in at once
    step = len(cells) if isinstance(lm, VllmModel) else max(1, runner.cfg.batch_size)
    items: list[WorkItem[list[tuple[int, int, int]]]] = []  # payload: the (length, depth, sample) cells
    for index, spec in enumerate(specs):
        todo = [
            c
            for c in cells
            if point_key({"label": spec.label, "length": c[0], "depth": depths[c], "sample": c[2]}, NeedleRunner.KEY)
            not in done
        ]
        for length in sorted({c[0] for c in todo}):
            group = [c for c in todo if c[0] == length]
            items.extend(
                WorkItem(
                    index,
                    group[i : i + step],
                    forward_cost(length) * len(group[i : i + step]),
                    length * len(group[i : i + step]),
                    length,
                )
                for i in range(0, len(group), step)
            )
    ladder = OomLadder()
    run_items(
        lm,
        specs,
        items,
        runner.cfg.lengths,
        store,
        runner.progress,
        lambda spec, chunk, handle: runner.measure(spec, chunk, store.append, handle, ladder),
    )
