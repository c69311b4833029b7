"""A tiny Llama trained from scratch at a short context (bundled in `model/`), for demonstrating RoPE extension on a CPU.

`python -m ctxeval.tiny train` retrains it; `python -m ctxeval.tiny heldout DIR` writes its held-out documents.
Nothing heavy is imported here.
"""

from pathlib import Path

MODEL_DIR: Path = Path(__file__).resolve().parent / "model"

__all__ = ["MODEL_DIR"]
