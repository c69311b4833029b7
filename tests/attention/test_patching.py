"""Attention temperature: lambda multiplies every attention logit (RoPE and non-RoPE models), 1 is the identity,
the original scale comes back exactly, and the CLI records it like a method parameter."""

import json

import pytest
import torch
from helpers import build_tokenizer, tiny_llama
from transformers import BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel
from typer.testing import CliRunner

from ctxeval.attention.patching import attention_temperature
from ctxeval.cli import app
from ctxeval.errors import CtxevalError

runner = CliRunner()
IDS = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(0))


def _models():
    torch.manual_seed(0)
    return {
        "llama": tiny_llama(vocab_size=64, attn_implementation="eager"),
        "gpt2": GPT2LMHeadModel(
            GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=64, attn_implementation="eager")
        ).eval(),
        "bloom": BloomForCausalLM(
            BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=64, attn_implementation="eager")
        ).eval(),
    }


@pytest.mark.parametrize("name", ["llama", "gpt2", "bloom"])
def test_layer0_attention_is_softmax_of_lambda_times_logits(name):
    """softmax(lambda z) = softmax(lambda log softmax(z)): the per-row constant cancels, so layer 0's attention
    with lambda follows from its attention without (same input to layer 0)."""
    model = _models()[name]
    lam = 1.7
    with torch.inference_mode():
        base = model(IDS, output_attentions=True)
        with attention_temperature(model, lam) as changed:
            hot = model(IDS, output_attentions=True)
        again = model(IDS, output_attentions=True)
    assert changed == 2
    p1, plam = base.attentions[0].double(), hot.attentions[0].double()  # [1, heads, q, k]
    want = torch.softmax(lam * torch.log(p1), dim=-1)  # log 0 = -inf keeps the causal mask
    torch.testing.assert_close(plam, want, atol=2e-6, rtol=1e-4)
    assert not torch.allclose(hot.logits, base.logits)
    assert torch.equal(again.logits, base.logits)  # restored exactly


@pytest.mark.parametrize("name", ["llama", "gpt2", "bloom"])
def test_temperature_one_is_the_identity(name):
    model = _models()[name]
    with torch.inference_mode():
        base = model(IDS).logits
        with attention_temperature(model, 1.0) as changed:
            same = model(IDS).logits
    assert changed == 0 and torch.equal(base, same)


def test_sdpa_follows_the_same_scale():
    model = tiny_llama(vocab_size=64, attn_implementation="eager")
    sdpa = tiny_llama(vocab_size=64, attn_implementation="sdpa")
    with torch.inference_mode(), attention_temperature(model, 0.6), attention_temperature(sdpa, 0.6):
        torch.testing.assert_close(model(IDS).logits, sdpa(IDS).logits, atol=1e-5, rtol=1e-5)


def test_bad_values_and_unknown_modules():
    model = tiny_llama(vocab_size=64)
    for bad in (0.0, -1.0):
        with pytest.raises(CtxevalError, match="must be > 0"):
            with attention_temperature(model, bad):
                pass
    with pytest.raises(CtxevalError, match="not supported"):
        with attention_temperature(torch.nn.Linear(2, 2), 1.5):
            pass


def test_cli_sweeps_and_records_temperature(tmp_path, text_dir):
    tok = build_tokenizer()
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok), n_positions=128)).save_pretrained(
        tmp_path / "gpt2"
    )
    tok.save_pretrained(tmp_path / "gpt2")
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tmp_path / "gpt2"),
            "--data",
            str(text_dir),
            "--lengths",
            "32,64",
            "--method",
            "none",
            "--attention-temperature",
            "1,1.5",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["spec"]["methods"] == ["none", "none(attention_temperature=1.5)"]
    assert run["methods"]["none(attention_temperature=1.5)"]["attention_temperature"] == 1.5
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    by = {(r["label"], r["length"]): r for r in rows}
    assert by[("none(attention_temperature=1.5)", 64)]["params"] == {"attention_temperature": 1.5}
    assert by[("none", 64)]["params"] == {}
    assert by[("none", 64)]["ppl"] != by[("none(attention_temperature=1.5)", 64)]["ppl"]
    bad = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tmp_path / "gpt2"),
            "--data",
            str(text_dir),
            "--lengths",
            "32",
            "--attention-temperature",
            "0",
            "--out",
            str(tmp_path / "b"),
        ],
    )
    assert bad.exit_code == 2 and "must be > 0" in bad.output


def test_bloom_alibi_baseline_through_the_cli(tmp_path, text_dir):
    """ALiBi (no RoPE, no sdpa path in transformers): eager fallback with a note, method none, temperature recorded."""
    tok = build_tokenizer()
    BloomForCausalLM(BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=len(tok))).save_pretrained(
        tmp_path / "bloom"
    )
    tok.save_pretrained(tmp_path / "bloom")
    base = ["--model", str(tmp_path / "bloom"), "--data", str(text_dir), "--lengths", "32,64"]
    result = runner.invoke(app, ["ppl", *base, "--attention-temperature", "1,2", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "using eager attention" in result.output
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["model"]["attn_implementation"] == "eager" and run["model"]["rope"]["rotary_dim"] is None
    assert run["spec"]["methods"] == ["none", "none(attention_temperature=2)"]
    no_lengths = runner.invoke(app, ["ppl", *base[:4], "--out", str(tmp_path / "s")])
    assert no_lengths.exit_code == 2 and "give --lengths" in no_lengths.output
    entropy = runner.invoke(app, ["entropy", *base, "--out", str(tmp_path / "e")])
    assert entropy.exit_code == 2 and "sdpa" in entropy.output and not (tmp_path / "e").exists()


def test_a_scale_the_forward_never_reads_is_refused():
    """Falcon's RoPE attention keeps inv_norm_factor/beta but does not use them: the probe forward catches it."""
    from transformers import FalconConfig, FalconForCausalLM

    from ctxeval.attention.patching import supports_temperature

    torch.manual_seed(0)
    falcon = FalconForCausalLM(
        FalconConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=64,
            alibi=False,
            new_decoder_architecture=False,
        )
    ).eval()
    assert not supports_temperature(falcon)
    assert supports_temperature(tiny_llama(vocab_size=64))
