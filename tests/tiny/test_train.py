"""tiny/train.py: the retrieval sequences and a smoke run of the train loop."""

import json

import numpy as np
import pytest
import torch

from ctxeval.tiny import corpus as D
from ctxeval.tiny.train import train


def _small_cfg(**kw):
    from ctxeval.tiny.train import TinyConfig

    base = dict(
        length=256,
        vocab_size=700,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        steps=3,
        batch_size=4,
        warmup=1,
        seed=0,
        mix={"lm": 0.25, "needle": 0.25, "recall": 0.25, "repeat": 0.25},
    )
    return TinyConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def small_corpus():
    topics = D.training_topics()
    return {
        "pydoc": [t for _, t in topics[:30]],
        "docstrings": [t for _, t in topics[30:45]],
        "sources": [t for _, t in topics[45:]],
        "retrieval": D.retrieval_lines(200),
    }


def test_retrieval_sequences_match_the_needle_layout(small_corpus):
    from ctxeval.tiny.train import Batches, train_tokenizer

    cfg = _small_cfg(retrieval_kinds={"ruler": [1.0, "text"]})
    texts = [t for part in small_corpus.values() for t in part]
    tok = train_tokenizer(texts, cfg.vocab_size)
    batches = Batches(tok, cfg, small_corpus)
    for _ in range(5):
        ids, weights = batches.retrieval()
        assert ids.shape == weights.shape == (cfg.length,)
        assert ids[0] == tok.bos_token_id
        answer = ids[weights == cfg.answer_weight]
        assert len(answer) == 8  # " " + 7 digits
        assert tok.decode(answer.tolist()).strip().isdigit()
        text = tok.decode(ids.tolist())
        assert "Some special magic numbers are hidden" in text and "mentioned in the provided text is" in text
        assert ids.tolist().count(tok.bos_token_id) == 1
    ids, weights, kinds = batches.next()
    assert ids.shape == (cfg.batch_size, cfg.length) and weights.shape == ids.shape and len(kinds) == cfg.batch_size
    for make in (batches.recall, batches.repeat, batches.lm):
        for _ in range(5):
            ids, weights = make()
            assert ids.shape == weights.shape == (cfg.length,) and ids[0] == tok.bos_token_id


def test_train_smoke_three_steps(tmp_path, small_corpus):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.tiny.train import train

    logs = []
    summary = train(tmp_path / "m", _small_cfg(), corpus=small_corpus, log=logs.append, evaluate=False)
    assert summary["steps"] == 3 and summary["history"][-1]["step"] == 3
    assert np.isfinite(summary["history"][-1]["loss"])
    out = tmp_path / "m"
    assert json.loads((out / "training_log.json").read_text())["config"]["length"] == 256
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.max_position_embeddings == 256 and len(tok) == model.config.vocab_size
    with torch.inference_mode():
        assert torch.isfinite(model(input_ids=torch.tensor([[tok.bos_token_id, 5, 6]])).logits).all()


@pytest.mark.parametrize("member", ["tiny-nope", "tiny-rope-gpt", "tiny-alibi", "tiny-learned", "tiny-sinusoidal"])
def test_each_family_member_trains_and_loads_in_plain_transformers(tmp_path, small_corpus, member):
    from transformers import AutoModelForCausalLM

    from ctxeval.tiny.family import MEMBERS

    summary = train(
        tmp_path / member,
        _small_cfg(member=member, length=128),
        corpus=small_corpus,
        log=lambda _: None,
        evaluate=False,
    )
    assert summary["config"]["member"] == member and np.isfinite(summary["history"][-1]["loss"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / member, dtype=torch.float32)
    assert type(model).__name__ == MEMBERS[member].architecture
    card = (tmp_path / member / "MODEL_CARD.md").read_text()
    assert f"python -m ctxeval.tiny train --member {member}" in card and f"{summary['parameters']:,}" in card


def test_stop_after_keeps_the_full_schedule_and_saves_nothing(tmp_path, small_corpus):
    cfg = _small_cfg(steps=60, warmup=10)
    full = train(tmp_path / "full", cfg, corpus=small_corpus, log=lambda _: None, evaluate=False)
    first = train(tmp_path / "first", cfg, corpus=small_corpus, log=lambda _: None, evaluate=False, stop_after=50)
    assert first["steps_run"] == 50 and first["steps"] == 60 and not (tmp_path / "first").exists()
    same = ("step", "loss", "loss_ema", "lr")  # the parts are NaN in a batch without that kind of row
    assert [{k: r[k] for k in same} for r in first["history"]] == [
        {k: r[k] for k in same} for r in full["history"] if r["step"] <= 50
    ]


def test_reproduce_says_whether_retraining_gives_the_logged_losses(tmp_path, small_corpus, monkeypatch):
    """`python -m ctxeval.tiny reproduce`: the same losses from the logged config pass; one logged loss off by its
    last digit fails, and the failing step is named."""
    from ctxeval.tiny import reproduce as R

    cfg = _small_cfg(member="tiny-alibi", length=128, steps=60, warmup=10)
    train(tmp_path / "tiny-alibi", cfg, corpus=small_corpus, log=lambda _: None, evaluate=False)
    monkeypatch.setattr(R, "member_dir", lambda name: tmp_path / name)
    said: list[str] = []
    assert R.reproduce("tiny-alibi", 50, log=said.append, corpus=small_corpus) == 0
    assert "step 50: loss" in said[0] and "the first 50 steps reproduce the shipped log" in said[1]
    assert "50 steps in" in said[2] and "s per step" in said[2]

    log_path = tmp_path / "tiny-alibi" / "training_log.json"
    logged = json.loads(log_path.read_text())
    logged["history"][0]["loss"] = round(logged["history"][0]["loss"] + 1e-4, 4)
    log_path.write_text(json.dumps(logged))
    said.clear()
    assert R.reproduce("tiny-alibi", 50, log=said.append, corpus=small_corpus) == 1
    assert "loss" in said[0] and "!=" in said[0] and "DO NOT reproduce" in said[1]
