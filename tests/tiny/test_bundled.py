"""The bundled tiny model (ctxeval/tiny): loads offline, plain-RoPE Llama at its trained length, a held-out split
that never leaks into training, a deterministic split, a forward pass, and a 3-step smoke run of the train loop."""

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
