"""Issue 27: behaviours the suite let break silently, one test each (docs/testing.md, "the mutation check").

1. RULER generation under a length-dependent method keeps one RoPE, the task's length's, for the prompt and every
   generated token (as needle does); the CLI test before this one only checked that scores lie in [0, 1].
2. A RULER task with a failed sample (out of memory, error) has no score: never the mean of the samples that
   succeeded, never in the mean over tasks or the effective length.
3. LongPPL over documents with a failed document is missing, as ppl is: never the key tokens of the others.
4. A key token at position length - 1 (the last token a sequence of that length predicts) counts at that length.
"""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.evals.common import point_row
from ctxeval.report import tables
from ctxeval.report.merged import build_report
from ctxeval.runs.rows import MISSING
from ctxeval.specs import expand_specs

runner = CliRunner()


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines() if line.strip()]


def _write_run(path, record, rows):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(record, indent=2))
    (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _record(task, spec, **extra):
    """A run.json as ctxeval writes it, with the fields the report reads (model m, trained length 128)."""
    return {
        "status": "success",
        "started": "2026-01-01T00:00:00+00:00",
        "finished": "2026-01-01T00:00:00+00:00",
        "spec": {"task": task, "model": "m", "dtype": "float32", **spec},
        "model": {"name": "m", "dtype": "float32", "max_position_embeddings": 128},
        "methods": {},
        "seed": 0,
        "environment": {},
        "history": [],
        "error": None,
        **extra,
    }


def _table(rep, kind):
    return next(t for t in rep.tables if t.kind == kind)


# -- 1. RULER generation under a dynamic method: the RoPE frozen at the task's length ---------------------------


def test_ruler_generation_under_dynamic_methods_uses_the_rope_of_the_tasks_length(tmp_path):
    """`ctxeval ruler` with dynamic NTK and dynamic YaRN on the bundled tiny model (trained on 128 tokens), fwe at 256
    and 512 tokens (50 tokens generated after prompts of about 200 and 440): every forward of the generation, the
    prompt's and each new token's, must use the RoPE run.json records for the task's length (docs/ruler.md,
    Inference: "keep the RoPE of the task's length for the prompt and every generated token"). Without the freeze
    a dynamic method recomputes it from the sequence's length, which differs at every step: the prompt's forward alone
    would use the RoPE of ~200 tokens, and the cached keys would disagree with the new queries."""
    from ctxeval.util.paths import TINY_MODEL_DIR

    hidden = json.loads((TINY_MODEL_DIR / "config.json").read_text())["hidden_size"]
    forwards = []  # (tokens in this forward, inv_freq, attention scaling) of every rotary call on hidden states

    def probe(module, args, output):
        # the rotary module's own read-back feeds it a (1, 3, rotary_dim) dummy: only the model's forwards count
        if hasattr(module, "inv_freq") and args and args[0].dim() == 3 and args[0].shape[-1] == hidden:
            forwards.append(
                (int(args[0].shape[1]), module.inv_freq.detach().double().clone(), float(module.attention_scaling))
            )

    out = tmp_path / "run"
    hook = torch.nn.modules.module.register_module_forward_hook(probe)
    try:
        result = runner.invoke(
            app,
            [
                "ruler",
                "--model",
                "tiny",
                "--tasks",
                "fwe",
                "--lengths",
                "256,512",
                "--samples",
                "1",
                "--device",
                "cpu",
                "-m",
                "dynamic-ntk",
                "-m",
                "dynamic-yarn",
                "--out",
                str(out),
            ],
        )
    finally:
        hook.remove()
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    record = json.loads((out / "run.json").read_text())

    # one generation = a prompt forward (many tokens) then one forward per new token
    generations = []
    for n, inv_freq, scaling in forwards:
        if n > 1:
            generations.append([])
        assert generations, "a one-token forward before any prompt forward"
        generations[-1].append((n, inv_freq, scaling))
    assert len(generations) == 4  # 2 methods x 2 lengths, 1 sample each

    expected = {}  # (label, length) -> the RoPE run.json records at that length
    for label in ("dynamic-ntk", "dynamic-yarn"):
        effective = {e["length"]: e for e in record["methods"][label]["effective"]}
        for length in (256, 512):
            expected[(label, length)] = (
                torch.tensor(effective[length]["inv_freq"], dtype=torch.float64),
                effective[length]["attention_factor"],
            )
    # the four RoPEs differ from each other, so each generation can be told apart by the one it used
    keys = list(expected)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not torch.allclose(expected[a][0], expected[b][0], rtol=1e-4), (a, b)

    prompt_tokens = {(r["label"], r["length"]): r["prompt_tokens"] for r in rows}
    matched = []
    for steps in generations:
        prompt = steps[0][0]
        assert len(steps) > 1, "the tiny model stopped at once: nothing was generated under the cache"
        first = [k for k in keys if torch.allclose(steps[0][1], expected[k][0], rtol=1e-5)]
        assert first, (
            f"the prompt's forward ({prompt} tokens) used a RoPE that is none of the task lengths' "
            f"{keys}: not frozen at the task's length"
        )
        key = first[0]
        assert prompt_tokens[key] == prompt and prompt < key[1]  # this generation is that point's prompt
        for i, (n, inv_freq, scaling) in enumerate(steps):
            assert torch.allclose(inv_freq, expected[key][0], rtol=1e-5), (
                f"{key}: forward {i} of the generation ({prompt} prompt tokens + {i} generated) used another RoPE "
                f"than the task's length {key[1]}: max rel diff "
                f"{float(((inv_freq - expected[key][0]).abs() / expected[key][0]).max()):.3g}"
            )
            assert scaling == pytest.approx(expected[key][1], rel=1e-6), (key, i, scaling)
        matched.append(key)
    assert sorted(matched) == sorted(keys)


# -- 2. RULER: a task with a failed sample has no score --------------------------------------------------------


RULER_TASKS = ["niah_single_1", "vt"]
RULER_LENGTHS = (1024, 2048, 4096)


def _ruler_rows(failed_status):
    """Two tasks, three lengths, two samples, every sample scoring 1.0 except vt's sample 1 at 2k, which failed.
    The samples that succeeded would give vt 100 at 2k, the mean 100 and the effective length 4k."""
    spec = expand_specs(["none"])[0]
    rows = []
    for task in RULER_TASKS:
        for length in RULER_LENGTHS:
            for sample in (0, 1):
                if (task, length, sample) == ("vt", 2048, 1):
                    rows.append(
                        point_row(
                            "m",
                            spec,
                            "ruler",
                            ruler_task=task,
                            length=length,
                            sample=sample,
                            status=failed_status,
                            note="out of memory" if failed_status == "oom" else "RuntimeError: boom",
                        )
                    )
                else:
                    rows.append(
                        point_row(
                            "m",
                            spec,
                            "ruler",
                            value=1.0,
                            ruler_task=task,
                            length=length,
                            sample=sample,
                            score=1.0,
                            prediction="x",
                            outputs=["x"],
                            metric_fn="string_match_all",
                            prompt_tokens=length - 200,
                            seconds=0.1,
                            status="ok",
                        )
                    )
    return spec, rows


@pytest.mark.parametrize("failed_status, shown", [("oom", "OOM"), ("error", MISSING)])
def test_a_ruler_task_with_a_failed_sample_has_no_score_mean_or_effective_length(tmp_path, failed_status, shown):
    """docs/protocols.md (RULER): "a sample that could not be measured (out of memory, an error) makes its task and
    length missing". So vt at 2k is shown as the failure, the 2k mean is missing, and the effective length stops
    at 1k, in the run's own tables (report/single.py) and in `ctxeval report` (report/merged.py)."""
    from ctxeval.report.single import render_ruler

    spec, rows = _ruler_rows(failed_status)

    scores = tables.ruler_task_scores(rows).set_index(["ruler_task", "length"])
    assert math.isnan(scores.loc[("vt", 2048), "score"]), "vt at 2k was scored from the sample that succeeded"
    assert scores.loc[("vt", 2048), "status"] == failed_status
    assert scores.loc[("vt", 1024), "score"] == 100.0 and scores.loc[("niah_single_1", 2048), "score"] == 100.0
    means = tables.ruler_means(tables.ruler_task_scores(rows), RULER_TASKS).set_index("length")["mean"]
    assert means[1024] == 100.0 and means[4096] == 100.0 and math.isnan(means[2048])
    assert tables.ruler_effective_length(means.to_dict(), 85.6) == 1024

    # the run's own tables: table.md, ruler.csv, summary.csv
    store = SimpleNamespace(dir=tmp_path, rows=lambda: rows, record={})
    render_ruler(store, [spec], RULER_TASKS, 128, 85.6, 2, "m: RULER")
    md = (tmp_path / "table.md").read_text()
    main = next(line for line in md.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in main.strip("|").split("|")] == ["none", "100.0", MISSING, "100.0", "1k"], main
    at_2k = md.split("## 2k: score by task")[1].split("##")[0]
    row = next(line for line in at_2k.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["none", "100.0", shown], row
    csv = {(r["ruler_task"], int(r["length"])): r for r in _csv(tmp_path / "ruler.csv")}
    assert csv[("vt", 2048)]["score"] == "" and csv[("vt", 2048)]["status"] == failed_status
    summary = _csv(tmp_path / "summary.csv")[0]
    assert summary["2048"] == "" and summary["1024"] == "100.0" and summary["effective length"] == "1024"

    # `ctxeval report`
    run = _write_run(
        tmp_path / "run",
        _record(
            "ruler",
            {
                "tasks": RULER_TASKS,
                "lengths": list(RULER_LENGTHS),
                "samples": 2,
                "seed": 42,
                "template": "base",
                "methods": ["none"],
            },
            protocol={"threshold": 85.6},
        ),
        rows,
    )
    table = _table(build_report([run]), "ruler")
    record = table.records()[0]
    assert record["1024"] == 100.0 and record["4096"] == 100.0
    assert record["2048"] is None and record["effective length"] == 1024
    assert dict(zip(table.columns, table.cells[0]))["2048"] == MISSING


def _csv(path):
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# -- 3. LongPPL with a failed document is missing, as ppl is -----------------------------------------------------


def _ppl_rows(failed_status):
    """Documents d1, d2 at 256 and 512 tokens with key tokens; d2 failed at 512. d1 alone would give a LongPPL."""
    spec = expand_specs(["none"])[0]
    rows = []
    for doc, nll, key_nll, keys in (("d1", 2.0, 1.0, 4), ("d2", 3.0, 2.5, 2)):
        for length in (256, 512):
            if (doc, length) == ("d2", 512):
                rows.append(
                    point_row(
                        "m",
                        spec,
                        "ppl",
                        protocol="truncate",
                        length=length,
                        doc=doc,
                        status=failed_status,
                        note="out of memory",
                    )
                )
                continue
            n = length
            rows.append(
                point_row(
                    "m",
                    spec,
                    "ppl",
                    protocol="truncate",
                    length=length,
                    doc=doc,
                    status="ok",
                    value=nll,
                    ppl=math.exp(nll),
                    nll_sum=nll * (n - 1),
                    n_tokens=n - 1,
                    window_nll_sum=nll,
                    n_windows=1,
                    key_nll_sum=key_nll * keys,
                    key_tokens=keys,
                    seconds=0.1,
                )
            )
    return spec, rows


@pytest.mark.parametrize("failed_status, shown", [("oom", "OOM"), ("error", MISSING)])
def test_longppl_with_a_failed_document_is_missing_as_ppl_is(tmp_path, failed_status, shown):
    """ppl over documents is missing at a length where a document failed (tables.ppl_long: never the aggregate of
    the others); LongPPL follows the same rule (tables.longppl_long). At 256 both documents count: exp((4 x 1.0 +
    2 x 2.5) / 6); at 512 d1 alone would give e^1.0, which must not be shown."""
    from ctxeval.report.single import render_longppl

    spec, rows = _ppl_rows(failed_status)
    ppl = tables.ppl_long(rows).set_index("length")
    assert math.isnan(ppl.loc[512, "ppl"]) and ppl.loc[512, "status"] == failed_status  # the rule LongPPL mirrors
    lp = tables.longppl_long(rows).set_index("length")
    assert lp.loc[256, "longppl"] == pytest.approx(math.exp((4 * 1.0 + 2 * 2.5) / 6)) and lp.loc[256, "status"] == "ok"
    assert math.isnan(lp.loc[512, "longppl"]), f"LongPPL at 512 = {lp.loc[512, 'longppl']} from d1 alone"
    assert lp.loc[512, "status"] == failed_status

    # the run's own table (longppl.csv and the LongPPL section of table.md)
    store = SimpleNamespace(dir=tmp_path, rows=lambda: rows, record={"key_tokens": {"evaluator": "m"}})
    _, section = render_longppl(store, [spec])
    row = next(line for line in section.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["none", f"{math.exp(9 / 6):.2f}", shown], row
    counts = next(line for line in section.splitlines() if line.startswith("| key tokens"))
    assert [c.strip() for c in counts.strip("|").split("|")] == ["key tokens (count)", "6", "—"]  # not counted, not 0
    csv = {int(r["length"]): r for r in _csv(tmp_path / "longppl.csv")}
    assert csv[512]["longppl"] == "" and csv[512]["key_tokens"] == "" and csv[512]["status"] == failed_status

    # `ctxeval report`
    run = _write_run(
        tmp_path / "run",
        _record(
            "ppl",
            {
                "data": "pydoc",
                "text_field": "text",
                "protocol": "truncate",
                "stride": None,
                "bos": False,
                "docs": 2,
                "lengths": [256, 512],
                "methods": ["none"],
            },
            data={"spec": "pydoc", "documents": [{"doc": "d1", "tokens": 1000}, {"doc": "d2", "tokens": 1000}]},
            protocol={"name": "truncate", "stride": None, "bos": False, "aggregate": "token"},
            key_tokens={"evaluator": "m", "method": "none", "context": 64, "window": 16},
        ),
        rows,
    )
    rep = build_report([run])
    main = _table(rep, "ppl").records()[0]
    assert main["512"] is None
    longppl = _table(rep, "longppl")
    record = next(r for r in longppl.records() if r["method"] == "none")
    assert record["256"] == pytest.approx(math.exp(9 / 6)) and record["512"] is None
    count = next(r for r in longppl.records() if r["method"] == "key tokens (count)")
    assert count["256"] == 6 and count["512"] is None


# -- 4. A key token at the last position of a length counts at that length ---------------------------------------


@pytest.mark.parametrize("method, bos", [("none", False), ("dynamic-ntk:factor=2", True)])
def test_a_key_token_at_the_last_position_counts_in_that_lengths_longppl(method, bos):
    """Key tokens at positions 31, 32 and 63 of a document measured at 32 and 64 tokens (a random tiny Llama,
    trained length 64; `none` scores both lengths from one forward, dynamic NTK each in its own). At 32 the only key
    token inside the sequence is its last one, position 31 (predicted by the 31st loss); 32 is the first token past
    it. So: 1 key token at 32 with LongPPL exp(loss of token 31), 3 at 64; the losses from a plain forward."""
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals import perplexity as P
    from ctxeval.rope.patching import apply_method

    model = tiny_llama()
    spec = expand_specs([method])[0]
    doc = TokenDoc("d", np.random.default_rng(3).integers(2, 128, 200))
    keys = np.array([31, 32, 63])
    bos_id = 1
    run = P.PplRunner(model, "cpu", P.PplConfig((32, 64), bos=bos), bos_id, "tiny")
    run.key_positions = {"d": keys}
    rows = []
    with apply_method(model, spec.name, **spec.params):
        run.measure(spec, doc, [32, 64], rows.extend)
        want = {}
        for length in (32, 64):
            seq = ([bos_id] if bos else []) + doc.ids[: length - (1 if bos else 0)].tolist()
            assert len(seq) == length
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0, :-1].double()
            losses = F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="none").numpy()  # losses[t - 1]: token t
            inside = [int(t) for t in keys if t < length]
            want[length] = (len(inside), float(sum(losses[t - 1] for t in inside)))
    assert want[32][0] == 1 and want[64][0] == 3
    got = {r["length"]: r for r in rows}
    assert sorted(got) == [32, 64] and all(r["status"] == "ok" for r in rows)
    for length, (n, total) in want.items():
        assert got[length]["key_tokens"] == n, (
            f"at {length} tokens {got[length]['key_tokens']} key token(s) counted, {n} inside the sequence "
            f"(positions {[int(t) for t in keys if t < length]})"
        )
        assert got[length]["key_nll_sum"] == pytest.approx(total, rel=1e-4, abs=1e-5)
    lp = tables.longppl_long(rows).set_index("length")
    assert lp.loc[32, "longppl"] == pytest.approx(math.exp(want[32][1]), rel=1e-4)
    assert lp.loc[64, "longppl"] == pytest.approx(math.exp(want[64][1] / 3), rel=1e-4)
