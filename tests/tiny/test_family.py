"""tiny/family.py: the position-encoding family. Each member is the transformers class it claims, holds as many weights
as tiny within 2%, encodes position as it claims (a shift of every position changes nothing for a relative encoding
or none, and changes the output for absolute ones; a one-layer NoPE model cannot tell the order of earlier tokens),
and two members of one block differ in nothing but their position encoding. Shipped members: their files, their
tokenizer (tiny's, byte for byte) and their training log (tiny's recipe)."""

import dataclasses
import json

import pytest
import torch

from ctxeval.rope.geometry import position_limit, rope_info_from_config
from ctxeval.tiny import MODEL_DIR
from ctxeval.tiny.family import GPT_MLP_WIDTH, MEMBERS, build_config, build_model, member_dir
from ctxeval.tiny.train import TinyConfig

TINY_PARAMETERS = 1_377_408  # the shipped tiny's (its training_log.json)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


def _model(name, tokenizer, **sizes):
    torch.manual_seed(0)
    return build_model(name, TinyConfig(member=name, **sizes), len(tokenizer), tokenizer).eval()


def test_every_member_is_its_class_and_as_large_as_tiny(tokenizer):
    assert list(MEMBERS) == ["tiny", "tiny-nope", "tiny-rope-gpt", "tiny-alibi", "tiny-learned", "tiny-sinusoidal"]
    for name, member in MEMBERS.items():
        model = _model(name, tokenizer)
        assert type(model).__name__ == member.architecture
        parameters = sum(p.numel() for p in model.parameters())
        assert abs(parameters / TINY_PARAMETERS - 1) < 0.02, (name, parameters)
        assert model.config.max_position_embeddings == 128


def test_what_ctxeval_reads_of_each_members_position_encoding(tokenizer):
    infos = {n: rope_info_from_config(build_config(n, TinyConfig(), 4096, tokenizer)) for n in MEMBERS}
    assert {n for n, i in infos.items() if i.geometry is not None} == {"tiny", "tiny-rope-gpt"}
    assert infos["tiny"].geometry == infos["tiny-rope-gpt"].geometry  # 32 rotary dims, base 1e5, L = 128
    assert "RoPE off in every layer" in infos["tiny-nope"].reason
    assert "ALiBi" in infos["tiny-alibi"].reason and "sinusoidal" in infos["tiny-sinusoidal"].reason
    assert "learned" in infos["tiny-learned"].reason
    limits = {n: position_limit(build_config(n, TinyConfig(), 4096, tokenizer)) for n in MEMBERS}
    assert limits == {n: (128 if n == "tiny-learned" else None) for n in MEMBERS}


def test_relative_encodings_ignore_a_shift_of_every_position_and_absolute_ones_do_not(tokenizer):
    ids = torch.arange(10, 50)[None]
    moved = torch.arange(50, 90)[None]  # every position + 50, still inside the learned table
    changes = {}
    with torch.inference_mode():
        for name in MEMBERS:
            model = _model(name, tokenizer)
            changes[name] = float(
                (model(input_ids=ids).logits - model(input_ids=ids, position_ids=moved).logits).abs().max()
            )
    assert {n for n, c in changes.items() if c > 1e-3} == {"tiny-learned", "tiny-sinusoidal"}, changes


def test_a_one_layer_nope_model_cannot_tell_the_order_of_earlier_tokens(tokenizer):
    ids = torch.arange(10, 40)[None]
    shuffled = torch.cat(
        [ids[:, :-1][:, torch.randperm(29, generator=torch.Generator().manual_seed(0))], ids[:, -1:]], 1
    )
    last = {}
    with torch.inference_mode():
        for name in ("tiny", "tiny-nope"):
            model = _model(name, tokenizer, num_layers=1)
            last[name] = float(
                (model(input_ids=ids).logits[0, -1] - model(input_ids=shuffled).logits[0, -1]).abs().max()
            )
    assert last["tiny-nope"] < 1e-5 and last["tiny"] > 1e-3, last


def test_members_of_one_block_differ_in_their_position_encoding_alone(tokenizer):
    def shapes(name):
        return {k: tuple(v.shape) for k, v in _model(name, tokenizer).state_dict().items()}

    assert shapes("tiny") == shapes("tiny-nope")
    assert shapes("tiny-rope-gpt") == shapes("tiny-alibi")
    for name in ("tiny-learned", "tiny-sinusoidal", "tiny-rope-gpt"):
        widths = {s[0] for k, s in shapes(name).items() if len(s) == 2 and 128 in s and s != (4096, 128)} | {
            s[1] for k, s in shapes(name).items() if len(s) == 2 and s[0] == 128
        }
        assert GPT_MLP_WIDTH in widths, name
    configs = {n: build_config(n, TinyConfig(), 4096, tokenizer) for n in ("tiny-rope-gpt", "tiny-alibi")}
    rope, alibi = (configs[n].to_dict() for n in ("tiny-rope-gpt", "tiny-alibi"))
    assert {k for k in rope if rope[k] != alibi.get(k)} == {"alibi"}
    nope = build_config("tiny-nope", TinyConfig(), 4096, tokenizer)
    assert list(nope.no_rope_layers) == [0, 0, 0, 0] and not nope.use_sliding_window


SHIPPED = [n for n in MEMBERS if n != "tiny" and (member_dir(n) / "model.safetensors").is_file()]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_member_is_trained_as_tiny_is(name):
    from transformers import AutoConfig

    folder = member_dir(name)
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "MODEL_CARD.md"):
        assert (folder / file).is_file(), file
    assert (folder / "model.safetensors").stat().st_size <= 10 * 2**20
    assert (folder / "tokenizer.json").read_bytes() == (MODEL_DIR / "tokenizer.json").read_bytes()
    assert AutoConfig.from_pretrained(folder).architectures == [MEMBERS[name].architecture]
    log = json.loads((folder / "training_log.json").read_text())
    tiny = json.loads((MODEL_DIR / "training_log.json").read_text())
    assert log["config"].pop("member") == name
    tiny["config"].pop("member", None)
    # fields TinyConfig gained after tiny was trained hold their defaults (tiny's recipe, unchanged)
    defaults = {f.name: f.default for f in dataclasses.fields(TinyConfig)}
    for key in set(log["config"]) - set(tiny["config"]):
        assert log["config"].pop(key) == defaults[key], key
    assert log["config"] == tiny["config"] and log["steps"] == tiny["steps"] == 4000 and log["torch_threads"] == 1


def test_the_members_the_committed_results_use_ship_and_tiny_family_names_them():
    from ctxeval.models.load import TINY_FAMILY, expand_model_names, shipped_family

    assert {"tiny-nope", "tiny-alibi", "tiny-learned"} <= set(SHIPPED)
    assert list(TINY_FAMILY) == [n for n in MEMBERS if n != "tiny"] and shipped_family() == SHIPPED
    assert expand_model_names("tiny-family") == ["tiny", *SHIPPED]
