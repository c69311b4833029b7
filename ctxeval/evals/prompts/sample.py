"""The sample record RULER's JSONL holds: what every task of `ctxeval ruler` (RULER's and the retrieval suites')
yields and scores, and what a run's samples file writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RulerSample:
    """One prompt in RULER's JSONL format (`input` ends before the answer prefix; the model reads both)."""

    index: int
    input: str
    outputs: list[str]
    length: int  # prompt tokens (answer prefix included, no special tokens) + tokens_to_generate
    answer_prefix: str
    token_position_answer: int | None = None  # niah only: see answer_token_position
    depth: float | None = None  # where the answer sits, 0 (first) to 100 (last), for tasks with a depth axis
    size: int | None = None  # the generator's size: key-value pairs, noise lines, list items or background tokens

    @property
    def prompt(self) -> str:
        """What the model reads: input + answer prefix (call_api.py)."""
        return self.input + self.answer_prefix

    def record(self) -> dict[str, Any]:
        out = {
            "index": self.index,
            "input": self.input,
            "outputs": list(self.outputs),
            "length": self.length,
            "length_w_model_temp": self.length,
            "answer_prefix": self.answer_prefix,
        }
        if self.token_position_answer is not None:
            out["token_position_answer"] = self.token_position_answer
        if self.depth is not None:
            out["depth"] = self.depth
        if self.size is not None:
            out["size"] = self.size
        return out
