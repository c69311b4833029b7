"""LongPPL's key tokens (evals/key_tokens.py): the rule, the settings, the cache, the evaluator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from evals.fake_lm import docs
from helpers import tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.evals import key_tokens as K
from ctxeval.report import tables
from ctxeval.specs import expand_specs

runner = CliRunner()


def hf_nll(model, seq):
    """Per-token loss from the model's own logits: hf_nll[t - 1] is the loss of seq[t] given seq[:t]."""
    ids = torch.tensor([seq])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return F.cross_entropy(logits, ids[0, 1:], reduction="none").double().numpy()


def reference_key_tokens(model, seq, trunc_len, internal, alpha=2.0, beta=2.0):
    """PKU-ML/LongPPL longppl.py find_key_token, transcribed (full logits, one short forward per window; its
    constants 2 and 2 as alpha and beta)."""
    input_ids = torch.tensor([seq])
    with torch.no_grad():
        output_full = model(input_ids).logits
    loss_f = torch.nn.CrossEntropyLoss(reduction="none")
    max_len = input_ids.shape[1]
    key_tokens = []
    with torch.no_grad():
        for start_token in range(0, max_len - trunc_len, internal):
            if start_token + trunc_len + internal > max_len:
                internal = max_len - start_token - trunc_len
            input_ids_short = input_ids[:, start_token : start_token + trunc_len + internal]
            output_short = model(input_ids_short).logits
            loss_full = loss_f(
                output_full[0, start_token + trunc_len - 1 : start_token + trunc_len + internal - 1],
                input_ids[0, start_token + trunc_len : start_token + trunc_len + internal],
            )
            loss_short = loss_f(
                output_short[0, trunc_len - 1 : trunc_len + internal - 1],
                input_ids_short[0, trunc_len : trunc_len + internal],
            )
            is_key = torch.logical_and((loss_short - loss_full) > alpha, loss_full < beta)
            key_tokens += [start_token + trunc_len + i for i, k in enumerate(is_key) if k]
    return key_tokens


def test_key_positions_equal_longppl_find_key_token():
    model = tiny_llama(seed=3)
    seq = [1] + docs(1, 300, seed=4)[0].ids.tolist()
    # a random model gains little from long context: loose thresholds give key tokens to compare, LongPPL's own
    # (2, 2) give none, and both must agree with the transcription
    for context, window, alpha, beta in (
        (64, 16, 0.02, 6.0),
        (50, 7, 0.02, 6.0),
        (100, 25, 0.01, 5.0),
        (64, 16, 2.0, 2.0),
    ):
        want = reference_key_tokens(model, seq, context, window, alpha, beta)
        got = K.key_positions(model, "cpu", seq, context, window, alpha, beta, chunk_size=33)
        assert got.tolist() == want
        assert all(t >= context for t in got)
        assert len(want) > 5 or alpha == 2.0


def test_thresholds_decide_key_tokens(monkeypatch):
    """alpha and beta bite: with every short loss 3 above the long one, the tokens whose long loss is < beta = 2 are
    keys; with 1.5 above (< alpha = 2), none is."""
    long = torch.tensor([0.5, 1.0, 1.9, 2.1, 5.0, 0.1], dtype=torch.float64)  # long[t - 1]: token t
    for gap, want in ((3.0, [1, 2, 3, 6]), (1.5, [])):

        def fake(model, ids, chunk, gap=gap):
            first, n = int(ids[0, 0]), ids.shape[1] - 1  # the sequence is 0..6, so ids[0, 0] is the window start
            return long.clone() if ids.shape[1] == 7 else long[first : first + n].clone() + gap

        monkeypatch.setattr(K, "token_nll", fake)
        assert K.key_positions(None, "cpu", list(range(7)), context=1, window=5).tolist() == want


def test_longppl_end_to_end_same_key_tokens_for_every_method(tmp_path, monkeypatch):
    """The bundled tiny model (trained on 128 tokens) as its own evaluator on two CPython docs at 1k: as LongPPL, the
    evaluated model reads the document without BOS and the evaluator BOS + the same tokens (its tokenizer's
    default); the key tokens equal the transcription's on the evaluator's input, one position earlier in the evaluated
    sequence; every method is scored on them; LongPPL is exp(summed key NLL / key tokens) over the documents (the
    original's aggregate; tests/conformance/test_longppl_original.py runs the original itself), computed here from the model's
    own logits; a resume reuses key-tokens.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.data.corpora import select_long_documents
    from ctxeval.rope.patching import apply_method
    from ctxeval.tiny import MODEL_DIR

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    out = tmp_path / "run"
    args = [
        "ppl",
        "--model",
        "tiny",
        "--docs",
        "2",
        "--lengths",
        "256,512,1k",
        "-m",
        "none",
        "-m",
        "pi:factor=4",
        "--key-tokens",
        "tiny",
        "--key-tokens-method",
        "none",
        "--out",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    cache = json.loads((out / K.CACHE_FILE).read_text())
    assert run["key_tokens"]["context"] == 64 and run["key_tokens"]["window"] == 16  # half of 128, a quarter of it
    assert run["spec"]["key_tokens"]["evaluator"] == "tiny" and run["spec"]["bos"] is False
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
    documents = select_long_documents("pydoc", tok, 2, 1024)
    sequences = {d.doc_id: d.ids[:1024].tolist() for d in documents}
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    for doc, seq in sequences.items():
        want_keys = [t - 1 for t in reference_key_tokens(model, [tok.bos_token_id] + seq, 64, 16)]
        assert cache["documents"][doc]["positions"] == want_keys
        for length in (256, 512, 1024):
            mine = [r for r in rows if r["doc"] == doc and r["length"] == length]
            assert len(mine) == 2 and len({r["key_tokens"] for r in mine}) == 1  # every method: the same tokens
            assert mine[0]["key_tokens"] == sum(1 for t in want_keys if t < length)
    assert sum(len(d["positions"]) for d in cache["documents"].values()) > 5
    lp = tables.longppl_long(rows).set_index(["label", "length"])
    for label, spec in (("none", None), ("pi(factor=4)", expand_specs(["pi:factor=4"])[0])):
        key_nll = []
        for doc, seq in sequences.items():
            if spec is None:
                nll = hf_nll(model, seq)
            else:
                with apply_method(model, spec.name, **spec.params):
                    nll = hf_nll(model, seq)
            key_nll += [nll[t - 1] for t in cache["documents"][doc]["positions"]]
        assert lp.loc[(label, 1024), "longppl"] == pytest.approx(math.exp(np.mean(key_nll)), rel=1e-4)
        assert lp.loc[(label, 1024), "key_tokens"] == len(key_nll)
    assert (out / "longppl.csv").exists() and "LongPPL" in (out / "table.md").read_text()
    assert (out / "positions.csv").exists() and (out / "positions.png").stat().st_size > 0
    # resume: key-tokens.json is reused (finding them again would fail), nothing is re-measured
    monkeypatch.setattr(K, "key_positions", lambda *a, **k: (_ for _ in ()).throw(AssertionError("found again")))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len((out / "rows.jsonl").read_text().splitlines()) == len(rows)


class _Tokenizer:
    """A tokenizer's surface as key_tokens reads it: vocabulary, BOS id, ids with and without default specials."""

    def __init__(self, vocab_size=50, bos=1, prefix=(1,)):
        self.vocab, self.bos_token_id, self.prefix = {f"t{i}": i for i in range(vocab_size)}, bos, list(prefix)

    def get_vocab(self):
        return dict(self.vocab)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": (self.prefix if add_special_tokens else []) + [ord(c) % 40 + 5 for c in text]}


def test_a_tokenizer_is_the_same_as_itself_and_as_an_equal_copy():
    from ctxeval.evals.key_tokens import same_tokenizer

    tok = _Tokenizer()
    assert same_tokenizer(tok, tok) is True
    assert same_tokenizer(_Tokenizer(), _Tokenizer()) is True
    a, b = _Tokenizer(), _Tokenizer()
    del a.bos_token_id, b.bos_token_id  # a tokenizer without the attribute at all
    assert same_tokenizer(a, b) is True and same_tokenizer(a, _Tokenizer(bos=None)) is True


@pytest.mark.parametrize(
    "other",
    [
        _Tokenizer(vocab_size=51),
        _Tokenizer(bos=2),
        _Tokenizer(bos=None),
        _Tokenizer(prefix=()),
        _Tokenizer(prefix=(1, 2)),
    ],
    ids=["vocabulary", "bos", "no-bos", "no-prefix", "longer-prefix"],
)
def test_tokenizers_differing_in_one_respect_are_not_the_same(other):
    from ctxeval.evals.key_tokens import same_tokenizer

    assert same_tokenizer(_Tokenizer(), other) is False
    assert same_tokenizer(other, _Tokenizer()) is False


@pytest.mark.parametrize(
    "bos, prefix, candidates", [(False, (), 12), (False, (7, 8), 14), (True, (), 11), (True, (7, 8), 13)]
)
def test_summary_counts_the_evaluators_candidate_tokens(bos, prefix, candidates):
    """The evaluator reads its prefix + the document without the evaluated model's BOS: a 20-token sequence with
    context 8 leaves 20 - bos + len(prefix) - 8 tokens that can be key tokens."""
    from ctxeval.evals.key_tokens import CACHE_FILE, KeyTokenSettings, summary

    settings = KeyTokenSettings("ev", "none", 8, 2, prefix, bos)
    found = {"a": np.array([9, 12, 15]), "b": np.zeros(0, dtype=np.int64)}
    out = summary(settings, found, {"a": 20, "b": 8 - len(prefix) + bos})
    assert out["file"] == CACHE_FILE and out["evaluator"] == "ev" and out["context"] == 8
    assert out["documents"] == [
        {"doc": "a", "key_tokens": 3, "candidates": candidates, "fraction": round(3 / candidates, 6)},
        {"doc": "b", "key_tokens": 0, "candidates": 0, "fraction": None},
    ]


def _settings(**kw):
    from ctxeval.evals.key_tokens import KeyTokenSettings

    return KeyTokenSettings(
        **{
            "evaluator": "ev",
            "method": "yarn(factor=2)",
            "context": 8,
            "window": 2,
            "evaluator_prefix": (1,),
            "bos": False,
            **kw,
        }
    )


def _cache(path, settings, documents):
    import json

    path.write_text(json.dumps({"settings": settings.record(), "documents": documents}) + "\n")
    return path


def test_a_cache_of_these_settings_and_documents_is_read_back(tmp_path):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(
        tmp_path / "k.json",
        _settings(),
        {
            "a": {"sequence_tokens": 20, "positions": [1, 5, 19]},
            "b": {"sequence_tokens": 12, "positions": []},
            "c": {"sequence_tokens": 30, "positions": [3.0, 4]},
        },
    )
    got = read_cache(path, _settings(), {"a": 20, "b": 12, "c": 30})
    assert {k: (v.tolist(), v.dtype) for k, v in got.items()} == {
        "a": ([1, 5, 19], np.int64),
        "b": ([], np.int64),
        "c": ([3, 4], np.int64),
    }
    assert list(read_cache(path, _settings(), {"b": 12})) == ["b"]  # documents the run does not read are left


@pytest.mark.parametrize(
    "entry",
    [
        {"sequence_tokens": 21, "positions": [1, 5]},  # another length
        {"positions": [1, 5]},
        {"sequence_tokens": 20, "positions": "1,5"},
        {"sequence_tokens": 20},
        {"sequence_tokens": 20, "positions": [0, 5]},  # position 0 has no loss
        {"sequence_tokens": 20, "positions": [5, 20]},  # past the sequence
        {"sequence_tokens": 20, "positions": [5, 5]},  # not increasing
        {"sequence_tokens": 20, "positions": [6, 5]},
        {"sequence_tokens": 20, "positions": [1.5]},
        {"sequence_tokens": 20, "positions": ["3"]},
        {"sequence_tokens": 20, "positions": [True]},
        [1, 5],
    ],
    ids=lambda e: str(e),
)
def test_a_cache_entry_that_does_not_fit_the_document_is_stale(tmp_path, entry):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(tmp_path / "k.json", _settings(), {"a": entry, "b": {"sequence_tokens": 12, "positions": [2]}})
    assert read_cache(path, _settings(), {"a": 20, "b": 12}) is None
    assert read_cache(path, _settings(), {"b": 12})["b"].tolist() == [2]  # the other document alone is fine


@pytest.mark.parametrize(
    "change",
    [
        dict(evaluator="other"),
        dict(context=9),
        dict(window=3),
        dict(bos=True),
        dict(evaluator_prefix=()),
        dict(alpha=2.5),
        dict(beta=1.0),
    ],
)
def test_a_cache_of_other_settings_is_stale(tmp_path, change):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(tmp_path / "k.json", _settings(**change), {"a": {"sequence_tokens": 20, "positions": [3]}})
    assert read_cache(path, _settings(), {"a": 20}) is None
    assert read_cache(path, _settings(**change), {"a": 20})["a"].tolist() == [3]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"documents": {}}', "null"])
def test_a_cache_file_that_is_not_a_key_token_file_is_stale(tmp_path, text):
    import json

    from ctxeval.evals.key_tokens import read_cache

    path = tmp_path / "k.json"
    path.write_text(text)
    assert read_cache(path, _settings(), {"a": 20}) is None
    assert read_cache(tmp_path / "missing.json", _settings(), {"a": 20}) is None
    path.write_text(json.dumps({"settings": _settings().record(), "documents": [1]}))
    assert read_cache(path, _settings(), {"a": 20}) is None


def test_default_context_is_the_papers_4096_only_past_it():
    from ctxeval.evals.key_tokens import default_context, default_window

    assert default_context(2048, 8192) == 4096 and default_context(100, 4097) == 4096
    assert default_context(8192, 4096) == 2048  # a longest length of exactly 4096: half of it
    assert default_context(128, 1024) == 64 and default_context(4, 4) == 2 and default_context(2, 64) == 2
    assert default_window(4096) == 1024 and default_window(64) == 16 and default_window(3) == 1


def test_the_settings_record_is_what_run_json_and_the_cache_hold():
    s = _settings(evaluator_prefix=(1, 5), bos=True, alpha=1.5)
    assert s.record() == {
        "evaluator": "ev",
        "method": "yarn(factor=2)",
        "context": 8,
        "window": 2,
        "evaluator_prefix": [1, 5],
        "bos": True,
        "alpha": 1.5,
        "beta": 2.0,
        "rule": "LongPPL find_key_token: short loss - long loss > alpha and long loss < beta",
    }


def test_the_truncate_sequence_is_bos_and_the_documents_first_tokens():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.key_tokens import document_sequence

    doc = TokenDoc("d", np.arange(100, 130))
    assert document_sequence(doc, 10, 7) == [7] + list(range(100, 109))
    assert document_sequence(doc, 10, 0) == [0] + list(range(100, 109))  # BOS id 0 is a BOS
    assert document_sequence(doc, 10, None) == list(range(100, 110))
    assert document_sequence(doc, 50, None) == list(range(100, 130))  # a shorter document: all of it


class _Store:
    def __init__(self, path):
        self.dir, self.updates = path, []

    def update(self, **fields):
        self.updates.append(fields)


def _find(tmp_path, monkeypatch, bos, spec="none", found=None, load=None, shipped=None):
    """find_key_tokens with the evaluator's forward replaced: it records the document each call is given."""
    import contextlib
    from types import SimpleNamespace

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals import key_tokens as K
    from ctxeval.specs import expand_specs

    seen, events = [], []

    @contextlib.contextmanager
    def applying(lm, method, lengths):
        events.append(("apply", method.label, lengths))
        yield None, {}

    def keys(model, device, document, settings, chunk_size):
        seen.append((model, device, list(document), chunk_size))
        return np.array([2, len(document) - 1], dtype=np.int64)

    monkeypatch.setattr(K, "applying", applying)
    monkeypatch.setattr(K, "evaluator_keys", keys)
    lm = SimpleNamespace(
        model="evaluator-model",
        device="cpu",
        rope=None if shipped is None else SimpleNamespace(shipped={"rope_type": shipped}),
    )

    def load_evaluator():
        events.append("load")
        return lm, lambda: events.append("release")

    docs = [TokenDoc("a", np.arange(100, 140)), TokenDoc("b", np.arange(200, 230))]
    store = _Store(tmp_path)
    settings = _settings(bos=bos is not None, context=4)
    notes = SimpleNamespace(note=lambda text: events.append(("note", text)))
    got = K.find_key_tokens(
        store, settings, load or load_evaluator, expand_specs([spec])[0], docs, 16, bos, chunk_size=8, progress=notes
    )
    return got, seen, events, store, settings


@pytest.mark.parametrize("bos", [None, 9])
def test_the_evaluator_reads_each_document_without_the_evaluated_models_bos(tmp_path, monkeypatch, bos):
    import json

    from ctxeval.evals.key_tokens import CACHE_FILE, read_cache, summary

    got, seen, events, store, settings = _find(tmp_path, monkeypatch, bos)
    n = 15 if bos is not None else 16  # document tokens in a 16-token sequence
    assert seen == [
        ("evaluator-model", "cpu", list(range(100, 100 + n)), 8),
        ("evaluator-model", "cpu", list(range(200, 200 + n)), 8),
    ]
    assert events == [
        "load",
        ("apply", "none", (16,)),
        ("note", "key tokens: ev under none on a"),
        ("note", "key tokens: ev under none on b"),
        "release",
    ]
    assert {k: v.tolist() for k, v in got.items()} == {"a": [2, n - 1], "b": [2, n - 1]}
    assert (tmp_path / CACHE_FILE).read_text().count("\n") == 1
    cache = json.loads((tmp_path / CACHE_FILE).read_text())
    assert cache["documents"] == {d: {"sequence_tokens": 16, "positions": [2, n - 1]} for d in ("a", "b")}
    assert {k: v.tolist() for k, v in read_cache(tmp_path / CACHE_FILE, settings, {"a": 16, "b": 16}).items()} == {
        "a": [2, n - 1],
        "b": [2, n - 1],
    }
    assert store.updates == [{"key_tokens": summary(settings, got, {"a": 16, "b": 16})}]
    # a second run reads the file: no evaluator is loaded
    again, seen2, events2, store2, _ = _find(
        tmp_path, monkeypatch, bos, load=lambda: (_ for _ in ()).throw(AssertionError("loaded again"))
    )
    assert (
        seen2 == []
        and events2 == []
        and {k: v.tolist() for k, v in again.items()} == {k: v.tolist() for k, v in got.items()}
    )
    assert store2.updates == store.updates


@pytest.mark.parametrize("spec, shipped", [("dynamic-ntk", None), ("native", "dynamic"), ("native", "longrope")])
def test_a_length_dependent_evaluator_method_is_refused_and_the_evaluator_released(
    tmp_path, monkeypatch, spec, shipped
):
    from types import SimpleNamespace

    from ctxeval.evals.key_tokens import CACHE_FILE

    events = []
    rope = None if shipped is None else SimpleNamespace(shipped={"rope_type": shipped})
    with pytest.raises(
        CtxevalError,
        match=rf"^--key-tokens-method {spec} depends on the sequence length; key tokens "
        r"are found once per document: give a static method \(e\.g\. "
        r"yarn:factor=2\)$",
    ):
        _find(
            tmp_path,
            monkeypatch,
            None,
            spec=spec,
            load=lambda: (
                events.append("load")
                or (SimpleNamespace(model=None, device="cpu", rope=rope), lambda: events.append("release"))
            ),
        )
    assert events == ["load", "release"] and not (tmp_path / CACHE_FILE).exists()


def test_native_without_a_shipped_dynamic_rope_finds_key_tokens(tmp_path, monkeypatch):
    got, seen, events, _, _ = _find(tmp_path, monkeypatch, None, spec="native", shipped="yarn")
    assert len(seen) == 2 and events[1] == ("apply", "native", (16,))


def test_settings_bos_must_match_the_sequences(tmp_path, monkeypatch):
    from ctxeval.evals.key_tokens import find_key_tokens
    from ctxeval.specs import expand_specs

    with pytest.raises(ValueError, match="KeyTokenSettings.bos is True but the sequences' BOS id is None"):
        find_key_tokens(_Store(tmp_path), _settings(bos=True), None, expand_specs(["none"])[0], [], 16, None, 8)
    with pytest.raises(ValueError, match="KeyTokenSettings.bos is False but the sequences' BOS id is 0"):
        find_key_tokens(_Store(tmp_path), _settings(bos=False), None, expand_specs(["none"])[0], [], 16, 0, 8)


def test_another_rank_reads_the_main_ranks_file_and_refuses_a_missing_one(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from ctxeval.evals import key_tokens as K

    got, *_ = _find(tmp_path, monkeypatch, None)  # the main rank writes key-tokens.json
    barriers = []
    monkeypatch.setattr(K, "current", lambda: SimpleNamespace(is_main=False, barrier=lambda: barriers.append(1)))
    store = _Store(tmp_path)
    settings = _settings(context=4)
    docs = [K.TokenDoc("a", np.arange(100, 140)), K.TokenDoc("b", np.arange(200, 230))]
    spec = __import__("ctxeval.specs", fromlist=["x"]).expand_specs(["none"])[0]
    never = lambda: (_ for _ in ()).throw(AssertionError("another rank loads no evaluator"))  # noqa: E731
    mine = K.find_key_tokens(store, settings, never, spec, docs, 16, None, 8)
    assert {k: v.tolist() for k, v in mine.items()} == {k: v.tolist() for k, v in got.items()}
    assert store.updates == [] and barriers == [1]
    (tmp_path / K.CACHE_FILE).unlink()
    with pytest.raises(CtxevalError, match=r"key-tokens\.json is missing or stale on this rank; run the command again"):
        K.find_key_tokens(store, settings, never, spec, docs, 16, None, 8)


def test_a_non_finite_value_in_a_document_the_run_does_not_read_leaves_the_cache_usable(tmp_path):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(
        tmp_path / "k.json",
        _settings(),
        {"a": {"sequence_tokens": 20, "positions": [3]}, "other": {"sequence_tokens": 20, "positions": [float("nan")]}},
    )
    assert "NaN" in path.read_text()
    assert read_cache(path, _settings(), {"a": 20})["a"].tolist() == [3]
    assert read_cache(path, _settings(), {"a": 20, "other": 20}) is None


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            dict(protocol="sliding"),
            r"^--key-tokens \(LongPPL\) scores one long context per document: use --protocol truncate$",
        ),
        (
            dict(context=0),
            r"^--key-tokens-context must be at least 1 token \(its stride a quarter of it, at least 1\), got 0$",
        ),
        (dict(window=0), r"^--key-tokens-context must be at least 1 token .*, got 8$"),
        (
            dict(context=64),
            r"^--key-tokens-context 64 is not shorter than the longest length 64: no token would have more "
            r"than the short context; use a smaller --key-tokens-context or longer --lengths$",
        ),
        (dict(context=100), r"^--key-tokens-context 100 is not shorter than the longest length 64"),
    ],
)
def test_key_token_settings_are_checked(change, fragment):
    from ctxeval.evals.key_tokens import check_settings

    protocol = change.pop("protocol", "truncate")
    with pytest.raises(CtxevalError, match=fragment):
        check_settings(_settings(**change), (32, 64, 16), protocol)


def test_key_token_settings_at_the_limits_are_accepted():
    from ctxeval.evals.key_tokens import check_settings

    check_settings(_settings(context=63, window=1), (32, 64, 16), "truncate")
    check_settings(_settings(context=1, window=1), (2,), "truncate")


class _Wrapping(_Tokenizer):
    """Adds `before` and `after` around a text's ids by default (BOS, EOS)."""

    def __init__(self, before, after, merge=False):
        super().__init__(prefix=before)
        self.after, self.merge = list(after), merge

    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text, add_special_tokens)["input_ids"]
        if add_special_tokens and self.merge:
            ids = ids[: len(self.prefix)] + [99] + ids[len(self.prefix) + 2 :]  # the first two text tokens as one
        return {"input_ids": ids + (self.after if add_special_tokens else [])}


@pytest.mark.parametrize("before, after", [((), ()), ((), (2,)), ((1,), ()), ((1,), (2,)), ((1, 3), (2, 2))])
def test_special_prefix_is_what_comes_before_the_texts_own_tokens(before, after):
    from ctxeval.evals.key_tokens import special_prefix

    assert special_prefix(_Wrapping(before, after)) == tuple(before)


@pytest.mark.parametrize("before, after", [((), ()), ((1,), (2,))])
def test_a_tokenizer_that_changes_the_texts_tokens_is_refused(before, after):
    from ctxeval.evals.key_tokens import special_prefix

    with pytest.raises(
        CtxevalError,
        match=r"^the tokenizer's default special tokens change the text's own tokens; "
        r"LongPPL's key tokens cannot be placed: use an evaluator whose tokenizer "
        r"only adds tokens around the text$",
    ):
        special_prefix(_Wrapping(before, after, merge=True))


@pytest.mark.parametrize(
    "prefix, bos, want", [((), False, [1, 2, 5]), ((), True, [2, 3, 6]), ((7,), False, [1, 4]), ((7,), True, [1, 2, 5])]
)
def test_evaluator_key_tokens_map_to_the_evaluated_sequence_down_to_position_1(monkeypatch, prefix, bos, want):
    """With a one-token short context the evaluator's key token can be its position 1; it maps to the evaluated
    sequence's position 1 - len(prefix) + bos, and only position 0 (no loss) is dropped."""
    from ctxeval.evals import key_tokens as K

    calls = []

    def found(model, device, sequence, context, window, alpha, beta, chunk_size):
        calls.append((list(sequence), context, window, alpha, beta, chunk_size))
        return np.array([1, 2, 5], dtype=np.int64)

    monkeypatch.setattr(K, "key_positions", found)
    settings = _settings(context=1, window=1, evaluator_prefix=prefix, bos=bos, alpha=0.5, beta=3.0)
    assert K.evaluator_keys(None, "cpu", [10, 11, 12, 13, 14, 15], settings, chunk_size=7).tolist() == want
    assert calls == [(list(prefix) + [10, 11, 12, 13, 14, 15], 1, 1, 0.5, 3.0, 7)]
