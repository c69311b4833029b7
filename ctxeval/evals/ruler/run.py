"""Running RULER: every (method, task, length, sample) generated greedily with the task's tokens_to_generate and
scored as RULER scores it, one row per sample, resumable, sharded under torchrun like every sweep.

Prompts come from ctxeval.evals.ruler.generate (or from RULER-written files with `samples_from`) and are written once per
(task, length) to the run directory in RULER's own layout and format, `samples/<length>/<task>/validation.jsonl`,
so a resumed or repeated run reads back exactly the prompts it measured. Inference follows RULER's HF backend
(scripts/pred/model_wrappers.py): the prompt is input + answer prefix, tokenized with the tokenizer's own
special-token default; greedy decoding (temperature 0) of at most tokens_to_generate new tokens, stopping at EOS;
the new tokens decoded without special tokens; RULER's post-processing; string_match_all / string_match_part.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ...errors import CtxevalError
from ...models.generation import greedy_replies, streams, timed_replies
from ...models.protocol import LanguageModel
from ...models.vllm_engine import VllmModel
from ...runs.rows import RESUME_FIELDS, point_key
from ...runs.store import RunStore
from ...specs import MethodSpec
from ...util.numbers import MAX_TOKENS, finite_number, whole_number
from ...util.textfiles import make_dirs, read_jsonl, write_text
from ..common import OomLadder, PointOOM, Progress, SilentProgress, numbered, oom_guard, point_row
from ..prompts.sample import RulerSample
from ..prompts.templates import check_template
from ..prompts.wrapping import task_format
from ..retrieval.originals import ORIGINAL_TASKS, original_samples
from ..retrieval.suite import DEFAULT_DEPTHS, SUITE_TASKS, check_depths, score_reply, task_wrapper
from ..sweep import WorkItem, forward_cost, run_items
from .generate import generate, postprocess, score
from .sources import Sources
from .tasks import FAMILIES, TASKS

SAMPLES_DIR = "samples"


@dataclass(frozen=True)
class RulerConfig:
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    samples: int
    seed: int = 42
    template: str = "base"  # RULER's --model_template_type
    depths: tuple[float, ...] = DEFAULT_DEPTHS  # the retrieval tasks' answer depths, percent
    kv_pairs: int | None = None  # a fixed count for the key-value tasks; None fills each length

    def __post_init__(self) -> None:
        check_template(self.template)
        known = ", ".join([*TASKS, *SUITE_TASKS])
        if not self.tasks:
            raise CtxevalError(f"--tasks names no task; tasks: {known}")
        unknown = [t for t in self.tasks if t not in TASKS and t not in SUITE_TASKS]
        if unknown:
            raise CtxevalError(f"unknown task '{unknown[0]}'; tasks: {known}")
        if any(SUITE_TASKS[t].has_depth for t in self.tasks if t in SUITE_TASKS):
            check_depths(self.depths)
        if self.kv_pairs is not None and not any(t in SUITE_TASKS and SUITE_TASKS[t].is_kv for t in self.tasks):
            raise CtxevalError(
                "--kv-pairs applies to the key-value tasks (litm:kv, helmet:json_kv, infbench:kv_retrieval); "
                "add one to --tasks or drop it"
            )
        if self.samples < 1:
            raise CtxevalError(f"--samples must be >= 1, got {self.samples}")
        if not self.lengths:
            raise CtxevalError("give at least one --lengths value")


def prompt_formats(tasks: tuple[str, ...] | list[str], template: str, samples_from: bool = False) -> dict[str, str]:
    """Per task, the template its prompts are wrapped in under the run's resolved `template` (`base`: bare): RULER's
    tasks take it, a retrieval task where its original wraps an instruct model's prompt (wrapping.py). RULER-format
    files read with --samples-from are sent as they are written (`file`)."""
    return {
        task: (
            task_format(SUITE_TASKS[task].wraps_instruct, template)
            if task in SUITE_TASKS
            else ("file" if samples_from else template)
        )
        for task in tasks
    }


def tokens_to_generate(task: str) -> int:
    """The most new tokens a reply of `task` may have (RULER's tokens_to_generate, or the original's budget)."""
    return (
        SUITE_TASKS[task].tokens_to_generate if task in SUITE_TASKS else FAMILIES[TASKS[task].family].tokens_to_generate
    )


def check_fits(task: str, length: int, samples: list[RulerSample], tokenizer: Any) -> None:
    """Refuse a released prompt that, with its new tokens, runs past the asked length (InfiniteBench's ~128k files
    at a shorter length): it would be measured at positions the length does not cover."""
    for sample in samples:
        total = len(tokenizer.tokenize(sample.prompt)) + tokens_to_generate(task)
        if total > length:
            raise CtxevalError(
                f"{task}: sample {sample.index} of --samples-from takes {total:,} tokens with this tokenizer (new "
                f"tokens included), more than --lengths {length:,}; give a length of at least {total:,}"
            )


def samples_path(root: Path, task: str, length: int) -> Path:
    return Path(root) / str(length) / task / "validation.jsonl"


def read_samples(path: Path, task: str, length: int) -> list[RulerSample]:
    """RULER-format samples (prepare.py's validation.jsonl): index, input, outputs, and answer_prefix."""
    if not path.is_file():
        raise CtxevalError(
            f"no RULER samples for {task} at length {length}: {path} is missing (RULER's prepare.py "
            "writes DIR/<length>/<task>/validation.jsonl)"
        )
    lines = read_jsonl(path, "RULER samples file", objects=False)
    if lines.problems:
        number, why = lines.problems[0]
        raise CtxevalError(
            f"{path} line {number} is not a RULER sample ({why}); it needs a JSON object with input, "
            "outputs and answer_prefix, in UTF-8"
        )
    samples = []
    for number, record in lines.records:
        # the sample's position is its identity: RULER's niah.py overwrites `index` with a character offset
        problem = sample_problem(record)
        if problem:
            raise CtxevalError(
                f"{path} line {number} is not a RULER sample ({problem}); it needs input, outputs and answer_prefix"
            )
        position = record.get("token_position_answer")  # niah's; kept in the run's copy of the samples
        depth, size = record.get("depth"), record.get("size")  # the retrieval tasks'
        samples.append(
            RulerSample(
                len(samples),
                record["input"],
                [str(x) for x in record["outputs"]],
                whole_number(record.get("length", -1), minimum=-1, maximum=MAX_TOKENS),
                str(record.get("answer_prefix", "")),
                None if position is None else whole_number(position),
                None if depth is None else finite_number(depth),
                None if size is None else whole_number(size),
            )
        )
    if not samples:
        raise CtxevalError(f"{path} holds no samples")
    return samples


def sample_problem(record: Any) -> str | None:
    """Why a JSON value is not a RULER sample ctxeval can run, or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    missing = [k for k in ("input", "outputs") if k not in record]
    if missing:
        return f"KeyError: {missing[0]!r}"
    if not isinstance(record["input"], str):
        return "input is not text"
    if (
        not isinstance(record["outputs"], list)
        or not record["outputs"]
        or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in record["outputs"])
    ):
        return "outputs is not a non-empty list of answers"
    if not isinstance(record.get("answer_prefix", ""), str):
        return "answer_prefix is not text"
    if "length" in record and whole_number(record["length"], minimum=-1, maximum=MAX_TOKENS) is None:
        return "length is not a whole number of tokens"
    position = record.get("token_position_answer")
    if position is not None and whole_number(position) is None:
        return "token_position_answer is not a whole number"
    depth = record.get("depth")
    if depth is not None and not (finite_number(depth) is not None and 0 <= depth <= 100):
        return "depth is not a number from 0 to 100"
    if record.get("size") is not None and whole_number(record["size"]) is None:
        return "size is not a whole number"
    return None


def write_samples(path: Path, samples: list[RulerSample]) -> None:
    make_dirs(path.parent, "RULER samples folder")
    # atomic (torchrun ranks write the same file: each through its own temporary file)
    write_text(path, "".join(json.dumps(s.record()) + "\n" for s in samples), "RULER samples file")


def prepare(
    cfg: RulerConfig,
    tokenizer: Any,
    sources: Sources,
    run_dir: Path,
    samples_from: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[tuple[str, int], list[RulerSample]]:
    """The prompts of every (task, length): read from `samples_from`, else read back from the run directory, else
    generated and written there."""
    out: dict[tuple[str, int], list[RulerSample]] = {}
    for task in cfg.tasks:
        for length in cfg.lengths:
            mine = samples_path(Path(run_dir) / SAMPLES_DIR, task, length)
            if samples_from is not None and task in ORIGINAL_TASKS:  # the original's own released file
                wrapper = task_wrapper(SUITE_TASKS[task], cfg.template, tokenizer)
                samples = original_samples(task, samples_from, length, cfg.samples, cfg.depths, wrapper)
                check_fits(task, length, samples, tokenizer)
            elif samples_from is not None:
                samples = read_samples(samples_path(samples_from, task, length), task, length)[: cfg.samples]
            elif mine.is_file():
                samples = read_samples(mine, task, length)
            else:
                if progress:
                    progress(f"generating {cfg.samples} {task} prompts at {length} tokens")
                samples = generate(
                    task,
                    length,
                    cfg.samples,
                    tokenizer,
                    sources,
                    seed=cfg.seed,
                    model_template=cfg.template,
                    depths=cfg.depths,
                    kv_pairs=cfg.kv_pairs,
                )
            if not mine.is_file():
                write_samples(mine, samples)
            out[(task, length)] = samples
    return out


class RulerRunner:
    KEY = RESUME_FIELDS["ruler"]

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str,
        model_name: str,
        batch_size: int = 1,
        progress: Progress | None = None,
        formats: dict[str, str] | None = None,
    ) -> None:
        self.model, self.tok, self.device, self.model_name = model, tokenizer, device, model_name
        self.batch_size = batch_size
        self.progress = progress or SilentProgress()
        self.formats = formats or {}  # per task: the template its prompts were wrapped in (prompt_formats)

    @torch.inference_mode()
    def predict(
        self, prompts: list[str], max_new_tokens: int, handle: Any = None, length: int | None = None
    ) -> tuple[list[str], list[int]]:
        """Greedy continuations of `prompts` (one batch, left-padded), decoded without special tokens, and the
        prompts' token counts."""
        if len(prompts) == 1:
            enc = self.tok(prompts, return_tensors="pt")
        else:
            pad_side, pad = self.tok.padding_side, self.tok.pad_token
            self.tok.padding_side = "left"
            if self.tok.pad_token is None:
                self.tok.pad_token = self.tok.eos_token
            try:
                enc = self.tok(prompts, return_tensors="pt", padding=True)
            finally:
                self.tok.padding_side, self.tok.pad_token = pad_side, pad
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        # prompt and generated tokens share the RoPE of the task's length
        replies = greedy_replies(self.model, self.tok, ids, mask, max_new_tokens, handle, length)
        texts = [self.tok.decode(new, skip_special_tokens=True) for new in replies]
        return texts, [int(n) for n in enc["attention_mask"].sum(dim=1)]

    def measure(
        self,
        spec: MethodSpec,
        task: str,
        length: int,
        samples: list[RulerSample],
        emit: Callable[[list[dict]], None],
        handle: Any = None,
        of: int | None = None,
        ladder: OomLadder | None = None,
    ) -> None:
        """Score `samples` (some of the `of` samples of this task and length), emitting their rows batch by batch.
        Out of memory follows `ladder` (one per sweep, so that it carries across calls; a fresh one by default)."""
        ladder = OomLadder() if ladder is None else ladder
        budget = tokens_to_generate(task)
        of = of or max((s.index + 1 for s in samples), default=0)
        if ladder.skipped_at(spec.label, length) is not None:
            note = ladder.skip_note(spec.label)
            emit([self._failed(spec, task, length, s, "skipped", note) for s in samples])
            return
        if streams(handle):
            self._stream(spec, task, length, samples, emit, handle, of)
            return

        def timed(chunk: list[RulerSample]) -> tuple[list[str], list[int], float]:
            t0 = time.perf_counter()
            with oom_guard(self.device):
                predictions, prompt_tokens = self.predict([s.prompt for s in chunk], budget, handle, length)
            return predictions, prompt_tokens, (time.perf_counter() - t0) / len(chunk)

        measured = 0
        try:
            for chunk, (predictions, prompt_tokens, seconds) in ladder.batches(
                spec.label, length, samples, self.batch_size, self.progress, timed
            ):
                rows = [
                    self._row(spec, task, length, sample, raw, n_prompt, seconds)
                    for sample, raw, n_prompt in zip(chunk, predictions, prompt_tokens)
                ]
                emit(rows)
                self.progress.advance(
                    length * len(chunk),
                    f"{spec.label} {task} L={length} "
                    f"{numbered('sample', [s.index + 1 for s in chunk], of)} "
                    f"{sum(r['score'] for r in rows) / len(rows):.0%}",
                )
                measured += len(chunk)
        except PointOOM as exc:
            emit([self._failed(spec, task, length, s, "oom", str(exc)) for s in samples[measured:]])
            ladder.give_up(spec.label, length, self.progress)

    def _stream(
        self,
        spec: MethodSpec,
        task: str,
        length: int,
        samples: list[RulerSample],
        emit: Callable[[list[dict]], None],
        handle: Any,
        of: int,
    ) -> None:
        """vLLM: every prompt submitted at once (tokenized one by one, as the hf path's batch of one), each row written as
        its reply finishes (`seconds`: the wall time since the previous reply)."""
        prompts = [self.tok(s.prompt)["input_ids"] for s in samples]
        for index, new, seconds in timed_replies(handle, prompts, [tokens_to_generate(task)] * len(prompts)):
            sample = samples[index]
            row = self._row(
                spec, task, length, sample, self.tok.decode(new, skip_special_tokens=True), len(prompts[index]), seconds
            )
            emit([row])
            self.progress.advance(
                length,
                f"{spec.label} {task} L={length} {numbered('sample', [sample.index + 1], of)} {row['score']:.0%}",
            )

    def _failed(
        self, spec: MethodSpec, task: str, length: int, sample: RulerSample, status: str, note: str
    ) -> dict[str, Any]:
        """The row of a sample that ran out of memory (`oom`) or was skipped after one did (`skipped`)."""
        return point_row(
            self.model_name,
            spec,
            "ruler",
            ruler_task=task,
            length=length,
            sample=sample.index,
            status=status,
            note=note,
            **({"template": self.formats[task]} if task in self.formats else {}),
            **({"depth": sample.depth} if sample.depth is not None else {}),
        )

    def _row(
        self,
        spec: MethodSpec,
        task: str,
        length: int,
        sample: RulerSample,
        raw: str,
        prompt_tokens: int,
        seconds: float,
    ) -> dict[str, Any]:
        """A scored sample's row: RULER's post-processing of the raw reply, then its metric; a retrieval task's reply
        as its original scores it (no post-processing), with the sample's depth and size."""
        if task in SUITE_TASKS:
            metric, prediction = task.split(":")[0], raw
            value = score_reply(task, raw, sample)
            extra = {"size": sample.size, **({"depth": sample.depth} if sample.depth is not None else {})}
        else:
            metric = FAMILIES[TASKS[task].family].metric
            prediction = postprocess(raw)
            value = score(metric, prediction, sample.outputs)
            extra = {}
        return point_row(
            self.model_name,
            spec,
            "ruler",
            value=value,
            ruler_task=task,
            length=length,
            sample=sample.index,
            score=value,
            prediction=prediction,
            outputs=sample.outputs,
            metric_fn=metric,
            prompt_tokens=prompt_tokens,
            seconds=round(seconds, 3),
            status="ok",
            **({"template": self.formats[task]} if task in self.formats else {}),
            **extra,
        )


@dataclass(frozen=True)
class RulerBatch:
    """A RULER work item's prompts: some samples of one task at one length."""

    task: str
    length: int
    samples: tuple[RulerSample, ...]
    total: int  # the task's samples at this length in all (progress says "sample i of total")


def sweep(
    lm: LanguageModel,
    specs: list[MethodSpec],
    prompts: dict[tuple[str, int], list[RulerSample]],
    cfg: RulerConfig,
    runner: RulerRunner,
    store: RunStore,
) -> None:
    """Every (method, task, length, sample) not yet in `store`, one method applied at a time."""
    done = store.done_points(RulerRunner.KEY)
    items: list[WorkItem[RulerBatch]] = []
    for index, spec in enumerate(specs):
        for (task, length), samples in prompts.items():
            todo = [
                s
                for s in samples
                if point_key(
                    {"label": spec.label, "ruler_task": task, "length": length, "sample": s.index}, RulerRunner.KEY
                )
                not in done
            ]
            step = len(todo) if isinstance(lm, VllmModel) else runner.batch_size  # vLLM batches itself
            for i in range(0, len(todo), max(step, 1)):
                batch = todo[i : i + step]
                items.append(
                    WorkItem(
                        index,
                        RulerBatch(task, length, tuple(batch), len(samples)),
                        forward_cost(length) * len(batch),
                        length * len(batch),
                        length,
                    )
                )
    ladder = OomLadder()
    run_items(
        lm,
        specs,
        items,
        cfg.lengths,
        store,
        runner.progress,
        lambda spec, batch, handle: runner.measure(
            spec, batch.task, batch.length, list(batch.samples), store.append, handle, of=batch.total, ladder=ladder
        ),
    )
