"""models.protocol.LanguageModel: what the evaluations use of a model is there on the hf model (LoadedModel) and
declared by the vLLM one (VllmModel, which needs vLLM to be made)."""

import ast
import inspect
import textwrap

from ctxeval.models.protocol import LanguageModel

MEMBERS = ("name", "tokenizer", "device", "dtype", "attn_implementation", "rope", "backend", "model")


def test_the_loaded_hf_model_satisfies_the_protocol():
    from ctxeval.models.load import LoadedModel, load_model

    lm = load_model("tiny", dtype="float32", device="cpu")
    assert isinstance(lm, LoadedModel) and isinstance(lm, LanguageModel)
    assert lm.backend == "hf" and lm.model is not None and lm.rope.geometry is not None
    assert lm.trained_length == lm.rope.geometry.original_length
    assert lm.record()["name"] == "tiny" and "backend" not in lm.record()  # run.json's model entry as before


def test_the_protocol_declares_what_the_evaluations_read():
    declared = set(LanguageModel.__annotations__) | {
        name for name, value in vars(LanguageModel).items() if isinstance(value, property) or inspect.isfunction(value)
    }
    assert set(MEMBERS) | {"trained_length", "record"} <= declared


def test_the_vllm_model_sets_every_member_of_the_protocol():
    from ctxeval.models.vllm_engine import VllmModel

    init = ast.parse(textwrap.dedent(inspect.getsource(VllmModel.__init__)))
    assigned = {
        node.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and getattr(node.value, "id", "") == "self"
    }
    on_class = {name for name in MEMBERS if name in vars(VllmModel)}
    assert set(MEMBERS) <= assigned | on_class
    assert VllmModel.backend == "vllm" and VllmModel.model is None
    assert isinstance(vars(VllmModel)["trained_length"], property) and callable(VllmModel.record)
