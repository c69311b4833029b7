"""models/rope_config.py: every rope_parameters entry, loaded by transformers itself, gives ctxeval's table. CPU only,
no vLLM: a wrong entry (llama3's frequency factors swapped, yarn's truncate forced, pi's factor inverted, LongRoPE's
lists swapped) is caught here, not only by vLLM's read-back or after a whole `tune --export` search."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ctxeval.models.rope_config import legacy_rope_scaling, rope_parameters
from ctxeval.rope.methods import Geometry, compute
from ctxeval.specs import expand_specs

GEOM = Geometry(rotary_dim=64, base=10000.0, original_length=2048)
TARGET = 8192
# per-pair lists that differ pair by pair and between short and long (a swap or a reversal changes the table)
SHORT = ";".join(f"{1 + 0.01 * i:.2f}" for i in range(32))
LONG = ";".join(f"{1 + 0.1 * i:.1f}" for i in range(32))
SPECS = [
    "none",
    "ntk:factor=4",
    "pi:factor=4",
    "yarn:factor=4",
    "yarn:factor=4,truncate=false",
    "yarn:factor=4,beta_fast=8,beta_slow=0.5,attention_factor=1.3",
    "llama3:factor=4,low_freq_factor=2,high_freq_factor=8",
    f"longrope:factor=4,short_factor={SHORT},long_factor={LONG}",
]


def transformers_table(entry: dict, seq_len: int) -> tuple[np.ndarray, float]:
    """The inverse frequencies and attention factor transformers computes from a config holding `entry`, as a model
    loaded from the exported config.json would (max_position_embeddings = the target, as the export writes it)."""
    config = LlamaConfig(
        hidden_size=4 * GEOM.rotary_dim,
        num_attention_heads=4,
        head_dim=GEOM.rotary_dim,
        max_position_embeddings=TARGET,
        rope_parameters=dict(entry),
    )
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        inv = 1.0 / config.rope_parameters["rope_theta"] ** (np.arange(0, GEOM.rotary_dim, 2) / GEOM.rotary_dim)
        return inv, 1.0
    inv, attention = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    return inv.double().numpy(), float(attention)


@pytest.mark.parametrize("text", SPECS)
@pytest.mark.parametrize("length", [GEOM.original_length, TARGET])
def test_every_entry_loaded_by_transformers_is_ctxevals_table(text, length):
    """Bugs caught: llama3's low and high frequency factors swapped, yarn's truncate forced true, pi's factor written
    as 1/s, LongRoPE's short and long lists swapped, ntk's new base with the wrong exponent, a yarn attention factor
    left out (transformers would compute its own)."""
    spec = expand_specs([text])[0]
    entry = rope_parameters(spec, GEOM, TARGET)
    got, attention = transformers_table(entry, length)
    want = compute(spec.method, GEOM, spec.params, length)
    np.testing.assert_allclose(got, want.inv_freq, rtol=1e-6)
    assert attention == pytest.approx(want.attention_factor, rel=1e-6)


@pytest.mark.parametrize("text", SPECS)
def test_the_legacy_rope_scaling_form_is_the_same_entry(text):
    """transformers 4's rope_scaling (with `type`) beside rope_theta holds the same entry. Bug caught: a key dropped
    or renamed in the legacy form (what vLLM's --hf-overrides and older readers load)."""
    entry = rope_parameters(expand_specs([text])[0], GEOM, TARGET)
    legacy = legacy_rope_scaling(entry)
    assert legacy["rope_theta"] == entry["rope_theta"]
    if entry["rope_type"] == "default":
        assert legacy["rope_scaling"] is None
    else:
        scaling = dict(legacy["rope_scaling"])
        assert scaling.pop("type") == entry["rope_type"]
        assert {**scaling, "rope_theta": entry["rope_theta"]} == entry
