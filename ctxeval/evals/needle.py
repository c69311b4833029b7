"""Needle in a haystack and passkey: prompts built in token space at exact lengths, scored without an LLM judge.

A prompt is [BOS] + instruction + haystack-with-needles + question + answer prefix (optionally wrapped in the
tokenizer's chat template, the answer prefix prefilled as the assistant turn). Every piece is tokenized with
add_special_tokens=False (a BOS inside a needle is a classic bug) and BOS is added once. The haystack is cut so
that the whole sequence the model processes is exactly `length` tokens: prompt + answer for `forced` scoring,
prompt + generation budget for `generate`. This is `ctxeval needle` and `ctxeval passkey --protocol ctxeval`;
passkey.py holds `--protocol yarn` (the YaRN repository's own passkey test), which runs on NeedleRunner.
"""

from __future__ import annotations

import math
import re
import string
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..data import corpora
from ..errors import CtxevalError
from ..models.generation import greedy_config, stop_ids, streams, until_stop
from ..models.protocol import LanguageModel
from ..models.vllm_engine import VllmModel
from ..runs.rows import RESUME_FIELDS, point_key
from ..runs.store import RunStore
from ..specs import MethodSpec
from .common import PointOOM, Progress, SilentProgress, head_parts, numbered, oom_guard, point_row
from .sweep import WorkItem, forward_cost, run_items

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
SCORINGS = ("generate", "forced")
MAX_DIGITS = 18  # digits:N draws 64-bit integers
MAX_REDRAWS = 1000  # a value that repeats one of its sample's is redrawn at most this often, then picked among the free
MAX_ENUMERATED = 1_000_000  # ranges small enough to list their free values
# RULER draws keys from a word list; ours is a fixed list in code so that keys are reproducible from the seed
KEY_ADJECTIVES = (
    "ancient amber bitter brave calm clever cold curious daring eager fancy fierce gentle giant glossy golden "
    "hollow humble icy jolly lively lucky mellow misty noble odd plain quiet rapid rustic shiny silent smooth "
    "sturdy sunny swift tender tidy vivid wary wild witty"
).split()
KEY_NOUNS = (
    "anchor apple badger basket beacon bridge canyon cedar comet cottage falcon feather garden glacier harbor "
    "island kettle lantern meadow mirror orchard otter pebble pepper quarry river saddle signal spruce summit "
    "teapot thunder tunnel valley violin walnut willow window zephyr"
).split()


# ---------------------------------------------------------------------------------------------------------------
# presets and samples


@dataclass(frozen=True)
class NeedlePreset:
    name: str
    instruction: str
    needle: str  # "{key}" and "{value}" are filled per needle
    question: str  # "{keys}" is filled with the queried keys
    answer_prefix: str
    value: str  # digits:N | int:LO:HI | fixed:TEXT
    keys: int = 1  # queried keys
    values_per_key: int = 1
    distractors: int = 0  # needles with other keys, not asked about
    match: str = "all"  # all (RULER string_match_all) | first_int (passkey) | terms
    match_terms: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> "NeedlePreset":
        known = set(cls.__dataclass_fields__) - {"name"}
        unknown = set(data) - known
        if unknown:
            raise CtxevalError(f"needle preset '{name}' has unknown keys: {', '.join(sorted(unknown))}")
        data = {**data, "match_terms": tuple(data.get("match_terms", ()))}
        preset = cls(name=name, **data)
        preset.check()
        return preset

    def check(self) -> None:
        if self.match not in ("all", "first_int", "terms"):
            raise CtxevalError(f"needle preset '{self.name}': match must be all, first_int or terms")
        if not re.fullmatch(r"digits:\d+|int:\d+:\d+|fixed:.+", self.value):
            raise CtxevalError(
                f"needle preset '{self.name}': value must be digits:N, int:LO:HI or fixed:TEXT, got '{self.value}'"
            )
        if min(self.keys, self.values_per_key) < 1 or self.distractors < 0:
            raise CtxevalError(f"needle preset '{self.name}': keys and values_per_key must be >= 1, distractors >= 0")
        if self.keys + self.distractors > len(KEY_ADJECTIVES) * len(KEY_NOUNS):
            raise CtxevalError(
                f"needle preset '{self.name}': keys + distractors is {self.keys + self.distractors}, "
                f"more than the {len(KEY_ADJECTIVES) * len(KEY_NOUNS)} distinct keys; use fewer"
            )
        if not self.value.startswith("fixed:") and any(len(part) > 18 for part in self.value.split(":")[1:]):
            raise CtxevalError(
                f"needle preset '{self.name}': value '{self.value[:60]}' has a number of more than 18 "
                "digits; values are 64-bit integers"
            )
        if self.value.startswith("digits:") and not 1 <= int(self.value.partition(":")[2]) <= MAX_DIGITS:
            raise CtxevalError(
                f"needle preset '{self.name}': value digits:N needs 1 <= N <= {MAX_DIGITS}, got '{self.value}'"
            )
        bounds = _value_range(self.value)
        if bounds is not None and bounds[0] > bounds[1]:
            raise CtxevalError(f"needle preset '{self.name}': value int:LO:HI needs LO <= HI, got '{self.value}'")
        needles = self.keys * self.values_per_key + self.distractors
        if bounds is not None and bounds[1] - bounds[0] + 1 < needles:  # a sample's values are distinct; fixed repeats
            raise CtxevalError(
                f"needle preset '{self.name}': value '{self.value}' has {bounds[1] - bounds[0] + 1} "
                f"distinct values for {needles} needles (keys x values_per_key + distractors); widen its range"
            )
        if "{value}" not in self.needle and not self.value.startswith("fixed:"):
            raise CtxevalError(f"needle preset '{self.name}': the needle text must contain {{value}}")
        for field_name, text, allowed in (
            ("needle", self.needle, {"key", "value"}),
            ("question", self.question, {"keys"}),
            ("answer_prefix", self.answer_prefix, {"keys"}),
        ):
            try:
                names = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
            except ValueError as exc:
                raise CtxevalError(f"needle preset '{self.name}': bad braces in {field_name}: {exc}") from None
            if names - allowed:
                raise CtxevalError(
                    f"needle preset '{self.name}': {field_name} may use only {', '.join('{' + a + '}' for a in sorted(allowed))}, "
                    f"got {', '.join('{' + n + '}' for n in sorted(names - allowed))} (write {{{{ and }}}} for literal braces)"
                )


@dataclass(frozen=True)
class Sample:
    needles: tuple[str, ...]  # queried needles first, then distractors
    n_queried: int
    question: str
    answer_prefix: str
    answers: tuple[str, ...]  # every expected value

    @property
    def answer_text(self) -> str:
        """The completion after the answer prefix that forced scoring teacher-forces."""
        return " " + ", ".join(self.answers)


def _value_range(spec: str) -> tuple[int, int] | None:
    """[lo, hi] of the integers a digits:N or int:LO:HI value spec draws from; None for fixed:TEXT."""
    kind, _, rest = spec.partition(":")
    if kind == "digits":
        return 10 ** (int(rest) - 1), 10 ** int(rest) - 1
    if kind == "int":
        lo, hi = (int(x) for x in rest.split(":"))
        return lo, hi
    return None


def _unused_value(preset: NeedlePreset, used: set[str], rng: np.random.Generator) -> str:
    """A value the sample does not hold yet, drawn among the range's free values: after MAX_REDRAWS collisions the
    redraw loop stops here (only a range about as small as the needle count gets this far; check() guarantees a
    free value exists)."""
    lo, hi = _value_range(preset.value) or (0, -1)
    if hi - lo >= MAX_ENUMERATED:
        raise CtxevalError(
            f"needle preset '{preset.name}': {MAX_REDRAWS} draws from '{preset.value}' all repeated a "
            "value of the sample; widen its range"
        )
    free = [str(v) for v in range(lo, hi + 1) if str(v) not in used]
    return free[int(rng.integers(len(free)))]


def _value(spec: str, rng: np.random.Generator) -> str:
    bounds = _value_range(spec)
    return spec.partition(":")[2] if bounds is None else str(rng.integers(bounds[0], bounds[1] + 1))


def make_sample(preset: NeedlePreset, rng: np.random.Generator) -> Sample:
    """Seeded needle values and keys (distinct keys; distinct values within a sample)."""
    total_keys = preset.keys + preset.distractors
    pairs = rng.choice(len(KEY_ADJECTIVES) * len(KEY_NOUNS), size=total_keys, replace=False)
    keys = [f"{KEY_ADJECTIVES[p // len(KEY_NOUNS)]}-{KEY_NOUNS[p % len(KEY_NOUNS)]}" for p in pairs]
    used: set[str] = set()
    needles, answers = [], []
    for i, key in enumerate(keys):
        for _ in range(preset.values_per_key if i < preset.keys else 1):
            value = _value(preset.value, rng)
            for redraws in range(1, MAX_REDRAWS + 1):  # bounded: a value that keeps repeating ends in _unused_value
                if value not in used or preset.value.startswith("fixed:"):
                    break
                value = _value(preset.value, rng) if redraws < MAX_REDRAWS else _unused_value(preset, used, rng)
            used.add(value)
            needles.append(preset.needle.format(key=key, value=value))
            if i < preset.keys:
                answers.append(value)
    queried = keys[: preset.keys]
    key_text = ", ".join(queried[:-1]) + (" and " if len(queried) > 1 else "") + queried[-1]
    n_queried = preset.keys * preset.values_per_key
    return Sample(
        tuple(needles),
        n_queried,
        preset.question.format(keys=key_text),
        preset.answer_prefix.format(keys=key_text),
        tuple(answers),
    )


# ---------------------------------------------------------------------------------------------------------------
# scoring


_INT = re.compile(r"-?\d+")


def score_response(preset: NeedlePreset, sample: Sample, response: str) -> bool:
    """RULER string_match_all (every value appears), passkey (first integer equals the key), or all terms."""
    if preset.match == "first_int":
        found = _INT.search(response)
        return bool(found) and found.group() == sample.answers[0]
    if preset.match == "terms":
        return all(term.lower() in response.lower() for term in preset.match_terms)
    return all(answer.lower() in response.lower() for answer in sample.answers)


# ---------------------------------------------------------------------------------------------------------------
# prompt builder


@dataclass
class Prompt:
    ids: list[int]  # the prompt (ends with the answer prefix)
    answer_ids: list[int]  # the answer tokens that forced scoring appends
    needle_spans: list[tuple[int, int]]  # [start, end) of each needle's tokens in ids
    depth_tokens: int  # insertion offset of the first queried needle inside the haystack
    haystack_tokens: int


class PromptBuilder:
    def __init__(
        self,
        tokenizer: Any,
        preset: NeedlePreset,
        haystack_ids: np.ndarray,
        *,
        chat_template: bool,
        bos: bool = True,
        snap: bool = False,
    ) -> None:
        self.tok = tokenizer
        self.preset = preset
        self.haystack = haystack_ids  # (n,) token ids of consecutive haystack text
        self.snap = snap
        self.bos = [tokenizer.bos_token_id] if bos and tokenizer.bos_token_id is not None else []
        self.chat = chat_template
        self.pre_chat: list[int] = []
        self.post_chat: list[int] = []
        if chat_template:
            marker = "\u2063CTXEVAL\u2063"
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
            )
            pre, _, post = text.partition(marker)
            self.pre_chat, self.post_chat = self.encode(pre), self.encode(post)
            if self.bos and self.pre_chat[:1] == self.bos:
                self.bos = []  # the template already starts with BOS
        self._sentence_ends = self._sentence_end_ids()

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def _sentence_end_ids(self) -> frozenset[int]:
        """The haystack's token ids whose text ends a sentence: ., ! or ? before any trailing whitespace, or a newline."""
        ends = set()
        for token in np.unique(self.haystack).tolist():
            text = self.tok.decode([token])
            if "\n" in text or text.rstrip()[-1:] in (".", "!", "?"):
                ends.add(token)
        return frozenset(ends)

    def fixed_tokens(self, sample: Sample) -> tuple[list[int], list[int], list[list[int]], list[int]]:
        head = self.bos + self.pre_chat + self.encode(self.preset.instruction + "\n")
        needles = [self.encode(" " + n) for n in sample.needles]
        question = self.encode("\n" + sample.question)
        if self.chat:
            tail = question + self.post_chat + self.encode(sample.answer_prefix)
        else:
            tail = question + self.encode(" " + sample.answer_prefix)
        return head, tail, needles, self.answer_ids(sample)

    def answer_ids(self, sample: Sample) -> list[int]:
        """' v1, v2, ...' tokenized value by value, so that reordering the values keeps the token count."""
        ids: list[int] = []
        for i, value in enumerate(sample.answers):
            ids += (self.encode(",") if i else []) + self.encode(" " + value)
        return ids

    def minimum_length(self, sample: Sample, reserve: int) -> int:
        head, tail, needles, _ = self.fixed_tokens(sample)
        return len(head) + len(tail) + sum(map(len, needles)) + reserve + 1

    def build(self, length: int, depth: float, sample: Sample, rng: np.random.Generator, reserve: int) -> Prompt:
        """A prompt whose tokens + `reserve` (answer tokens or generation budget) equal `length` exactly.

        The first queried needle goes at `depth`% of the haystack tokens; the other needles (more values, more
        keys, distractors) at seeded random depths. The haystack is consecutive text from a seeded offset."""
        head, tail, needles, answer = self.fixed_tokens(sample)
        budget = length - len(head) - len(tail) - sum(map(len, needles)) - reserve
        if budget < 1:
            raise CtxevalError(
                f"length {length} is shorter than the instruction, needle(s), question and answer "
                f"({length - budget + 1} tokens with this tokenizer); use longer --lengths"
            )
        if budget > len(self.haystack):
            raise CtxevalError(
                f"the haystack has {len(self.haystack):,} tokens but length {length} needs {budget:,}; "
                "use a longer --haystack corpus or shorter --lengths"
            )
        offset = int(rng.integers(0, len(self.haystack) - budget + 1))
        hay = self.haystack[offset : offset + budget].tolist()
        positions = [self._position(depth, hay)]
        positions += [self._position(float(rng.uniform(0, 100)), hay) for _ in needles[1:]]
        order = sorted(range(len(needles)), key=lambda i: (positions[i], i))
        ids = list(head)
        spans: list[tuple[int, int]] = [(0, 0)] * len(needles)
        cursor = 0
        for i in order:
            ids.extend(hay[cursor : positions[i]])
            cursor = positions[i]
            spans[i] = (len(ids), len(ids) + len(needles[i]))
            ids.extend(needles[i])
        ids.extend(hay[cursor:])
        ids.extend(tail)
        assert len(ids) + reserve == length, (len(ids), reserve, length)
        if self.preset.values_per_key > 1:
            answer = self.answer_ids(self.reading_order(sample, spans))
        return Prompt(ids, answer, spans, positions[0], budget)

    def reading_order(self, sample: Sample, spans: list[tuple[int, int]]) -> Sample:
        """Several values for one key: the forced answer lists them in the order they appear in the text
        (several keys keep the question's key order)."""
        per_key = self.preset.values_per_key
        answers = list(sample.answers)
        for k in range(len(answers) // per_key):
            idx = list(range(k * per_key, (k + 1) * per_key))
            ordered = sorted(idx, key=lambda j: spans[j][0])
            answers[k * per_key : (k + 1) * per_key] = [sample.answers[j] for j in ordered]
        return Sample(sample.needles, sample.n_queried, sample.question, sample.answer_prefix, tuple(answers))

    def _position(self, depth: float, hay: list[int]) -> int:
        """Insertion offset at depth% of the haystack; with snap, moved back to just after a sentence end."""
        pos = int(round(depth / 100 * len(hay)))
        if self.snap:
            while 0 < pos < len(hay) and hay[pos - 1] not in self._sentence_ends:
                pos -= 1
        return pos


# ---------------------------------------------------------------------------------------------------------------
# haystacks


def haystack_tokens(
    tokenizer: Any, spec: str, min_tokens: int, text_field: str = "text"
) -> tuple[np.ndarray, dict[str, Any]]:
    """Token ids of the haystack: the filler repeated, or a corpus' documents joined by a blank line."""
    if spec == "filler":
        unit = np.asarray(tokenizer(" " + FILLER, add_special_tokens=False)["input_ids"])
        reps = max(1, math.ceil((min_tokens + 1) / len(unit)) + 1)
        return np.tile(unit, reps), {"haystack": "filler", "text": FILLER}
    sep = np.asarray(tokenizer("\n\n", add_special_tokens=False)["input_ids"])
    parts, total, used = [], 0, []
    for doc in corpora.iter_documents(spec, text_field):
        ids = corpora.tokenize(tokenizer, doc)
        parts += [ids, sep]
        total += len(ids) + len(sep)
        used.append({"doc": doc.doc_id, "tokens": int(len(ids))})
        if total >= 4 * min_tokens:
            break
    if not parts:
        raise CtxevalError(f"haystack corpus '{spec}' holds no text")
    return np.concatenate(parts), {"haystack": spec, "documents": used}


# ---------------------------------------------------------------------------------------------------------------
# runner


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
        """Greedy replies to prompts of one token length and one budget, in one generate call (no padding)."""
        ids = torch.tensor([it.prompt.ids for it in items], device=self.device)  # (B, prompt tokens)
        budget = self.budget(items[0].sample)
        if handle is not None and handle.method.length_dependent:
            # the longest sequence this generation can reach (prompt + budget; the length itself wherever the prompt is
            # built to it): cached keys and new queries share one RoPE
            handle.freeze_length(len(items[0].prompt.ids) + budget)
        try:
            gen = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=greedy_config(self.tok, budget, self.model),
            )
        finally:
            if handle is not None and handle.method.length_dependent:
                handle.freeze_length(None)
        stops = set(stop_ids(self.tok, self.model))
        out = []
        for it, row in zip(items, gen):
            response = self.tok.decode(until_stop(row[ids.shape[1] :].tolist(), stops), skip_special_tokens=True)
            out.append({"correct": int(self.score(it.sample, response)), "response": response})
        return out

    def _stream(
        self, spec: MethodSpec, items: list[NeedleItem], emit: Callable[[list[dict]], None], handle: Any
    ) -> None:
        """vLLM: every prompt of one length submitted at once, each row written as its reply finishes (`seconds`: the
        wall time since the previous reply, so that a length's rows add up to its wall time)."""
        last = time.perf_counter()
        for index, new in handle.replies([it.prompt.ids for it in items], [self.budget(it.sample) for it in items]):
            it = items[index]
            response = self.tok.decode(until_stop(new, handle.stop_ids), skip_special_tokens=True)
            result = {"correct": int(self.score(it.sample, response)), "response": response}
            now = time.perf_counter()
            emit([self._row(spec, it, status="ok", seconds=round(now - last, 3), **result)])
            self.progress.advance(it.length, self.describe(spec, [it], [result]))
            last = now

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
        skip: dict[str, float] | None = None,
        steps: dict[tuple[str, int], int] | None = None,
    ) -> None:
        """Score `cells` of one method (shortest lengths first), emitting one row per sample as it finishes.
        An out-of-memory length is recorded and longer lengths of this method are skipped (`skip` carries that
        across calls: label -> first length that ran out of memory; `steps`: (label, length) -> the halved forced
        batch size that fitted)."""
        skip = {} if skip is None else skip
        steps = {} if steps is None else steps
        skip_from = skip.get(spec.label, math.inf)
        by_length: dict[int, list[tuple[int, int, int]]] = {}
        for cell in sorted(cells):
            by_length.setdefault(cell[0], []).append(cell)
        for length, group in sorted(by_length.items()):
            items = self.batch_order([self.item(*cell) for cell in group])
            if length >= skip_from:
                emit(
                    [
                        self._row(
                            spec, it, status="skipped", correct=None, note=f"skipped: out of memory at {skip_from}"
                        )
                        for it in items
                    ]
                )
                continue
            if streams(handle) and self.cfg.scoring != "forced":
                self._stream(spec, items, emit, handle)
                continue
            # a longer length starts at the batch that fitted a shorter one (it needs at least as much memory)
            fitted = [v for (label, L), v in steps.items() if label == spec.label and L <= length]
            step = min([self.cfg.batch_size, *fitted])
            start = 0
            while start < len(items):
                chunk = items[start : start + step]
                if self.cfg.scoring != "forced":
                    chunk = self._same_shape(chunk)
                t0 = time.perf_counter()
                try:
                    with oom_guard(self.device):
                        results = (
                            self._forced(chunk) if self.cfg.scoring == "forced" else self._generate_batch(chunk, handle)
                        )
                except PointOOM as exc:
                    if step > 1:  # a smaller batch may fit: halve before giving up on this length
                        step //= 2
                        steps[(spec.label, length)] = step
                        self.progress.note(f"{spec.label}: out of memory at {length} tokens; batch size {step}")
                        continue
                    skip_from = skip[spec.label] = length
                    emit([self._row(spec, it, status="oom", correct=None, note=str(exc)) for it in items[start:]])
                    self.progress.note(f"{spec.label}: out of memory at {length} tokens; longer lengths skipped")
                    break
                seconds = (time.perf_counter() - t0) / len(chunk)
                emit(
                    [
                        self._row(spec, it, status="ok", seconds=round(seconds, 3), **res)
                        for it, res in zip(chunk, results)
                    ]
                )
                self.progress.advance(length * len(chunk), self.describe(spec, chunk, results))
                start += len(chunk)


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
    skip: dict[str, float] = {}
    steps: dict[tuple[str, int], int] = {}
    run_items(
        lm,
        specs,
        items,
        runner.cfg.lengths,
        store,
        runner.progress,
        lambda spec, chunk, handle: runner.measure(spec, chunk, store.append, handle, skip, steps),
    )
