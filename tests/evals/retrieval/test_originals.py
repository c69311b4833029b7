"""ctxeval ruler --samples-from DIR for the retrieval tasks: the originals' own released files (issue 41)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.retrieval import helmet_json_kv, infinitebench, litm_kv
from ctxeval.evals.retrieval.originals import original_samples
from ctxeval.evals.retrieval.suite import INFBENCH_TEMPLATE

KEYS = [(f"k{i}", f"v{i}") for i in range(5)]


def write_jsonl(path: Path, rows: list[object], gz: bool = False) -> Path:
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def litm_rows() -> list[dict[str, object]]:
    return [
        {"ordered_kv_records": [list(p) for p in KEYS], "key": "k3", "value": "v3"},
        {"ordered_kv_records": [list(p) for p in KEYS[::-1]], "key": "k0", "value": "v0"},
        {"ordered_kv_records": [list(p) for p in KEYS], "key": "k1", "value": "v1"},
    ]


def test_litm_prompts_depths_and_numbering(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "kv-retrieval-5_keys.jsonl.gz", litm_rows(), gz=True)
    samples = original_samples("litm:kv", tmp_path, 4096, 2, (0.0, 50.0, 100.0))
    assert [s.index for s in samples] == list(range(6))
    assert [s.depth for s in samples] == [0.0, 0.0, 50.0, 50.0, 100.0, 100.0]
    second = litm_kv.KvExample(KEYS[::-1], "k0", "v0")
    assert samples[3].input == litm_kv.kv_sample(second, 2).prompt  # round(0.5 * 4)
    first = litm_kv.KvExample(KEYS, "k3", "v3")
    assert samples[4].input == litm_kv.kv_sample(first, 4).prompt
    assert samples[0].input.split("\n")[3] == '{"k3": "v3",'
    assert (samples[0].outputs, samples[0].answer_prefix, samples[0].size, samples[0].length) == (["v3"], "", 5, -1)


def test_litm_refuses_none_several_and_bad_lines(tmp_path: Path) -> None:
    with pytest.raises(CtxevalError, match="holds no kv-retrieval"):
        original_samples("litm:kv", tmp_path, 4096, 2, (50.0,))
    write_jsonl(tmp_path / "kv-retrieval-5_keys.jsonl", litm_rows())
    write_jsonl(tmp_path / "kv-retrieval-75_keys.jsonl.gz", litm_rows(), gz=True)
    with pytest.raises(CtxevalError, match=r"2 kv-retrieval files \(kv-retrieval-5_keys.jsonl, kv-retrieval-75"):
        original_samples("litm:kv", tmp_path, 4096, 2, (50.0,))
    (tmp_path / "kv-retrieval-75_keys.jsonl.gz").unlink()
    path = tmp_path / "kv-retrieval-5_keys.jsonl"
    path.write_text(json.dumps(litm_rows()[0]) + "\n{not json\n")
    with pytest.raises(CtxevalError, match=r"kv-retrieval-5_keys.jsonl line 2 is not JSON.*ordered_kv_records") as e:
        original_samples("litm:kv", tmp_path, 4096, 5, (50.0,))
    assert "\n" not in str(e.value)
    assert len(original_samples("litm:kv", tmp_path, 4096, 1, (50.0,))) == 1  # the bad line is past the limit
    write_jsonl(path, [{"ordered_kv_records": [list(p) for p in KEYS], "key": "k9", "value": "v9"}])
    with pytest.raises(CtxevalError, match="line 1: the pair .* not among ordered_kv_records"):
        original_samples("litm:kv", tmp_path, 4096, 5, (50.0,))


def helmet_row(depth: float, answer: object) -> dict[str, object]:
    context = "JSON data:\n" + json.dumps(dict(KEYS), indent=4)
    return {
        "context": context,
        "demos": [["k0", "v0"], ["k4", "v4"]],
        "question": "k2",
        "answer": answer,
        "depth": depth,
        "num_kvs": 5,
    }


def test_helmet_prompt_depth_answers_and_limit(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "test_k50_dep6.jsonl", [helmet_row(0.5, ["v2"]), helmet_row(0.25, "v2"), helmet_row(1, "x")])
    samples = original_samples("helmet:json_kv", tmp_path, 4096, 2, (0.0,))
    assert len(samples) == 2
    row = helmet_row(0.5, ["v2"])
    assert samples[0].input == helmet_json_kv.json_kv_prompt(str(row["context"]), [("k0", "v0"), ("k4", "v4")], "k2")
    assert [s.depth for s in samples] == [50.0, 25.0]
    assert [s.outputs for s in samples] == [["v2"], ["v2"]]
    assert (samples[0].index, samples[1].index, samples[0].size) == (0, 1, 5)


def test_helmet_refusals(tmp_path: Path) -> None:
    with pytest.raises(CtxevalError, match=r"no json_kv file for length 5000; its lengths: 4096, 8192"):
        original_samples("helmet:json_kv", tmp_path, 5000, 2, (50.0,))
    with pytest.raises(CtxevalError, match=r"test_k105_dep6.jsonl is missing"):
        original_samples("helmet:json_kv", tmp_path, 8192, 2, (50.0,))
    bad = helmet_row(0.5, "v2") | {"demos": "Key: k0\nCorresponding value: v0"}
    write_jsonl(tmp_path / "test_k50_dep6.jsonl", [bad])
    with pytest.raises(CtxevalError, match=r"test_k50_dep6.jsonl line 1: `demos` is a str, not a list"):
        original_samples("helmet:json_kv", tmp_path, 4096, 2, (50.0,))
    write_jsonl(tmp_path / "test_k50_dep6.jsonl", [helmet_row(25, "v2")])
    with pytest.raises(CtxevalError, match=r"line 1: `depth` is not a number from 0 to 1"):
        original_samples("helmet:json_kv", tmp_path, 4096, 2, (50.0,))


def needle_context(needle: str, key: str, before: int, after: int) -> str:
    return infinitebench.NOISE * before + needle.replace("{key}", key) + infinitebench.NOISE * after


def test_infbench_needles_depth_and_prompt(tmp_path: Path) -> None:
    rows = [
        {
            "context": needle_context(infinitebench.PASSKEY_NEEDLE, "01234", 1, 3),
            "input": "What is the pass key?",
            "answer": ["01234"],
        },
        {
            "context": needle_context(infinitebench.PASSKEY_NEEDLE, "55555", 4, 0),
            "input": "What is the pass key?",
            "answer": "55555",
        },
    ]
    write_jsonl(tmp_path / "passkey.jsonl", rows)
    samples = original_samples("infbench:passkey", tmp_path, 131072, 5, (50.0,))
    assert [s.depth for s in samples] == [25.0, 100.0]
    assert [s.size for s in samples] == [4, 4]
    assert [s.outputs for s in samples] == [["01234"], ["55555"]]
    row = SimpleNamespace(context=rows[0]["context"], input=rows[0]["input"])
    assert samples[0].input == infinitebench.infinitebench_prompt("passkey", row, INFBENCH_TEMPLATE)
    assert samples[0].length == -1


def test_infbench_kv_and_math_find(tmp_path: Path) -> None:
    context = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in KEYS) + "}"
    kv = {
        "id": 0,
        "context": context,
        "input": '\nKey: "k1"\nThe value associated with the specified key is: ',
        "answer": ["v1"],
    }
    write_jsonl(tmp_path / "kv_retrieval.jsonl", [kv])
    (sample,) = original_samples("infbench:kv_retrieval", tmp_path, 131072, 5, (50.0,))
    assert (sample.depth, sample.size, sample.outputs) == (25.0, 5, ["v1"])
    assert sample.input == infinitebench.infinitebench_prompt(
        "kv_retrieval", SimpleNamespace(context=context, input=kv["input"]), INFBENCH_TEMPLATE
    )
    question = "You should answer with only one number, no other words. The median number of the list is: "
    math = [
        {"context": "[3, 1, 2, 9]", "input": question, "answer": [2.5]},
        {"context": "[3, 1]", "input": question, "answer": 2},
    ]
    write_jsonl(tmp_path / "math_find.jsonl", math)
    samples = original_samples("infbench:math_find", tmp_path, 131072, 5, (50.0,))
    assert [(s.depth, s.size, s.outputs) for s in samples] == [(None, 4, ["2.5"]), (None, 2, ["2"])]
    assert samples[0].input == infinitebench.infinitebench_prompt(
        "math_find", SimpleNamespace(context="[3, 1, 2, 9]", input=question), INFBENCH_TEMPLATE
    )


def test_infbench_refusals(tmp_path: Path) -> None:
    with pytest.raises(CtxevalError, match=r"number_string.jsonl is missing"):
        original_samples("infbench:number_string", tmp_path, 131072, 5, (50.0,))
    write_jsonl(tmp_path / "passkey.jsonl", [{"context": infinitebench.NOISE * 3, "input": "q", "answer": "12345"}])
    with pytest.raises(CtxevalError, match=r"passkey.jsonl line 1: no line of `context` holds the answer"):
        original_samples("infbench:passkey", tmp_path, 131072, 5, (50.0,))
    write_jsonl(tmp_path / "kv_retrieval.jsonl", [{"context": "JSON data:\n{", "input": "q", "answer": "x"}])
    with pytest.raises(CtxevalError, match=r"kv_retrieval.jsonl line 1: `context` holds no JSON object"):
        original_samples("infbench:kv_retrieval", tmp_path, 131072, 5, (50.0,))
    (tmp_path / "math_find.jsonl").write_text('["a list"]\n')
    with pytest.raises(CtxevalError, match=r"math_find.jsonl line 1 is not a JSON object"):
        original_samples("infbench:math_find", tmp_path, 131072, 5, (50.0,))
    with pytest.raises(CtxevalError, match=r"facts:qa1: no released original file"):
        original_samples("facts:qa1", tmp_path, 131072, 5, (50.0,))


def test_prepare_reads_the_originals_file_and_keeps_a_copy(tmp_path: Path) -> None:
    from ctxeval.evals.ruler import run as E

    given = tmp_path / "litm"
    given.mkdir()
    write_jsonl(given / "kv-retrieval-5_keys.jsonl.gz", litm_rows(), gz=True)
    cfg = E.RulerConfig(("litm:kv",), (4096,), samples=2, seed=0, depths=(0.0, 100.0))
    from transformers import AutoTokenizer

    from ctxeval.util.paths import TINY_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))  # prepare refuses a released prompt past the length
    out = E.prepare(cfg, tok, "src", tmp_path / "run", samples_from=given)
    samples = out[("litm:kv", 4096)]
    assert samples == original_samples("litm:kv", given, 4096, 2, (0.0, 100.0))
    copy = E.read_samples(E.samples_path(tmp_path / "run" / E.SAMPLES_DIR, "litm:kv", 4096), "litm:kv", 4096)
    assert [(s.input, s.outputs, s.depth, s.size) for s in copy] == [
        (s.input, s.outputs, s.depth, s.size) for s in samples
    ]
