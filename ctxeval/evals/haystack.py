"""The prompts of needle in a haystack and passkey, built in token space at exact lengths: needle presets, seeded
samples (keys, values, distractors), the scoring of a reply, the prompt builder and the haystacks.

A prompt is [BOS] + instruction + haystack-with-needles + question + answer prefix (optionally wrapped in the
tokenizer's chat template, the answer prefix prefilled as the assistant turn). Every piece is tokenized with
add_special_tokens=False (a BOS inside a needle is a classic bug) and BOS is added once. The haystack is cut so
that the whole sequence the model processes is exactly `length` tokens: prompt + answer for `forced` scoring,
prompt + generation budget for `generate`. The runner that measures them is needle.py.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data import corpora
from ..errors import CtxevalError

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
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
