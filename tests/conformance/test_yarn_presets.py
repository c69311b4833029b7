"""The YaRN repo's perplexity protocols as presets: each preset's resolved settings (document rule, lengths, protocol,
aggregate) equal jquesnelle/yarn's eval.sh + eval/perplexity.py, checked offline on a local stand-in corpus with a
word-per-token tokenizer; and its compute_perplexity, transcribed here, gives ctxeval's numbers on a tiny model."""

import json
import math

import numpy as np
import pytest
import torch
from evals.fake_lm import FakeLM
from helpers import TINY, tiny_llama

from ctxeval.cli.options import parse_lengths
from ctxeval.cli.ppl import PplSettings, select_documents
from ctxeval.data.presets import load_task
from ctxeval.evals import perplexity as P
from ctxeval.report.tables import ppl_long
from ctxeval.runs.store import RunStore
from ctxeval.specs import expand_specs


class WordTokenizer:
    """One token per whitespace-separated word (ids < 100): document lengths are exactly the word counts."""

    _ctxeval_fingerprint = "words-per-token-test"
    bos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + (len(w) * 7) % 98 for w in text.split()]}


def stand_in(tmp_path, field, word_counts):
    """A .jsonl corpus whose documents have the given token counts, in order."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({field: " ".join(["w"] * n)}) + "\n" for n in word_counts))
    return str(path)


def yarn_repo_rule(word_counts, dataset_min_tokens, samples):
    """eval/perplexity.py: input_texts.filter(tokenized_len >= dataset_min_tokens), then input_texts[:samples]."""
    kept = [i for i, n in enumerate(word_counts) if dataset_min_tokens is None or n >= dataset_min_tokens]
    return kept[:samples] if samples else kept


def resolve(name, data):
    preset = load_task(name, "ppl")
    return PplSettings.resolve({"data": data}, preset, name), preset


def chosen(settings, lengths, stride=None):
    cfg = P.PplConfig(tuple(lengths), settings.protocol, stride, settings.bos)
    docs = select_documents(settings, cfg, WordTokenizer())
    return [int(d.doc_id.rsplit("#", 1)[1]) for d in docs]


def test_proofpile_preset_is_proofpile_long_small(tmp_path):
    # PROOFPILE_LONG_SMALL: --dataset-min-tokens 131072 --samples 10 --truncate, 2048..131072 step 2048
    counts = [131071, 200000, 5000, 131072] + [131072 + i for i in range(12)]
    settings, preset = resolve("ppl-yarn-proofpile", stand_in(tmp_path, "text", counts))
    assert preset["data"] == "hf:emozilla/proofpile-test-tokenized@test" and settings.text_field == "text"
    lengths = parse_lengths(settings.lengths)
    assert lengths == list(range(2048, 131072 + 1, 2048)) and len(lengths) == 64
    assert (settings.protocol, settings.aggregate, settings.bos, settings.docs) == ("truncate", "window", True, 10)
    # the first 10 with >= 131072 tokens: the 131071-token document is out although BOS + 131071 fills 128k
    assert chosen(settings, lengths) == yarn_repo_rule(counts, 131072, 10) == [1, 3, *range(4, 12)]


def test_govreport_preset_is_govreport(tmp_path):
    # GOVREPORT: --dataset-min-tokens 16384 --samples 50, --min-tokens 32768 --max-tokens 32768, sliding window 256
    counts = [16383, 40000, 100] + [16384 + 97 * i for i in range(55)]
    settings, preset = resolve("ppl-yarn-govreport", stand_in(tmp_path, "input", counts))
    assert preset["data"] == "hf:emozilla/govreport-test-tokenized@test" and settings.text_field == "input"
    assert parse_lengths(settings.lengths) == [32768]
    assert (settings.protocol, settings.stride, settings.aggregate, settings.docs) == ("sliding", 256, "window", 50)
    assert chosen(settings, [32768], 256) == yarn_repo_rule(counts, 16384, 50)


def test_pg19_preset_is_the_scripts_defaults(tmp_path):
    # PG19 (defined, never run by eval.sh): no --samples, no --dataset-min-tokens; defaults --min-tokens 256
    # --max-tokens 8192 doubling, --sliding-window 256; 256 itself is left out (the repo would skip tokens there)
    counts = [3000, 70000, 20, 9000]
    settings, preset = resolve("ppl-yarn-pg19", stand_in(tmp_path, "text", counts))
    assert preset["data"] == "hf:emozilla/pg19-test-tokenized@test"
    assert parse_lengths(settings.lengths) == [512, 1024, 2048, 4096, 8192]
    assert (settings.protocol, settings.stride, settings.aggregate, settings.docs) == ("sliding", 256, "window", 100)
    assert chosen(settings, [512], 256) == yarn_repo_rule(counts, None, None)  # every book (the 20-token one too)
    with pytest.raises(Exception, match="tokens would be skipped"):
        P.PplConfig((256,), "sliding", 256)


def yarn_compute_perplexity(model, encoded_texts, max_length, sliding_window=256, truncate=False, bos=1):
    """jquesnelle/yarn eval/perplexity.py compute_perplexity, transcribed (add_start_token=True)."""
    max_tokenized_len = max_length - 1
    if truncate:
        encoded_texts = [x[0:max_tokenized_len] for x in encoded_texts]
        sliding_window = max_tokenized_len
    nlls = []
    for encoded in encoded_texts:
        labels = torch.tensor([encoded])
        seq_len = labels.size(1)
        prev_end_loc = 0
        for begin_loc in range(0, seq_len, sliding_window):
            end_loc = min(begin_loc + max_tokenized_len, seq_len)
            trg_len = end_loc - prev_end_loc
            input_ids = torch.cat([torch.tensor([[bos]]), labels[:, begin_loc:end_loc]], dim=1)
            target_ids = input_ids.clone()
            target_ids[:, :-trg_len] = -100
            with torch.no_grad():
                nlls.append(model(input_ids, labels=target_ids).loss)
            prev_end_loc = end_loc
            if end_loc == seq_len:
                break
    return float(torch.exp(torch.stack(nlls).mean()))


@pytest.mark.parametrize("protocol", ["truncate", "sliding"])
def test_window_aggregate_equals_the_repos_compute_perplexity(tmp_path, protocol):
    """A scaled-down GovReport (sliding, documents shorter and longer than the window) and Proof-pile (truncate)."""
    from ctxeval.data.corpora import TokenDoc

    model = tiny_llama()
    L = TINY["max_position_embeddings"]
    g = np.random.default_rng(0)
    lengths_of_docs = [L // 2, 3 * L + 5, L - 1, 2 * L] if protocol == "sliding" else [4 * L, 5 * L, 4 * L + 3]
    documents = [TokenDoc(f"d{i}", g.integers(2, TINY["vocab_size"], n)) for i, n in enumerate(lengths_of_docs)]
    lengths = (L,) if protocol == "sliding" else (L // 2, L, 2 * L, 4 * L)
    cfg = P.PplConfig(lengths, protocol, stride=L // 4 if protocol == "sliding" else None)
    store = RunStore(tmp_path / "r", {"t": 1})
    store.start({})
    P.sweep(FakeLM(model), expand_specs(["none"]), documents, cfg, store)
    got = ppl_long(store.rows(), "window").set_index("length")["ppl"]
    for length in lengths:
        want = yarn_compute_perplexity(
            model, [d.ids.tolist() for d in documents], length, sliding_window=L // 4, truncate=protocol == "truncate"
        )
        assert got[length] == pytest.approx(want, rel=1e-5)
    # token-weighted differs from the repo's mean of window means once windows or documents differ in size
    if protocol == "sliding":
        assert not math.isclose(ppl_long(store.rows(), "token").set_index("length")["ppl"][L], got[L], rel_tol=1e-3)
