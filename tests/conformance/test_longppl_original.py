"""LongPPL against PKU-ML/LongPPL itself: the PyPI package `longppl` 0.3.0 (the repository's longppl/longppl.py)
computes each document's key tokens and LongPPL on the bundled tiny model, and the repository's aggregate over
documents (perplexity/perplexity.py, compute_perplexity, not part of the package) is transcribed below; ctxeval's
run, through the CLI, must give the same key tokens, per-document LongPPL and aggregate.

The original reads the evaluated text without special tokens (compute_longppl: add_special_tokens=False) and lets
the evaluator's tokenizer add its own (find_key_token: the tokenizer's defaults, BOS for the tiny model's); ctxeval
follows that by default under --key-tokens. Its length L reads the document's first L tokens, which is the
original's `--max-length L + 1` (perplexity.py keeps x[0:max_length - 1])."""

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.corpora import select_long_documents
from ctxeval.evals import key_tokens as K
from ctxeval.rope.patching import apply_method
from ctxeval.specs import expand_specs

longppl = pytest.importorskip("longppl.longppl", reason="the test extra installs longppl==0.3.0")

runner = CliRunner()
# the tiny model is trained on 128 tokens: a short context of half of it, a stride of a quarter of that; 1000 + BOS
# tokens leave the last short window 9 tokens (the original fails when it holds one: `.squeeze()` makes it 0-d)
LENGTH, CONTEXT, WINDOW = 1000, 64, 16
EVALUATED = ("yarn:factor=8", "none")
EVALUATOR = "none"  # the tiny model itself: 31 key tokens in the three documents at 1000


def original_aggregate(per_doc: list[dict]) -> float:
    """PKU-ML/LongPPL perplexity/perplexity.py, compute_perplexity (commit 1decd2a, lines 62-67): documents without key
    tokens are skipped, then longppl = exp(sum(log(longppl_d) * n_key_d) / sum(n_key_d))."""
    longppls, nums_key_token = [], []
    for output in per_doc:
        if output["longppl"] is not None:
            longppls.append(output["longppl"])
            nums_key_token.append(output["n_key_token"])
    return float(np.exp((np.log(np.stack(longppls)) * np.stack(nums_key_token)).sum() / np.stack(nums_key_token).sum()))


@pytest.fixture(scope="module")
def ctxeval_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("longppl") / "run"
    args = [
        "ppl",
        "--model",
        "tiny",
        "--docs",
        "3",
        "--lengths",
        f"128,{LENGTH}",
        "--key-tokens",
        "tiny",
        "--key-tokens-method",
        EVALUATOR,
        "--out",
        str(out),
    ]
    for spec in EVALUATED:
        args += ["-m", spec]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return out, rows


@pytest.fixture(scope="module")
def original_outputs(ctxeval_run):
    """compute_longppl per (method, document) at LENGTH, on the documents ctxeval's run read."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.tiny import MODEL_DIR

    out, _ = ctxeval_run
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    record = json.loads((out / "run.json").read_text())
    wanted = [d["doc"] for d in record["data"]["documents"]]
    docs = {d.doc_id: d for d in select_long_documents("pydoc", tok, len(wanted), LENGTH)}
    assert list(docs) == wanted
    evaluator = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
    evaluator_spec = expand_specs([EVALUATOR])[0]
    outputs: dict[str, dict[str, dict]] = {}
    with apply_method(evaluator, evaluator_spec.name, **evaluator_spec.params):
        for method in EVALUATED:
            spec = expand_specs([method])[0]
            with apply_method(model, spec.name, **spec.params):
                for doc_id, doc in docs.items():
                    text = tok.decode(doc.ids[:LENGTH].tolist())
                    # the original re-tokenizes the text; on these documents that gives back the same ids
                    assert tok(text, add_special_tokens=False)["input_ids"] == doc.ids[:LENGTH].tolist()
                    with torch.no_grad():
                        outputs.setdefault(spec.label, {})[doc_id] = longppl.compute_longppl(
                            text,
                            model,
                            evaluator,
                            tokenizer=tok,
                            evaluator_tokenizer=tok,
                            trunc_len=CONTEXT,
                            sliding_window=WINDOW,
                        )
    return outputs


def test_key_tokens_and_per_document_longppl_equal_the_original(ctxeval_run, original_outputs):
    _, rows = ctxeval_run
    total_keys = 0
    for label, per_doc in original_outputs.items():
        for doc_id, output in per_doc.items():
            row = next(r for r in rows if r["label"] == label and r["doc"] == doc_id and r["length"] == LENGTH)
            assert row["key_tokens"] == (output["n_key_token"] or 0), (label, doc_id)
            if output["longppl"] is not None:
                got = math.exp(row["key_nll_sum"] / row["key_tokens"])
                assert got == pytest.approx(float(output["longppl"]), rel=1e-4), (label, doc_id)
            # the original's ppl reads the same text: ctxeval's ppl at LENGTH without BOS
            assert row["ppl"] == pytest.approx(float(output["ppl"]), rel=1e-4), (label, doc_id)
            total_keys += row["key_tokens"]
    assert total_keys >= 40  # the comparison has key tokens to compare (31 per method)


def test_key_token_positions_equal_the_originals(ctxeval_run):
    """find_key_token's character intervals, mapped onto the evaluated model's tokens by the package's cal_overlap
    (which returns each key token's loss index, token - 1), equal the positions in ctxeval's key-tokens.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.tiny import MODEL_DIR

    out, _ = ctxeval_run
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    cache = json.loads((out / K.CACHE_FILE).read_text())["documents"]
    docs = {d.doc_id: d for d in select_long_documents("pydoc", tok, len(cache), LENGTH)}
    evaluator = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
    spec = expand_specs([EVALUATOR])[0]
    found = 0
    with apply_method(evaluator, spec.name, **spec.params), torch.no_grad():
        for doc_id, entry in cache.items():
            text = tok.decode(docs[doc_id].ids[:LENGTH].tolist())
            intervals = longppl.find_key_token(text, evaluator, tok, CONTEXT, WINDOW)
            offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            want = [i + 1 for i in longppl.cal_overlap(offsets, intervals.tolist())]
            assert entry["positions"] == want, doc_id
            found += len(want)
    assert found >= 20


def test_aggregate_equals_the_original(ctxeval_run, original_outputs):
    out, _ = ctxeval_run
    lines = (out / "longppl.csv").read_text().splitlines()
    header = lines[0].split(",")
    table = {
        (r[header.index("method")], int(r[header.index("length")])): r for r in (line.split(",") for line in lines[1:])
    }
    per_doc_values = []
    for label, per_doc in original_outputs.items():
        want = original_aggregate(list(per_doc.values()))
        got = float(table[(label, LENGTH)][header.index("longppl")])
        assert got == pytest.approx(want, rel=1e-4), label
        per_doc_values.append([o["longppl"] for o in per_doc.values() if o["longppl"] is not None])
    # the documents' LongPPL differ, so an arithmetic mean of them would not pass the check above
    assert any(len(v) > 1 and max(v) > 1.05 * min(v) for v in per_doc_values)


def test_run_records_what_each_model_read(ctxeval_run):
    out, _ = ctxeval_run
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["bos"] is False  # LongPPL's compute_longppl: no special tokens for the evaluated model
    assert record["key_tokens"]["evaluator_prefix"] == [0]  # the tiny tokenizer's BOS, added by default
    assert record["key_tokens"]["context"] == CONTEXT and record["key_tokens"]["window"] == WINDOW


class FakeTokenizer:
    """Ids = character codes; `prefix` is what it adds before a text by default (BOS for Llama's, nothing for GPT-2's)."""

    def __init__(self, prefix):
        self.prefix = list(prefix)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": (self.prefix if add_special_tokens else []) + [ord(c) for c in text]}


def test_special_prefix_is_what_the_tokenizer_adds_by_default():
    from transformers import AutoTokenizer

    from ctxeval.tiny import MODEL_DIR

    assert K.special_prefix(AutoTokenizer.from_pretrained(MODEL_DIR)) == (0,)  # BOS <s>
    assert K.special_prefix(FakeTokenizer([])) == ()
    assert K.special_prefix(FakeTokenizer([7, 9])) == (7, 9)


def test_evaluator_reads_its_prefix_and_the_same_document_tokens():
    """Key tokens found on prefix + document map to the evaluated sequence: without BOS the evaluator's position e is
    the evaluated e - len(prefix); with BOS, one later. Checked against key_positions on the evaluator's own input."""
    from evals.fake_lm import docs
    from helpers import tiny_llama

    model = tiny_llama(seed=3)
    ids = docs(1, 300, seed=4)[0].ids[:300].tolist()
    loose = dict(context=50, window=7, alpha=0.02, beta=6.0)
    for prefix in ((), (1,), (1, 5)):
        direct = K.key_positions(model, "cpu", list(prefix) + ids, **loose)
        assert len(direct) > 5
        for bos in (False, True):
            settings = K.KeyTokenSettings(
                "m", "none", loose["context"], loose["window"], prefix, bos, loose["alpha"], loose["beta"]
            )
            got = K.evaluator_keys(model, "cpu", ids, settings, chunk_size=64)
            assert got.tolist() == [int(e) - len(prefix) + bos for e in direct]
