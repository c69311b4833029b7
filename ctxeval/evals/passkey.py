"""`ctxeval passkey --protocol yarn`: the passkey test of the YaRN repository, point by point.

jquesnelle/yarn eval/passkey.py (itself from epfml/landmark-attention llama/run_test.py) builds, for a character count
n_garbage, the text

    "\\n".join([task_description, garbage_inf[:n_prefix], information_line, garbage_inf[:n_garbage - n_prefix],
               final_question])

with n_prefix = randint(0, n_garbage) and the key randint(1, 50000), both fillers starting at "The grass" and cut at a
character count. For each target token count it steps n_garbage by 128 characters (--length-step) until
`len(tokenizer.encode(prompt))` (the tokenizer's defaults: with BOS where the tokenizer adds one) reaches the target and
keeps the last count below it, so a prompt is just under its target. The prompt goes through the 2023 text-generation
pipeline, which tokenizes it without special tokens (no BOS), decodes at most 10 new tokens, and the first run of digits
in the reply, as an int, must equal the key.

Here: the same text, the same length rule (found from an estimate and walked to the crossing rather than stepped from
0, with seeded draws so that it is reproducible; equal to the repo's stepping wherever the count grows with the
character count, which every 128-character step of filler does by far more tokens than the draws move it), no BOS
unless asked, greedy decoding of at most 10 new tokens, the repo's scoring. Unlike the repo, every method sees the same
prompts: the draws are seeded per (seed, length, sample). NeedleRunner does the generation, batching (prompts of equal
token count together), resume and out-of-memory handling; YarnPasskeyRunner only builds, orders and scores the prompts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.presets import load_task
from ..errors import CtxevalError
from .common import Progress
from .haystack import FILLER, NeedlePreset, Sample
from .needle import NeedleConfig, NeedleItem, NeedleRunner

# the strings of eval/passkey.py's generate_prompt, verbatim
YARN_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
YARN_GARBAGE = FILLER  # "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
YARN_INFORMATION = "The pass key is {key}. Remember it. {key} is the pass key."
YARN_QUESTION = "What is the pass key? The pass key is"
YARN_KEYS = (1, 50000)  # random.randint(1, 50000): both ends included
YARN_LENGTH_STEP = 128  # --length-step: characters of filler per step of the length search
YARN_MAX_NEW_TOKENS = 10  # pipe(prompt_text, num_return_sequences=1, max_new_tokens=10)
YARN_SAMPLES = 20  # --iterations
SEARCH_STREAM = 0x9A55  # seeds the length search's draws apart from the samples' (seed, length, 0, sample)

_DIGITS = re.compile(r"\d+")


def garbage(n_chars: int) -> str:
    """garbage_inf[:n_chars]: the filler repeated, joined by single spaces, cut at a character count (past the repo's
    10000 repetitions, ~890k characters, the same text continues)."""
    unit = YARN_GARBAGE + " "
    return (unit * (n_chars // len(unit) + 1))[:n_chars]


def information_line(key: int) -> str:
    return YARN_INFORMATION.format(key=key)


def yarn_prompt_text(n_garbage: int, n_prefix: int, key: int) -> str:
    """The text generate_prompt(n_garbage) returns when its draws are `n_prefix` and `key`."""
    if not 0 <= n_prefix <= n_garbage:
        raise ValueError(f"n_prefix must be in 0..{n_garbage}, got {n_prefix}")
    return "\n".join(
        [YARN_TASK, garbage(n_prefix), information_line(key), garbage(n_garbage - n_prefix), YARN_QUESTION]
    )


def draw(n_garbage: int, rng: np.random.Generator) -> tuple[int, int]:
    """generate_prompt's two draws, in its order: the prefix's characters (0..n_garbage), then the key (1..50000)."""
    n_prefix = int(rng.integers(0, n_garbage + 1))
    key = int(rng.integers(YARN_KEYS[0], YARN_KEYS[1] + 1))
    return n_prefix, key


def key_depth(n_prefix: int, n_garbage: int) -> float:
    """Where the key line goes, as % of the filler's characters (two decimals; 0 without filler)."""
    return round(100 * n_prefix / n_garbage, 2) if n_garbage else 0.0


def search_rng(seed: int, n_garbage: int) -> np.random.Generator:
    """The draws of the length search's prompt of `n_garbage` characters (the same for every target and method)."""
    return np.random.default_rng([SEARCH_STREAM, seed, n_garbage])


def yarn_score(response: str, key: int) -> bool:
    """test_model's rule: int(re.search(r'\\d+', response).group()) == pass_key; no digits is wrong.
    So ' 45028.', '-45028' and '045028' all answer 45028."""
    found = _DIGITS.search(response)
    return found is not None and int(found.group()) == int(key)


@dataclass
class YarnPrompt:
    ids: list[int]  # the prompt's tokens: [BOS with --bos] + the text without special tokens
    answer_ids: list[int]  # " KEY" (recorded as answer_tokens; generation is not forced)
    text: str
    garbage_chars: int  # n_garbage: the length search's result for the target
    prefix_chars: int  # n_garbage_prefix: the filler's characters before the key line
    key: int
    haystack_tokens: int  # the two filler parts' tokens, each counted alone


class YarnPasskeyBuilder:
    """The repo's prompts for a tokenizer: the length search (memoised per target) and one prompt per draw."""

    def __init__(
        self,
        tokenizer: Any,
        preset: NeedlePreset | None = None,
        *,
        seed: int = 0,
        bos: bool = False,
        length_step: int = YARN_LENGTH_STEP,
    ) -> None:
        if length_step < 1:
            raise CtxevalError(f"the length step must be >= 1 character, got {length_step}")
        self.tok = tokenizer
        self.preset = preset or NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle"))
        self.seed = seed
        self.step = length_step
        self.bos = [tokenizer.bos_token_id] if bos and tokenizer.bos_token_id is not None else []
        self._counts: dict[int, int] = {}
        self._chars: dict[int, int] = {}
        self._per_char: float | None = None

    def encode(self, text: str) -> list[int]:
        """Tokens as the pipeline fed them: add_special_tokens=False."""
        return list(self.tok(text, add_special_tokens=False)["input_ids"]) if text else []

    def search_tokens(self, n_garbage: int) -> int:
        """len(tokenizer.encode(generate_prompt(n_garbage)[0])) with the search's seeded draws: the tokenizer's
        defaults, so with BOS where the tokenizer adds one, as the repo counts."""
        if n_garbage not in self._counts:
            text = yarn_prompt_text(n_garbage, *draw(n_garbage, search_rng(self.seed, n_garbage)))
            self._counts[n_garbage] = len(self.tok.encode(text))
        return self._counts[n_garbage]

    def minimum_length(self) -> int:
        """The shortest target the search can stay under: one more than the prompt without filler."""
        return self.search_tokens(0) + 1

    def garbage_chars(self, target: int) -> int:
        """The repo's n_garbage for `target` tokens: the multiple of the step whose prompt has fewer tokens than the
        target while the next one's does not (0 when even the prompt without filler reaches it, as the repo's loop
        ends). Walked from an estimate of the filler's tokens per character instead of from 0."""
        if target in self._chars:
            return self._chars[target]
        n = 0
        if self.search_tokens(0) < target:
            if self._per_char is None:
                sample = garbage(16 * self.step)
                self._per_char = max(len(self.encode(sample)), 1) / len(sample)
            n = max(0, int((target - self.search_tokens(0)) / self._per_char) // self.step * self.step)
            for _ in range(8):  # secant steps: the rate measured at n corrects the estimate to within a few steps
                rate = (self.search_tokens(n) - self.search_tokens(0)) / n if n else 0.0
                if rate <= 0:
                    break
                jump = math.floor((target - self.search_tokens(n)) / rate / self.step) * self.step
                if abs(jump) <= 2 * self.step:
                    break
                n = max(0, n + jump)
            while n > 0 and self.search_tokens(n) >= target:
                n -= self.step
            ceiling = n + 64 * target  # characters: far past any filler's tokens per character
            while self.search_tokens(n + self.step) < target:
                n += self.step
                if n > ceiling:  # a bound for a count that stops growing: fails fast instead of hanging
                    raise RuntimeError(f"passkey: {n:,} characters of filler stay under {target:,} tokens")
        self._chars[target] = n
        return n

    def depth(self, length: int, rng: np.random.Generator) -> float:
        """The key line's depth of the prompt `rng` draws for target `length` (key_depth), without building it."""
        n = self.garbage_chars(length)
        return key_depth(draw(n, rng)[0], n)

    def build(self, length: int, rng: np.random.Generator) -> tuple[Sample, float, YarnPrompt]:
        """One prompt of target `length`: generate_prompt(n_garbage) with `rng`'s draws, tokenized as the pipeline did
        (plus BOS with --bos). The sample, the key line's depth and the prompt."""
        n = self.garbage_chars(length)
        n_prefix, key = draw(n, rng)
        text = yarn_prompt_text(n, n_prefix, key)
        hay = len(self.encode(garbage(n_prefix))) + len(self.encode(garbage(n - n_prefix)))
        prompt = YarnPrompt(self.bos + self.encode(text), self.encode(f" {key}"), text, n, n_prefix, key, hay)
        sample = Sample((information_line(key),), 1, YARN_QUESTION, "", (str(key),))
        return sample, key_depth(n_prefix, n), prompt


class YarnPasskeyRunner(NeedleRunner):
    """NeedleRunner over the repo's prompts: greedy generation of at most 10 new tokens (--max-new-tokens), the repo's
    scoring; prompts of one target are run shortest first, so that equal token counts share a generate call."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        device: str,
        builder: YarnPasskeyBuilder,
        cfg: NeedleConfig,
        model_name: str,
        task: str = "passkey",
        progress: Progress | None = None,
    ) -> None:
        if cfg.scoring != "generate":
            raise CtxevalError(
                f"--protocol yarn scores generated replies; --scoring {cfg.scoring} needs --protocol ctxeval"
            )
        if not cfg.random_depth:
            raise ValueError("the yarn passkey draws the key's position per sample: NeedleConfig(random_depth=True)")
        super().__init__(model, tokenizer, device, builder, cfg, model_name, task, progress)  # type: ignore[arg-type]
        self.yarn = builder

    def budget(self, sample: Sample) -> int:
        return self.cfg.max_new_tokens or YARN_MAX_NEW_TOKENS

    def depth(self, cell: tuple[int, int, int]) -> float:
        return self.yarn.depth(cell[0], self.cfg.rng(*cell))

    def item(self, length: int, depth_index: int, sample_index: int) -> NeedleItem:
        sample, depth, prompt = self.yarn.build(length, self.cfg.rng(length, depth_index, sample_index))
        return NeedleItem(length, depth_index, sample_index, depth, sample, prompt)  # type: ignore[arg-type]

    def score(self, sample: Sample, response: str) -> bool:
        return yarn_score(response, int(sample.answers[0]))

    def row_fields(self, it: NeedleItem) -> dict[str, Any]:
        return {
            "protocol": "yarn",
            "garbage_chars": it.prompt.garbage_chars,  # type: ignore[attr-defined]
            "prefix_chars": it.prompt.prefix_chars,
        }  # type: ignore[attr-defined]

    def batch_order(self, items: list[NeedleItem]) -> list[NeedleItem]:
        return sorted(items, key=lambda it: (len(it.prompt.ids), it.sample_index))
