import logging

import pytest
import torch

from transformers import LlamaConfig, LlamaForCausalLM

logging.getLogger("transformers").setLevel(logging.ERROR)

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Tests never write to the real user cache."""
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "ctxeval-cache"))


def tiny_llama(rope_parameters=None, seed=0, **overrides):
    """A tiny random Llama built from a config: no download. Trained length L = 64."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**TINY, **overrides}, rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def llama():
    return tiny_llama()
