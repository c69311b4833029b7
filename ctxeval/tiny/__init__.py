"""A tiny Llama trained from scratch at a short context (bundled in `model/`), for demonstrating RoPE extension on a CPU.

`python -m ctxeval.tiny train` retrains it; `python -m ctxeval.tiny heldout DIR` writes its held-out documents.
Nothing heavy is imported here.
"""

from pathlib import Path

from ..util.paths import TINY_MODEL_DIR

MODEL_DIR: Path = TINY_MODEL_DIR

# What `ctxeval ppl` / `needle` / `passkey` run when --model is omitted: the bundled model on its held-out text, with
# methods that show the point (plain RoPE collapsing past 128 tokens, extension methods holding). Any option the
# user gives overrides its entry here. YaRN's ramp is set in rotations per original context (alpha=beta_slow,
# beta=beta_fast): the paper's 1 and 32 assume a 4k-context Llama; at 128 tokens the fastest pair turns only
# 128/2pi = 20 times, so 32/1 keeps 1 of 16 pairs and YaRN loses the needle even at L. The ramp scaled to this
# model (4, 0.25) keeps 3 and recovers it at 2L; model/MODEL_CARD.md shows both.
QUICKSTART: dict[str, dict[str, object]] = {
    "ppl": {
        "data": "pydoc",
        "docs": 3,
        "lengths": "64,128,256,512,1k",
        "method": ["none", "pi:factor=8", "ntk:factor=8", "yarn:factor=8", "yarn:factor=8,beta_fast=4,beta_slow=0.25"],
    },
    "needle": {
        "lengths": "128,256,512",
        "samples": 2,
        "method": ["none", "dynamic-ntk", "yarn:factor=4", "yarn:factor=4,beta_fast=4,beta_slow=0.25"],
    },
    "passkey": {
        "lengths": "128,256,512",
        "samples": 10,
        "method": ["none", "dynamic-ntk", "yarn:factor=4,beta_fast=4,beta_slow=0.25"],
    },
}

__all__ = ["MODEL_DIR", "QUICKSTART"]
