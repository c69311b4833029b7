"""A stand-in model that returns set losses, and token documents of the tiny model's vocabulary."""

import numpy as np
from helpers import TINY

from ctxeval.data.corpora import TokenDoc

L = TINY["max_position_embeddings"]


class FakeLM:
    """What sweep() needs from a LoadedModel."""

    def __init__(self, model):
        from ctxeval.rope.geometry import rope_info_from_config

        self.model, self.device, self.name = model, "cpu", "tiny"
        self.rope = rope_info_from_config(model.config)
        self.tokenizer = type("T", (), {"bos_token_id": 1})()


def docs(n=2, length=5 * L, seed=0):
    g = np.random.default_rng(seed)
    return [TokenDoc(f"doc{i}", g.integers(2, TINY["vocab_size"], length)) for i in range(n)]
