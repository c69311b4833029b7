"""rope/geometry.py: how a config's position encoding is named, and where a learned position table ends."""

import pytest
from transformers import (
    BloomConfig,
    FalconConfig,
    GPT2Config,
    LlamaConfig,
    MptConfig,
    OPTConfig,
    SmolLM3Config,
    XGLMConfig,
)

from ctxeval.rope.geometry import position_encoding, position_limit, rope_info_from_config


@pytest.mark.parametrize(
    "config, encoding, limit",
    [
        (LlamaConfig(num_hidden_layers=2), "RoPE", None),
        (FalconConfig(num_hidden_layers=2), "RoPE", None),
        (FalconConfig(num_hidden_layers=2, alibi=True), "ALiBi", None),
        (BloomConfig(n_layer=2), "ALiBi", None),
        (MptConfig(n_layers=2), "ALiBi", None),
        (GPT2Config(n_layer=2, n_positions=1024), "learned", 1024),
        (OPTConfig(num_hidden_layers=2, max_position_embeddings=2048), "learned", 2048),
        (XGLMConfig(num_layers=2, max_position_embeddings=2048), "sinusoidal", None),
        (SmolLM3Config(num_hidden_layers=8), "RoPE (2 of 8 layers NoPE)", None),
        (SmolLM3Config(num_hidden_layers=4, no_rope_layers=[0, 0, 0, 0]), "NoPE", None),
    ],
)
def test_each_architecture_is_named_by_its_position_encoding(config, encoding, limit):
    assert position_encoding(config) == encoding
    assert position_limit(config) == limit
    assert (rope_info_from_config(config).geometry is not None) == encoding.startswith("RoPE")


def test_a_model_with_some_nope_layers_keeps_its_rope_geometry():
    info = rope_info_from_config(SmolLM3Config(num_hidden_layers=8, rope_theta=5e6))
    assert info.geometry is not None and info.geometry.base == 5e6
    info = rope_info_from_config(SmolLM3Config(num_hidden_layers=2, no_rope_layers=[0, 0]))
    assert info.geometry is None and "RoPE off in every layer (no_rope_layers all 0)" in info.reason
