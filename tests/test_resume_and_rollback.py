"""What a resume re-measures, what a failed verification leaves behind, and golden cases the formula tests missed
(issue 17's bug classes, written as behaviour: each test fails for a one-line bug of its class)."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.rope.methods import Geometry, compute
from ctxeval.rope.patching import apply_method

runner = CliRunner()


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines() if line.strip()]


# the point identity of each kind, written here from what a point is (not read from ctxeval.runs.rows)
KINDS = {
    "ppl": (
        ["ppl", "--docs", "2", "--lengths", "32,64", "-m", "none", "-m", "yarn:factor=2"],
        ("label", "length", "doc"),
    ),
    "needle": (
        [
            "needle",
            "--lengths",
            "320,384",
            "--depths",
            "0,100",
            "--samples",
            "2",
            "--scoring",
            "forced",
            "-m",
            "none",
            "-m",
            "pi:factor=2",
        ],
        ("label", "length", "depth", "sample"),
    ),
    "entropy": (
        ["entropy", "--docs", "2", "--lengths", "32,64", "-m", "none", "-m", "yarn:factor=2"],
        ("label", "length", "doc"),
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_resume_measures_exactly_the_deleted_and_the_failed_points(kind, tmp_path, tiny_model_dir, text_dir):
    command, key_fields = KINDS[kind]
    data = ["--haystack", str(text_dir)] if kind == "needle" else ["--data", str(text_dir)]
    args = [*command, "--model", str(tiny_model_dir), *data, "--device", "cpu", "--out", str(tmp_path / "run")]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    rows = _rows(tmp_path / "run")
    key = lambda r: tuple(r[f] for f in key_fields)  # noqa: E731
    assert len({key(r) for r in rows}) == len(rows)  # the fields identify a point
    deleted = rows[-1]
    failed = next(r for r in rows if sum(a != b for a, b in zip(key(r), key(deleted))) >= 2)
    kept = [r for r in rows if r is not deleted and r is not failed]
    # for every key field, a kept point differs from the deleted one in that field alone: a resume key that left the
    # field out would take the deleted point for done
    for i in range(len(key_fields)):
        assert any(
            [a != b for a, b in zip(key(r), key(deleted))] == [j == i for j in range(len(key_fields))] for r in kept
        ), key_fields[i]
    marked = {**failed, "status": "oom", "value": None}
    (tmp_path / "run" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*kept, marked]))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    new = _rows(tmp_path / "run")[len(kept) + 1 :]
    assert sorted(key(r) for r in new) == sorted([key(deleted), key(failed)])
    assert all(r["status"] == "ok" for r in new)
    table = (tmp_path / "run" / "table.md").read_text()
    assert "oom" not in table.lower()  # the report keeps the last row of a point: the re-measured one


def test_a_small_read_back_mismatch_is_an_error_and_restores_exactly(llama):
    """A rotary module off by 1e-3 (well above float32 noise, far below a 4x error) fails verification, and the
    model is left exactly as it was: buffers, attention scaling, rope_type, forward hooks, logits."""
    rotary = llama.model.rotary_emb
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        before = llama(input_ids=ids).logits
    saved = (
        rotary.inv_freq.clone(),
        rotary.attention_scaling,
        getattr(rotary, "rope_type", None),
        len(rotary._forward_pre_hooks),
    )
    real_forward = type(rotary).forward

    def slightly_off(self, x, position_ids):
        cos, sin = real_forward(self, x, position_ids)
        return cos * (1 + 1e-3), sin * (1 + 1e-3)  # the attention factor read back is 0.1% off

    rotary.forward = slightly_off.__get__(rotary)
    try:
        with pytest.raises(CtxevalError, match="read back"):
            apply_method(llama, "yarn", factor=4)
    finally:
        del rotary.forward
    assert torch.equal(rotary.inv_freq, saved[0]) and rotary.attention_scaling == saved[1]
    assert getattr(rotary, "rope_type", None) == saved[2] and len(rotary._forward_pre_hooks) == saved[3]
    with torch.inference_mode():
        assert torch.equal(llama(input_ids=ids).logits, before)


def test_an_overridden_original_length_changes_every_method_that_reads_it():
    """original_max_position_embeddings as a ctxeval parameter: each method that takes it must use it (a method
    ignoring it would give the model's own L's frequencies)."""
    geom = Geometry(64, 1e4, 4096)
    for method, params, length in (
        ("yarn", {"factor": 4}, None),
        ("ntk-by-parts", {"factor": 4}, None),
        ("dynamic-ntk", {"factor": 2}, 12288),
        ("dynamic-yarn", {}, 12288),
        ("llama3", {"factor": 8}, None),
        ("longrope", {"short_factor": [1.0] * 32, "long_factor": [2.0] * 32}, 3000),
    ):
        own = compute(method, geom, params, length)
        other = compute(method, geom, {**params, "original_max_position_embeddings": 2048}, length)
        same_l = compute(method, Geometry(64, 1e4, 2048), params, length)
        assert not (own.inv_freq == other.inv_freq).all() or own.attention_factor != other.attention_factor, method
        assert (other.inv_freq == same_l.inv_freq).all() and other.attention_factor == same_l.attention_factor, method


def test_deepseek_mscale_ratio_against_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for mscale, mscale_all_dim in ((1.0, 0.707), (0.707, 1.0), (2.0, 0.5)):
        rp = {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 16.0,
            "original_max_position_embeddings": 4096,
            "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
        }
        cfg = LlamaConfig(
            hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=65536, rope_parameters=rp
        )
        _, want = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        got = compute(
            "yarn", Geometry(64, 1e4, 4096), {"factor": 16, "mscale": mscale, "mscale_all_dim": mscale_all_dim}
        ).attention_factor
        ratio = (0.1 * mscale * math.log(16) + 1) / (0.1 * mscale_all_dim * math.log(16) + 1)  # DeepSeek-V2's
        assert got == pytest.approx(want, rel=1e-12) and got == pytest.approx(ratio, rel=1e-12)
        assert got != pytest.approx(1.0)


def test_plan_groups_follow_the_ramp():
    from ctxeval.rope.methods import plan

    geom = Geometry(128, 1e4, 4096)
    _, rows = plan("yarn", geom, {"factor": 8})
    groups = [r.group for r in rows]
    # fastest pairs (many rotations over L) kept, slowest interpolated, a contiguous blend between, in that order
    assert groups[0] == "extrapolated" and groups[-1] == "interpolated" and "blended" in groups
    assert groups == sorted(groups, key=["extrapolated", "blended", "interpolated"].index)
    for r in rows:
        if r.ratio > 32:
            assert r.group == "extrapolated"
        if r.ratio < 1:
            assert r.group == "interpolated" and r.scale == pytest.approx(8.0)
    _, pi_rows = plan("pi", geom, {"factor": 8})
    assert {r.group for r in pi_rows} == {"interpolated"}
    _, none_rows = plan("none", geom)
    assert {r.group for r in none_rows} == {"extrapolated"}


def test_needle_generation_under_a_dynamic_method_equals_a_cache_free_recomputation():
    """Greedy needle generation under dynamic NTK past the trained length: with the KV cache, the prompt's keys and
    each new query must share one RoPE, the one of the evaluated length. The reference recomputes every step from
    scratch, without a cache, with the RoPE frozen at that length."""
    from helpers import build_tokenizer, tiny_llama

    from ctxeval.data.presets import load_task
    from ctxeval.evals import haystack as H
    from ctxeval.evals import needle as N

    tok = build_tokenizer()
    model = tiny_llama(vocab_size=len(tok))  # trained length 64: 320 tokens is 5x
    hay, _ = H.haystack_tokens(tok, "filler", 4000)
    builder = H.PromptBuilder(
        tok, H.NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle")), hay, chat_template=False
    )
    cfg = N.NeedleConfig((320,), (50.0,), max_new_tokens=10)
    runner_ = N.NeedleRunner(model, tok, "cpu", builder, cfg, "tiny", "needle")
    item = runner_.item(320, 0, 0)
    rotary = model.model.rotary_emb
    used = []  # the frequencies every forward's RoPE was computed with (prefill and each decode step)
    with apply_method(model, "dynamic-ntk", factor=2) as handle:
        probe = rotary.register_forward_hook(lambda module, args, out: used.append(module.inv_freq.clone()))
        generated = runner_._generate(item, handle)["response"]
        probe.remove()
        frozen = torch.from_numpy(handle.expected(item.length).inv_freq).float()
        assert len(used) > 1 and all(torch.allclose(u, frozen, rtol=1e-6) for u in used)
        handle.freeze_length(item.length)
        ids = torch.tensor([item.prompt.ids])
        with torch.inference_mode():
            for _ in range(10):
                nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
                if int(nxt) == tok.eos_token_id:
                    break
                ids = torch.cat([ids, nxt], 1)
        handle.freeze_length(None)
    reference = tok.decode(ids[0, len(item.prompt.ids) :].tolist(), skip_special_tokens=True)
    assert generated == reference and len(reference) > 0


def test_window_aggregates_from_their_definition(tmp_path):
    """Per point: truncate is one window whose mean is nll_sum / n_tokens; sliding scores each token once, in the
    first window that covers it, and window_nll_sum adds each window's own mean (the YaRN paper's GovReport average
    of per-window means). The reference is the definition, with a full forward per window."""
    import numpy as np
    import torch.nn.functional as F
    from helpers import tiny_llama

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals import perplexity as P
    from ctxeval.specs import expand_specs

    model = tiny_llama()  # trained length 64
    ids = np.random.default_rng(7).integers(2, 128, 3 * 64 + 21)
    doc = TokenDoc("d", ids)
    none = expand_specs(["none"])[0]

    def token_losses(seq):
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0, :-1].double()
        return F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="none")

    truncate = P.PplRunner(model, "cpu", P.PplConfig((32, 64)), 1, "tiny")
    for row in truncate._truncate_one_forward(none, doc, [32, 64]):
        losses = token_losses([1] + ids[: row["length"] - 1].tolist())
        assert row["n_windows"] == 1 and row["n_tokens"] == row["length"] - 1
        assert row["nll_sum"] == pytest.approx(float(losses.sum()), rel=1e-6)
        assert row["window_nll_sum"] == pytest.approx(float(losses.mean()), rel=1e-6)  # a mean, not the sum

    length, stride = 64, 24
    sliding = P.PplRunner(model, "cpu", P.PplConfig((length,), "sliding", stride=stride), 1, "tiny")
    row = sliding._sliding_at(none, doc, length)
    window_means, total, count, covered = [], 0.0, 0, 0  # covered: doc tokens scored so far (BOS predicts token 0)
    start = 0
    while covered < len(ids):
        window = ids[start : start + length - 1]  # BOS + length - 1 document tokens
        losses = token_losses([1] + window.tolist())  # losses[j] is doc token start + j
        fresh = losses[covered - start :]
        window_means.append(float(fresh.mean()))
        total, count, covered = total + float(fresh.sum()), count + fresh.numel(), start + len(window)
        start += stride
    assert row["n_tokens"] == count == len(ids) and row["n_windows"] == len(window_means)
    assert row["nll_sum"] == pytest.approx(total, rel=1e-6)
    assert row["window_nll_sum"] == pytest.approx(sum(window_means), rel=1e-6)


def test_text_answers_match_regardless_of_case():
    """Needle answers and terms match case-insensitively (a model that writes 'Eat A Sandwich' found the needle),
    as RULER's string_match_all does; integers stay exact."""
    from ctxeval.data.presets import load_task
    from ctxeval.evals import haystack as H

    def preset(name):
        return H.NeedlePreset.from_dict(name, load_task(f"needle-{name}", "needle"))

    words = H.Sample(("x",), 1, "q", "a", ("Blue-Whale", "harbor"))
    assert H.score_response(preset("magic-number"), words, " the BLUE-whale by the Harbor")
    assert not H.score_response(preset("magic-number"), words, " the blue whale by the harbor")
    gk = preset("gkamradt")
    assert H.score_response(gk, H.Sample(("x",), 1, "q", "a", ("eat",)), " " + " ".join(gk.match_terms).upper())
