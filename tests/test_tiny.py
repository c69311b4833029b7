"""The bundled tiny model (ctxeval/tiny): loads offline, plain-RoPE Llama at its trained length, a held-out split
that never leaks into training, a deterministic split, a forward pass, and a 3-step smoke run of the train loop."""

import json

import numpy as np
import pytest
import torch

from ctxeval.tiny import MODEL_DIR
from ctxeval.tiny import corpus as D

TRAINED_LENGTH = 128


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """Tokenizer + model from MODEL_DIR with the hub switched off."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.skip(f"no bundled model in {MODEL_DIR}; run python -m ctxeval.tiny train")
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        tok = AutoTokenizer.from_pretrained(MODEL_DIR)
        model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    return tok, model


def test_model_dir_files_and_size():
    assert MODEL_DIR.name == "model" and MODEL_DIR.parent.name == "tiny"
    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.skip("no bundled model")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "MODEL_CARD.md"):
        assert (MODEL_DIR / name).is_file(), name
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= 10 * 2**20


def test_config_is_llama_with_default_rope_at_trained_length(bundled):
    from ctxeval.rope.geometry import rope_info_from_config

    _, model = bundled
    cfg = model.config
    assert cfg.model_type == "llama" and type(model).__name__ == "LlamaForCausalLM"
    assert cfg.rope_parameters["rope_type"] == "default"
    assert cfg.max_position_embeddings == TRAINED_LENGTH
    info = rope_info_from_config(cfg)
    assert info.geometry.original_length == TRAINED_LENGTH
    assert info.geometry.rotary_dim == cfg.hidden_size // cfg.num_attention_heads
    assert next(model.parameters()).dtype == torch.float32


def test_tokenizer_bos_and_digits(bundled):
    tok, model = bundled
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.bos_token_id is not None
    assert len(tok) == model.config.vocab_size
    assert not getattr(tok, "chat_template", None)  # ctxeval needle then builds plain prompts
    ids = tok(" 1234567", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["\u0120", "1", "2", "3", "4", "5", "6", "7"]
    assert tok(" 7654321.", add_special_tokens=False)["input_ids"][1:8] == [
        tok.convert_tokens_to_ids(d) for d in "7654321"
    ]
    assert tok("x")["input_ids"][0] == tok.bos_token_id
    text = "def f(x):\n    return x ** 2  # 1234567"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_forward_64_tokens(bundled):
    tok, model = bundled
    text = D.held_out_documents()[0][1]
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"][:63]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, 64, model.config.vocab_size)
    assert torch.isfinite(logits).all()
    # a trained model: held-out next-token loss far below uniform (ln 4096 = 8.3)
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], torch.tensor(ids[1:]))
    assert float(nll) < 5.0


def test_held_out_docs_long_enough(bundled):
    """The truncate protocol needs several held-out documents of at least 16x the trained length."""
    tok, _ = bundled
    lengths = [len(tok(text, add_special_tokens=False)["input_ids"]) for _, text in D.held_out_documents()]
    assert sum(n >= 16 * TRAINED_LENGTH for n in lengths) >= 3


def test_held_out_split_is_deterministic_and_longest_first():
    docs = D.held_out_documents()
    assert docs == D.held_out_documents()
    assert docs[0][0] == "specialnames"  # the longest pydoc topic
    lengths = [len(text) for _, text in docs]
    assert lengths == sorted(lengths, reverse=True)
    assert len(docs) >= 10
    titles = {t for t, _ in docs}
    assert titles <= set(D.HELD_OUT_TITLES)
    assert not titles & {t for t, _ in D.training_topics()}
    assert [t for t, _ in D.training_topics()] == sorted(t for t, _ in D.training_topics())
    assert D.retrieval_lines(5) == D.retrieval_lines(5)


def test_held_out_text_never_in_training_texts():
    texts = [text for part in D.training_corpus().values() for text in part]
    assert len(texts) > 1000
    topics = D.pydoc_topics()
    train_lines = set()
    for text in texts:
        train_lines |= {line.strip() for line in text.splitlines() if len(line.strip()) >= 12}
    joined = "\n".join(texts)
    for title in D.HELD_OUT_TITLES:
        if title not in topics:
            continue
        held = topics[title]
        assert held not in joined, title
        lines = {line.strip() for line in held.splitlines() if len(line.strip()) >= 12}
        assert not lines & train_lines, (title, sorted(lines & train_lines)[:3])
    # whitespace-insensitive: an 80-character slice of every long paragraph of the evaluation documents is absent
    flat = " ".join(joined.split())
    for title, held in D.held_out_documents()[:3]:
        for para in held.split("\n\n"):
            para = " ".join(para.split())
            if len(para) >= 300:
                assert para[100:180] not in flat, (title, para[100:180])


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
