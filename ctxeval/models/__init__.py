"""What runs a model: loading it once with its RoPE read (load), what the evaluations use of a model on either backend
(protocol), the memory a run needs (memory), greedy generation's shared parts (generation), a method as transformers'
and vLLM's own RoPE config (rope_config, vllm_rope), and the vLLM engine with its rotary table read back
(vllm_engine).

`ctxeval.models.load_model` is the documented entry point; the rest is imported from its module."""

from .load import load_model

__all__ = ["load_model"]
