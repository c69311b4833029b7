"""What the evaluations use of a loaded model, whichever backend loaded it: transformers (load.LoadedModel) or vLLM
(vllm_engine.VllmModel, whose weights live in one engine per method)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..rope.geometry import RopeInfo


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM loaded once for a run, with its tokenizer and the RoPE its config describes."""

    name: str  # what the user asked for
    tokenizer: Any  # the transformers tokenizer
    device: str
    dtype: str
    attn_implementation: str  # "vllm" on vLLM
    rope: RopeInfo

    @property
    def backend(self) -> str:
        """ "hf" or "vllm"."""
        ...

    @property
    def model(self) -> Any:
        """The transformers model in eval mode; None on vLLM."""
        ...

    @property
    def trained_length(self) -> int | None:
        """The length the model was trained at (rope.geometry.trained_length); None when the config declares none."""
        ...

    def record(self) -> dict[str, Any]:
        """The `model` entry of run.json."""
        ...
