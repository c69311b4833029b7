"""The retrieval tasks as `ctxeval ruler` runs them, each named by its suite (`litm:kv`, `helmet:json_kv`,
`infbench:passkey`, ...): how a sample is built at a size and a depth, how many tokens it may generate, and how its
reply is scored, each as the original does it (litm_kv, helmet_json_kv, infinitebench, infinitebench_scoring).

Sizing: the originals fix their counts for their own tokenizer (HELMET's keys per length for Llama 2, InfiniteBench's
128k files, LITM's 75/140/300 keys). Here a prompt fills the asked length with the evaluated model's tokenizer: the
largest size (key-value pairs, noise lines, list items) whose prompt plus the task's generation budget fits, as RULER
sizes its haystacks. HELMET's own key count is kept at the lengths of its table when it fits, and `size` fixes the
count for every kv task (refused when it cannot fit).

Depth: sample j of every depth is built from the same draws (a seed per task, length and j), with only the answer
moved, as lost-in-the-middle moves one example's gold pair through the context.

Wrapping: a task whose original wraps an instruct or chat model's prompt (`wraps_instruct`: litm:kv, facts:*) gets
the run's template around its whole prompt (wrapping.py), and its size search counts the wrapper; the others are
sent bare, as their originals send them to every model.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Callable

from ...errors import CtxevalError
from ..prompts.sample import RulerSample
from ..prompts.wrapping import task_format, wrap, wrapper_text
from . import babilong, helmet_json_kv, infinitebench, litm_kv
from .infinitebench_scoring import score_row

TOO_SHORT = "shorter than the task's smallest prompt"  # ruler.fit looks for this phrase
DEFAULT_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)  # LITM's 140-key gold indices 0, 34, 69, 104, 139 in percent
INFBENCH_TEMPLATE = "yarn-mistral"  # InfiniteBench's template for open base models (yi and chatglm3 use it too)


@dataclass(frozen=True)
class Built:
    """A prompt (the model reads it whole: no answer prefix is split off) and the answers its scorer accepts."""

    text: str
    outputs: list[str]


@dataclass(frozen=True)
class Background:
    """The prose the facts tasks hide their facts in: its sentences (babilong.background_sentences) and the token
    count they were measured with."""

    sentences: list[str]
    count: Callable[[str], int]
    source: str


Build = Callable[[random.Random, int, float, "Background | None"], Built]  # (draws, size, depth 0..100, prose)


@dataclass(frozen=True)
class SuiteTask:
    name: str
    original: str  # the code it reproduces
    tokens_to_generate: int
    unit: str  # what the size counts
    min_size: int
    build: Build
    score: Callable[[str, RulerSample], float]  # (raw reply, sample) -> 0..1
    has_depth: bool = True
    is_kv: bool = False
    needs_background: bool = False
    wraps_instruct: bool = False  # the original wraps an instruct/chat model's prompt in its format
    instruct: str = ""  # what the original does with an instruct/chat model's prompt (run.json's provenance)


def _index(depth: float, count: int) -> int:
    """The position `depth` percent of the way through `count` slots (0 the first, 100 the last)."""
    return round(depth / 100 * (count - 1))


def _litm(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
    example = litm_kv.generate_kv_example(size, rng)
    sample = litm_kv.kv_sample(example, _index(depth, size))
    return Built(sample.prompt, [sample.value])


def _helmet(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
    sample = helmet_json_kv.generate_json_kv_sample(size, depth / 100, rng)
    return Built(helmet_json_kv.json_kv_prompt(sample.context, sample.demos, sample.question), list(sample.answer))


def _infbench_kv(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
    records = litm_kv.generate_kv_example(size, rng).ordered_kv_records
    row = infinitebench.generate_kv_retrieval_row(0, records, rng, 1, size, gold_index=_index(depth, size))
    return Built(infinitebench.infinitebench_prompt("kv_retrieval", row, INFBENCH_TEMPLATE), [row.answer])


def _needle(task: str) -> Build:
    number = task == "number_string"

    def build(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
        key = infinitebench.number_string_key(rng) if number else infinitebench.passkey_key(rng)
        needle = infinitebench.NUMBER_NEEDLE if number else infinitebench.PASSKEY_NEEDLE
        line = round(depth / 100 * size)  # the needle goes before noise line `line` of `size` (0..size inclusive)
        context = infinitebench.needle_context(needle, key, size, line)
        question = infinitebench.NUMBER_QUESTION if number else infinitebench.PASSKEY_QUESTION
        row = infinitebench.NeedleRow(context, question, key, infinitebench.TOKENS_PER_LINE * (size - line), line, size)
        return Built(infinitebench.infinitebench_prompt(task, row, INFBENCH_TEMPLATE), [key])

    return build


def _math_find(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
    task = infinitebench.MATH_FIND_TASKS[rng.randrange(len(infinitebench.MATH_FIND_TASKS))]
    row = infinitebench.generate_math_find_row(task, rng, size)
    return Built(infinitebench.infinitebench_prompt("math_find", row, INFBENCH_TEMPLATE), [repr(row.answer)])


def _label(text: str) -> int | float:
    """A math_find answer as the original's row holds it: an int, or a float for a median."""
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _infbench_score(task: str) -> Callable[[str, RulerSample], float]:
    def score(reply: str, sample: RulerSample) -> float:
        answer = sample.outputs[0]
        return score_row(task, reply, _label(answer) if task == "math_find" else answer)

    return score


def _facts(task: str) -> Build:
    def build(rng: random.Random, size: int, depth: float, background: Background | None) -> Built:
        if background is None:
            raise CtxevalError(f"facts:{task} needs a background text")
        story = babilong.babi_story(task, rng)
        facts_tokens = sum(background.count(" " + fact) for fact in story.facts)
        start = rng.randrange(len(background.sentences))
        context, _ = babilong.interleave(
            story.facts, background.sentences, max(size, facts_tokens), background.count, rng, start
        )
        return Built(babilong.babilong_prompt(task, context, story.question), [story.answer])

    return build


def _facts_score(task: str) -> Callable[[str, RulerSample], float]:
    def score(reply: str, sample: RulerSample) -> float:
        question = facts_question(sample.input)
        return float(babilong.compare_answers(sample.outputs[0], reply, question, babilong.TASK_LABELS[task]))

    return score


def facts_question(prompt: str) -> str:
    """The question of a facts prompt: babilong_prompt ends with it, and bAbI's questions end at '? ' (a chat
    wrapper's end after it is cut off)."""
    question = prompt.rpartition("Question: ")[2]
    end = question.find("?")
    return question if end < 0 else question[: end + 1] + (" " if question[end + 1 : end + 2] == " " else "")


LITM_INSTRUCT = (
    "the model's own instruct/chat format: get_kv_responses_from_mpt.py format_instruct_prompt (mpt-30b-instruct), "
    "get_kv_responses_from_longchat.py format_chat_prompt (fastchat's vicuna, longchat)"
)
BABILONG_INSTRUCT = (
    "run_model_on_babilong.py --use_chat_template (set for instruct models): apply_chat_template of one user turn, "
    "add_generation_prompt=True"
)
HELMET_INSTRUCT = "bare: configs/recall*.yaml set use_chat_template: false for every model"
INFBENCH_INSTRUCT = "bare: yarn-mistral's templates unwrapped for its open models, the chat model chatglm3 included"

SUITE_TASKS: dict[str, SuiteTask] = {
    t.name: t
    for t in [
        SuiteTask(
            "litm:kv",
            "nelson-liu/lost-in-the-middle kv_retrieval (make_kv_retrieval_data.py, kv_retrieval.prompt, "
            "evaluate_kv_responses.py)",
            litm_kv.MAX_NEW_TOKENS,
            "key-value pairs",
            2,
            _litm,
            lambda reply, sample: litm_kv.score_kv_answer(sample.outputs[0], reply),
            is_kv=True,
            wraps_instruct=True,
            instruct=LITM_INSTRUCT,
        ),
        SuiteTask(
            "helmet:json_kv",
            "princeton-nlp/HELMET json_kv (load_json_kv, substring_exact_match); the generator is a stand-in",
            helmet_json_kv.GENERATION_MAX_LENGTH,
            "key-value pairs",
            helmet_json_kv.SHOTS + 1,
            _helmet,
            lambda reply, sample: float(helmet_json_kv.json_kv_score(reply, sample.outputs)),
            is_kv=True,
            instruct=HELMET_INSTRUCT,
        ),
        SuiteTask(
            "infbench:kv_retrieval",
            "OpenBMB/InfiniteBench kv_retrieval (construct_synthetic_dataset.py, compute_scores.py)",
            infinitebench.MAX_NEW_TOKENS["kv_retrieval"],
            "key-value pairs",
            2,
            _infbench_kv,
            _infbench_score("kv_retrieval"),
            is_kv=True,
            instruct=INFBENCH_INSTRUCT,
        ),
        SuiteTask(
            "infbench:passkey",
            "OpenBMB/InfiniteBench passkey",
            infinitebench.MAX_NEW_TOKENS["passkey"],
            "noise lines",
            1,
            _needle("passkey"),
            _infbench_score("passkey"),
            instruct=INFBENCH_INSTRUCT,
        ),
        SuiteTask(
            "infbench:number_string",
            "OpenBMB/InfiniteBench number_string",
            infinitebench.MAX_NEW_TOKENS["number_string"],
            "noise lines",
            1,
            _needle("number_string"),
            _infbench_score("number_string"),
            instruct=INFBENCH_INSTRUCT,
        ),
        SuiteTask(
            "infbench:math_find",
            "OpenBMB/InfiniteBench math_find (its 7 questions drawn per sample)",
            infinitebench.MAX_NEW_TOKENS["math_find"],
            "list items",
            10,
            _math_find,
            _infbench_score("math_find"),
            has_depth=False,
            instruct=INFBENCH_INSTRUCT,
        ),
        *(
            SuiteTask(
                f"facts:{task}",
                f"bAbI-style {task} facts in prose (generated stories; BABILong's prompt, interleaving and "
                "compare_answers): not BABILong",
                babilong.MAX_NEW_TOKENS,
                "tokens of facts and background",
                1,
                _facts(task),
                _facts_score(task),
                has_depth=False,
                needs_background=True,
                wraps_instruct=True,
                instruct=BABILONG_INSTRUCT,
            )
            for task in babilong.GENERATED_TASKS
        ),
    ]
}


def check_depths(depths: tuple[float, ...]) -> tuple[float, ...]:
    if not depths:
        raise CtxevalError("--depths names no depth; give percentages from 0 to 100, e.g. 0,50,100")
    bad = [d for d in depths if not 0 <= d <= 100]
    if bad:
        raise CtxevalError(f"--depths {bad[0]:g} is outside 0-100 (0 puts the answer first, 100 last)")
    if len(set(depths)) != len(depths):
        raise CtxevalError("--depths names a depth twice; give each once")
    return depths


def fixed_size(task: SuiteTask, length: int, kv_pairs: int | None) -> int | None:
    """The count the original fixes at this length (HELMET's table) or the user's --kv-pairs; None to fill."""
    if task.is_kv and kv_pairs is not None:
        return kv_pairs
    if task.name == "helmet:json_kv":
        return helmet_json_kv.NUM_KVS_LLAMA2.get(length)
    return None


class Sizer:
    """The largest size of `task` whose prompt (in `wrapper`, RULER's `{task_template}` form) plus its generation
    budget fits `length` tokens."""

    def __init__(
        self,
        task: SuiteTask,
        length: int,
        count: Callable[[str], int],
        background: Background | None = None,
        wrapper: str = "{task_template}",
    ) -> None:
        self.task, self.length, self.count, self.background, self.wrapper = task, length, count, background, wrapper

    def build(self, seed: str, size: int, depth: float) -> Built:
        built = self.task.build(random.Random(seed), size, depth, self.background)
        return Built(wrap(built.text, self.wrapper), built.outputs)

    def total(self, seed: str, size: int, depths: tuple[float, ...]) -> int:
        """The longest prompt over `depths` at `size`, in tokens, plus the generation budget."""
        longest = max(self.count(self.build(seed, size, d).text) for d in depths)
        return longest + self.task.tokens_to_generate

    def refuse(self, total: int, why: str = "") -> CtxevalError:
        return CtxevalError(
            f"{self.task.name}: length {self.length:,} is {TOO_SHORT} ({total:,} tokens with this tokenizer{why}); "
            "use longer --lengths"
        )

    def largest(self, seed: str, depths: tuple[float, ...]) -> int:
        low = self.task.min_size
        total = self.total(seed, low, depths)
        if total > self.length:
            raise self.refuse(total, f", {low} {self.task.unit}")
        probe = low * 4  # a size past which the prompt grows (a facts prompt grows once the budget passes its facts)
        while (grown := self.total(seed, probe, depths)) == total and probe < self.length:
            probe *= 2
        per_unit = max((grown - total) / (probe - low), 1e-3)
        high = max(low + 1, int(low + (self.length - total) / per_unit * 1.2) + 1)
        while self.total(seed, high, depths) <= self.length:  # low fits, high does not
            low, high = high, self.grown(high * 2)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.total(seed, middle, depths) <= self.length else (low, middle)
        return low

    def grown(self, size: int) -> int:
        """`size`, refused where a prompt would still fit past one unit per token (its prompt stopped growing)."""
        if size > 2 * self.length + self.task.min_size:
            raise CtxevalError(f"{self.task.name}: the prompt stops growing below {self.length:,} tokens")
        return size

    def adjusted(self, seed: str, depths: tuple[float, ...], start: int) -> int:
        """The largest fitting size near `start` (another sample's largest: draws differ by a few tokens), by steps
        that double away from `start`, then halve."""

        def fits(size: int) -> bool:
            return self.total(seed, size, depths) <= self.length

        step = 1
        if fits(start):
            low = start
            while fits(self.grown(low + step)):
                low, step = low + step, step * 2
            high = low + step
        else:
            high = start
            while True:
                candidate = max(high - step, self.task.min_size)
                if fits(candidate):
                    low = candidate
                    break
                if candidate == self.task.min_size:
                    raise self.refuse(self.total(seed, candidate, depths))
                high, step = candidate, step * 2
        while high - low > 1:  # low fits, high does not
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return low


def task_wrapper(task: SuiteTask, template: str, tokenizer: Any) -> str:
    """The wrapper `task`'s prompts get under the run's `template` (auto, chat, base or a RULER name): the template's
    where the task's original wraps an instruct model's prompt, else the bare slot."""
    return wrapper_text(task_format(task.wraps_instruct, template), tokenizer)


def sample_seed(seed: int, task: str, length: int, number: int) -> str:
    """The draws of sample `number` (the same at every depth); `random.Random` hashes a string seed stably."""
    return f"{seed}:{task}:{length}:{number}"


def generate_suite(
    task_name: str,
    length: int,
    num_samples: int,
    tokenizer: Any,
    seed: int,
    depths: tuple[float, ...] = DEFAULT_DEPTHS,
    kv_pairs: int | None = None,
    background: tuple[str, str] | None = None,
    template: str = "base",
) -> list[RulerSample]:
    """`num_samples` prompts per depth (one set for a task without depth), sample index = depth's position x
    num_samples + j, each filling `length` tokens (or at the count `fixed_size` gives), wrapped as `template` says
    for this task (task_wrapper)."""
    task = SUITE_TASKS[task_name]
    depths = check_depths(depths) if task.has_depth else (50.0,)

    def count(text: str) -> int:
        return len(tokenizer.tokenize(text))

    sizer = Sizer(task, length, count, prose(task, background, tokenizer), task_wrapper(task, template, tokenizer))
    fixed = fixed_size(task, length, kv_pairs)
    if fixed is not None and fixed < task.min_size:
        raise CtxevalError(f"--kv-pairs {fixed}: {task.name} needs at least {task.min_size} pairs")
    sizes = []
    for number in range(num_samples):
        seed_text = sample_seed(seed, task_name, length, number)
        if fixed is not None:
            total = sizer.total(seed_text, fixed, depths)
            if total > length:
                raise CtxevalError(
                    f"{task.name}: {fixed:,} key-value pairs take {total:,} tokens with this tokenizer (generation "
                    f"budget included), more than --lengths {length:,}; give fewer --kv-pairs or a longer length"
                )
            sizes.append(fixed)
        elif not sizes:
            sizes.append(sizer.largest(seed_text, depths))
        else:
            sizes.append(sizer.adjusted(seed_text, depths, sizes[0]))
    samples = []
    for k, depth in enumerate(depths):
        for number, size in enumerate(sizes):
            built = sizer.build(sample_seed(seed, task_name, length, number), size, depth)
            total = count(built.text) + task.tokens_to_generate
            samples.append(
                RulerSample(
                    k * num_samples + number,
                    built.text,
                    built.outputs,
                    total,
                    "",
                    depth=depth if task.has_depth else None,
                    size=size,
                )
            )
    return samples


def smallest_suite_prompt(
    task_name: str,
    tokenizer: Any,
    seed: int,
    background: tuple[str, str] | None = None,
    template: str = "base",
) -> int:
    """Tokens of the task's smallest prompt (its minimum size, sample 0, depth 50, in its wrapper) plus its generation
    budget."""
    task = SUITE_TASKS[task_name]

    def count(text: str) -> int:
        return len(tokenizer.tokenize(text))

    sizer = Sizer(task, 0, count, prose(task, background, tokenizer), task_wrapper(task, template, tokenizer))
    return count(sizer.build(sample_seed(seed, task_name, 0, 0), task.min_size, 50.0).text) + task.tokens_to_generate


def prose(task: SuiteTask, background: tuple[str, str] | None, tokenizer: Any) -> Background | None:
    """The background of a facts task from (text, where it comes from): its sentences of at least 10 tokens."""
    if not task.needs_background:
        return None
    if background is None or not background[0].strip():
        raise CtxevalError(f"{task.name} needs a background text: give --essay-substitute a corpus")
    text, source = background
    sentences, count = cached_sentences(text, tokenizer)
    if len(sentences) < 3:
        raise CtxevalError(f"{task.name}: the background {source} holds fewer than 3 sentences of 10 tokens")
    return Background(sentences, count, source)


_SENTENCES: list[tuple[str, Any, list[str], Callable[[str], int]]] = []  # the last text, tokenizer and their counts


def cached_sentences(text: str, tokenizer: Any) -> tuple[list[str], Callable[[str], int]]:
    """babilong.background_sentences and a remembered token count, once per text and tokenizer: the sizing search
    builds a prompt a dozen times over the same sentences, and a run asks per task and length."""
    if not (_SENTENCES and _SENTENCES[0][0] == text and _SENTENCES[0][1] is tokenizer):

        @functools.lru_cache(maxsize=1 << 18)
        def count(piece: str) -> int:
            return len(tokenizer.tokenize(piece))

        _SENTENCES[:] = [(text, tokenizer, babilong.background_sentences(text, count), count)]
    return _SENTENCES[0][2], _SENTENCES[0][3]


def score_reply(task_name: str, reply: str, sample: RulerSample) -> float:
    """The original's score of one raw reply (the continuation decoded without special tokens)."""
    return SUITE_TASKS[task_name].score(reply, sample)
