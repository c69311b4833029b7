"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
github.com/NVIDIA/RULER): the synthetic tasks' prompts as RULER's classic scripts generate them, and RULER's scoring.

Written from RULER's specification (scripts/synthetic.yaml, scripts/data/synthetic/{constants, niah,
variable_tracking, common_words_extraction, freq_words_extraction}.py, scripts/data/prepare.py, template.py,
scripts/eval/evaluate.py and eval/synthetic/constants.py), point by point, including the order in which each
generator draws from Python's `random` and numpy's legacy global generator: with the same seed (RULER's default 42),
the same tokenizer, the same word lists (wonderwords 2.2.0) and the same essay text, a (task, length) yields the
same prompts as RULER's scripts (checked against RULER's own niah.py by benchmarks/ruler_parity.py). docs/ruler.md
lists every point and each difference kept.

Lengths are counted as RULER counts them: `len(tokenizer.tokenize(prompt))` (no special tokens) for the prompt with
its answer prefix, plus the task's tokens_to_generate, must not exceed the length. The haystack is the largest one
RULER's binary search finds for one draw; each sample then backs off by the task's increment until it fits.

qa_1/qa_2 read the SQuAD and HotpotQA files RULER downloads (squad.json, hotpotqa.json in one folder). The model
template (RULER's template.py: `base` for base models, or one of its chat wrappers; `chat` the tokenizer's own chat
template; `auto` one of `chat` and `base` by the model's kind: evals.prompts.wrapping) wraps the task template before
the answer prefix, as prepare.py does; its tokens count toward the length.

The code: tasks.py (families and tasks; the templates and the sample record are evals.prompts'), sources.py (essays,
word lists, the random stream), one generator module per RULER script family (niah.py, vt.py, words.py for cwe and
fwe, qa.py), and this module: sizing each task's haystack to the length (`generate`) and RULER's scoring.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ...errors import CtxevalError
from ..prompts.sample import RulerSample
from ..prompts.templates import MODEL_TEMPLATES, check_template
from ..prompts.wrapping import wrapper_text
from ..retrieval.suite import DEFAULT_DEPTHS, SUITE_TASKS, generate_suite, smallest_suite_prompt
from .niah import Niah, answer_token_position
from .qa import QA, QA_URLS
from .sources import Sources, Stream, english_words
from .tasks import (
    FAMILIES,
    NOISE,
    RULER_SEED,
    TASKS,
    RulerTask,
    split_prefix,
)
from .vt import VariableTracking
from .words import CommonWords, FreqWords

# the names other code reads through this module (tests/test_ruler*.py as `R.<name>`); they live in the modules above
__all__ = [
    "FAMILIES",
    "MODEL_TEMPLATES",
    "NOISE",
    "QA_URLS",
    "TASKS",
    "Sources",
    "english_words",
    "generate",
    "postprocess",
    "score",
    "smallest_prompt",
]


# ---------------------------------------------------------------------------------------------------------------
# sizing and samples


def _search(
    make: Callable[[int], tuple[str, list[str]]],
    fits: Callable[[str], bool],
    start: int,
    upper: int,
    unfilled: Callable[[], str] | None = None,
) -> int:
    """RULER's binary search: the largest haystack size in [start, upper] whose prompt fits (start if none does).

    upper is three times the size the length needs (_upper), so a prompt that still fits there has a haystack that
    does not grow it (an empty essay file): with `unfilled` (the error's text), that is refused instead of measured
    short."""
    low, high, best = start, upper, None
    probes = 0
    while low <= high:
        probes += 1
        if probes > 64:  # bisection over any size range ends long before: a bug, never a longer search
            raise RuntimeError(f"RULER's size search did not converge in [{start}, {upper}]")
        mid = (low + high) // 2
        text, _ = make(mid)
        if fits(text):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if unfilled is not None and best == upper:
        raise CtxevalError(unfilled())
    return best if best is not None else start


def _upper(
    make: Callable[[int], tuple[str, list[str]]],
    count: Callable[[str], int],
    length: int,
    probe: int,
    step: int,
    family: str,
) -> int:
    """The search's upper bound from one probe's tokens per haystack unit: 3x for niah and vt, 2x for cwe."""
    per_unit = count(make(probe)[0]) / probe
    estimate = int(length // per_unit) * 2 if family == "common_words_extraction" else int((length / per_unit) * 3)
    return max(estimate, step * 2)


def generate(
    task_name: str,
    length: int,
    num_samples: int,
    tokenizer: Any,
    sources: Sources,
    seed: int = RULER_SEED,
    model_template: str = "base",
    depths: tuple[float, ...] = DEFAULT_DEPTHS,
    kv_pairs: int | None = None,
) -> list[RulerSample]:
    """`num_samples` prompts of one task at one length, as RULER's prepare.py + generator script write them
    (`model_template`: prepare.py's --model_template_type); a retrieval task's (`depths`, `kv_pairs`) from
    evals.retrieval.suite."""
    if task_name in SUITE_TASKS:
        background = (" ".join(sources.essay_words), sources.essay_source) if sources.essay_words else None
        return generate_suite(
            task_name, length, num_samples, tokenizer, seed, depths, kv_pairs, background, model_template
        )
    if task_name not in TASKS:
        raise CtxevalError(f"unknown RULER task '{task_name}'; tasks: {', '.join(TASKS)}")
    task = TASKS[task_name]
    family = FAMILIES[task.family]

    def count(text: str) -> int:
        return len(tokenizer.tokenize(text))

    model_template = wrapper_text(check_template(model_template), tokenizer)  # auto and chat: from the tokenizer
    stream = Stream(seed)
    ttg = family.tokens_to_generate

    def unfilled() -> str:
        what = (
            f"the essay haystack ({sources.essay_source or 'essays'})"
            if task.args.get("type_haystack") == "essay"
            else "the haystack"
        )
        return (
            f"{task_name}: {what} cannot fill {length} tokens (the prompt stops growing at "
            f"{count(make(upper)[0]) + ttg} tokens); give longer essays (--essays) or shorter --lengths"
        )

    if task.family == "freq_words_extraction":
        return _fwe_samples(task, length, num_samples, count, FreqWords(task, sources, stream, length, model_template))
    if task.family == "niah":
        make: Any = Niah(task, sources, stream, model_template)
        step = make.increment(length)
        upper = _upper(make, count, length, step, step, task.family)
        size = _search(make, lambda text: count(text) + ttg <= length, step, upper, unfilled)
    elif task.family == "variable_tracking":
        make = VariableTracking(task, sources, stream, model_template)
        make.example = _vt_example(make, count)
        step = make.increment(length)
        example_tokens = count(make.example)
        upper = _upper(make.generate, count, length, step, step, task.family)
        size = _search(make.generate, lambda text: count(text) + example_tokens + ttg <= length, step, upper, unfilled)
    elif task.family == "qa":
        make = QA(task, sources, stream, model_template)
        step = make.increment(length)
        upper = _upper(make, count, length, step, step, task.family)  # the search uses question 0
        size = _search(make, lambda text: count(text) + ttg <= length, step, upper, unfilled)
    else:
        make = CommonWords(task, sources, stream, length, model_template)
        step = make.increment(length)
        upper = _upper(make, count, length, 4096, step, task.family)
        size = _search(make, lambda text: count(text) + ttg <= length, step, upper, unfilled)
    samples = []
    for index in range(num_samples):
        used = size
        if task.family == "qa":
            if index >= len(make.qas):
                raise CtxevalError(
                    f"{task_name}: the file holds {len(make.qas)} answerable questions, fewer than "
                    f"--samples {num_samples}"
                )
            make.index = index  # sample i asks question i (prepare.py's pre_samples is 0)
        for _ in range(used // max(step, 1) + 2):  # bounded: `used` shrinks by step until it fits or reaches step
            text, answer = make(used)
            total = count(text) + ttg
            if total <= length:
                break
            if used <= step:
                raise CtxevalError(
                    f"{task_name}: length {length} is shorter than the task's smallest prompt "
                    f"({total} tokens with this tokenizer); use longer --lengths"
                )
            used -= step
        else:
            raise RuntimeError(f"{task_name}: the sample's size search did not end (size {used}, step {step})")
        prompt, prefix = split_prefix(text, family)
        position = answer_token_position(prompt, answer, count) if task.family == "niah" else None
        samples.append(RulerSample(index, prompt, list(answer), total, prefix, position))
    return samples


def smallest_prompt(
    task_name: str,
    length: int,
    tokenizer: Any,
    sources: Sources,
    seed: int = RULER_SEED,
    model_template: str = "base",
) -> int:
    """The tokens (RULER's count, tokens_to_generate included) of the task's smallest prompt at `length`: its
    haystack at one increment, the size below which `generate` refuses the length. For fwe, the larger of the
    template alone and the 4 coded words of 50 tokens each RULER's vocabulary needs. One draw of the task's random
    stream: a sample of another draw may differ by a few tokens (generate still refuses exactly)."""
    if task_name in SUITE_TASKS:
        background = (" ".join(sources.essay_words), sources.essay_source) if sources.essay_words else None
        return smallest_suite_prompt(task_name, tokenizer, seed, background, model_template)
    task = TASKS[task_name]
    family = FAMILIES[task.family]
    ttg = family.tokens_to_generate
    model_template = wrapper_text(model_template, tokenizer)

    def count(text: str) -> int:
        return len(tokenizer.tokenize(text))

    stream = Stream(seed)
    if task.family == "freq_words_extraction":
        fwe = FreqWords(task, sources, stream, length, model_template)
        return max(count(fwe.template.format(context="", query="")) + ttg, 4 * 50 + ttg)
    if task.family == "variable_tracking":
        vt = VariableTracking(task, sources, stream, model_template)
        example = _vt_example(vt, count)
        return count(vt.generate(vt.increment(length))[0]) + count(example) + ttg
    if task.family == "niah":
        make: Any = Niah(task, sources, stream, model_template)
    elif task.family == "qa":
        make = QA(task, sources, stream, model_template)
    else:
        make = CommonWords(task, sources, stream, length, model_template)
    return count(make(make.increment(length))[0]) + ttg


def _vt_example(vt: VariableTracking, count: Callable[[str], int]) -> str:
    """variable_tracking.py's few-shot example: one sample at max_seq_length 500 with nothing to generate, 3-letter
    names and the value 12345; its input + ' ' + its answer + a newline."""
    budget, step = 500, 5

    def make(n: int) -> tuple[str, list[str]]:
        return vt.generate(n, is_icl=True)

    size = _search(make, lambda text: count(text) <= budget, step, _upper(make, count, budget, step, step, "vt"))
    for _ in range(size // step + 2):  # bounded: `size` shrinks by step until it fits or reaches step
        text, answer = make(size)
        if count(text) <= budget or size <= step:
            break
        size -= step
    else:
        raise RuntimeError(f"vt's few-shot example: the size search did not end (size {size})")
    return text + " " + " ".join(answer) + "\n"


def _fwe_samples(
    task: RulerTask, length: int, num_samples: int, count: Callable[[str], int], fwe: FreqWords
) -> list[RulerSample]:
    """freq_words_extraction.py: the word count grows until the prompt reaches the budget, then one step back; each
    sample draws a fresh vocabulary and backs off while it is too long. A length too short for the task (a coded
    vocabulary of fewer than 4 words, a prompt that does not fit with no words, answers that would not occur) is
    refused in one line; so is a prompt that stops growing (never measured short)."""
    budget, step = fwe.budget, fwe.budget // 32
    family = FAMILIES[task.family]
    smallest = count(fwe.template.format(context="", query="")) + family.tokens_to_generate
    if fwe.vocab_size < 4 or smallest > length:
        need = max(4 * 50 + family.tokens_to_generate, smallest)
        raise CtxevalError(
            f"{task.name}: length {length} is shorter than the task's smallest prompt (RULER's coded "
            f"vocabulary of (length - {family.tokens_to_generate}) // 50 words needs 4, and the "
            f"template alone is {smallest} tokens with this tokenizer); use --lengths of at least "
            f"{need}"
        )
    vocab = fwe.vocab()
    num_words = budget // fwe.coded_wordlen
    text, _ = fwe.text(vocab, num_words)
    # far past any prompt that fits: 39% of the words are coded words of a token or more (the rest the '...' noise),
    # so `budget` tokens hold fewer than 2.6 x budget words; at most 128 steps of budget // 32
    ceiling = num_words + 4 * budget
    have = count(text)
    for _ in range(
        4 * budget // max(step, 1) + 2
    ):  # bounded: the ceiling ends a count that grows; this, one that does not
        if have >= budget or num_words + step > ceiling:
            break
        num_words += step
        text, _ = fwe.text(vocab, num_words)
        have = count(text)
    if have < budget:
        raise CtxevalError(
            f"{task.name}: the prompt stops growing at {have} tokens, short of the {length}-token "
            "length; this tokenizer cannot fill it"
        )
    num_words -= step
    samples = []
    for index in range(num_samples):
        vocab, words = fwe.vocab(), num_words
        text, answer = fwe.text(vocab, words)
        for _ in range(words // max(step, 1) + 2):  # bounded: `words` shrinks by step until it fits or reaches step
            if count(text) <= budget:
                break
            if words <= step:
                raise CtxevalError(
                    f"{task.name}: length {length} is shorter than the task's smallest prompt "
                    f"({count(text) + family.tokens_to_generate} tokens with this tokenizer); use longer "
                    "--lengths"
                )
            words -= step
            text, answer = fwe.text(vocab, words)
        else:
            raise RuntimeError(f"{task.name}: the sample's word count search did not end ({words} words)")
        if min(fwe.counts(words)[1:4], default=0) < 1:
            raise CtxevalError(
                f"{task.name}: at length {length} the prompt holds {words} coded words, too few for its "
                "three answers to occur; use longer --lengths"
            )
        prompt, prefix = split_prefix(text, family)
        samples.append(RulerSample(index, prompt, list(answer), count(text) + family.tokens_to_generate, prefix))
    return samples


# ---------------------------------------------------------------------------------------------------------------
# scoring (eval/evaluate.py, eval/synthetic/constants.py)


def postprocess(prediction: str) -> str:
    """RULER's postprocess_pred: strip, control characters to newlines, strip."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def score(metric: str, prediction: str, references: list[str]) -> float:
    """One sample's score in [0, 1]: string_match_all = share of references found (partial credit);
    string_match_part = 1 if any reference is found. Case-insensitive substring match, as RULER's."""
    found = [1.0 if ref.lower() in prediction.lower() else 0.0 for ref in references]
    return sum(found) / len(found) if metric == "string_match_all" else max(found)
