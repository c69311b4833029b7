"""ctxeval lm-eval: local lm-eval tasks (written here) on the bundled tiny model under none, a frequency method and an
attention method; the same numbers as lm-eval run directly; resume; report; bad input."""

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

try:
    import lm_eval
except ImportError:  # an optional extra: skipped without it, except in CI, which installs it (.ci/run)
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("lm-eval is not installed (pip install 'ctxeval[lm-eval]')", allow_module_level=True)

runner = CliRunner()
QUESTIONS = [
    ("The capital of France is", [" Paris", " Berlin", " Madrid"], 0),
    ("Two plus two is", [" four", " five"], 0),
    ("The sky is", [" blue", " green"], 0),
    ("A function is defined with the keyword", [" def", " class", " import"], 0),
]
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    """A loglikelihood multiple-choice task and a generate-until task whose answer is at the start of a context
    longer than the tiny model's 128 tokens."""
    path = tmp_path_factory.mktemp("lm-eval-tasks")
    (path / "mc.jsonl").write_text(
        "".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS)
    )
    (path / "gen.jsonl").write_text(
        "".join(
            json.dumps({"context": f"The secret word is {w}. " + FILLER * 6 + "What is the secret word?", "answer": w})
            + "\n"
            for w in ("apple", "pear", "plum")
        )
    )
    (path / "mc.yaml").write_text(f"""task: ctxeval_test_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path / "mc.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
""")
    (path / "gen.yaml").write_text(f"""task: ctxeval_test_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}} Answer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
""")
    (path / "online.yaml").write_text("""task: ctxeval_test_online
dataset_path: ctxeval-nobody/no-such-dataset-anywhere
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""")
    return path


def bridge(out, task_dir, *extra):
    return runner.invoke(
        app,
        [
            "lm-eval",
            "--model",
            "tiny",
            "--tasks",
            "ctxeval_test_mc,ctxeval_test_gen",
            "--include-path",
            str(task_dir),
            "--out",
            str(out),
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task_dir):
    out = tmp_path_factory.mktemp("lm-eval-run") / "run"
    result = bridge(
        out,
        task_dir,
        "-m",
        "none",
        "-m",
        "yarn:factor=2",
        "-m",
        "self-extend:group_size=2,neighbor_window=32",
        "--log-samples",
    )
    assert result.exit_code == 0, result.output
    return out


def rows_of(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def test_rows_results_and_read_back(run_dir):
    rows = rows_of(run_dir)
    got = {(r["label"], r["lm_eval_task"], r["metric"]) for r in rows}
    labels = ["none", "yarn(factor=2)", "self-extend(group_size=2,neighbor_window=32)"]
    assert got == {
        (label, t, m)
        for label in labels
        for t, m in (("ctxeval_test_mc", "acc"), ("ctxeval_test_mc", "acc_norm"), ("ctxeval_test_gen", "exact_match"))
    }
    assert all(r["status"] == "ok" and r["length"] == 256 and r["samples"] in (3, 4) for r in rows)
    assert all(r["stderr"] is not None for r in rows)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "success" and run["spec"]["max_length"] == 256  # 128 x the largest factor
    assert run["methods"]["yarn(factor=2)"]["effective"][0]["max_rel_diff"] < 1e-5  # the RoPE read back
    assert run["methods"]["self-extend(group_size=2,neighbor_window=32)"]["attention_check"]
    saved = json.loads((run_dir / "lm-eval" / "yarn-factor-2" / "ctxeval_test_mc.json").read_text())
    assert saved["results"]["ctxeval_test_mc"]["acc,none"] == next(
        r["value"] for r in rows if r["label"] == "yarn(factor=2)" and r["metric"] == "acc"
    )
    # the generate-until prompts kept their start: lm-eval was given the extended max_length, not the config's 128
    samples = (run_dir / "lm-eval" / "none" / "ctxeval_test_gen.samples.jsonl").read_text().splitlines()
    assert len(samples) == 3 and "The secret word is" in json.loads(samples[0])["arguments"][0][0]
    assert "yarn(factor=2)" in (run_dir / "table.md").read_text()


def test_bridge_equals_lm_eval_run_directly(run_dir, task_dir):
    """Method none through the bridge = lm-eval's own HFLM loading the same checkpoint, to the digit."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from ctxeval.tiny import MODEL_DIR

    direct = HFLM(pretrained=str(MODEL_DIR), device="cpu", batch_size=1, max_length=256, dtype="float32")
    result = lm_eval.simple_evaluate(
        model=direct,
        tasks=["ctxeval_test_mc", "ctxeval_test_gen"],
        task_manager=TaskManager(include_path=str(task_dir)),
    )
    rows = {(r["subtask"], r["metric"]): r for r in rows_of(run_dir) if r["label"] == "none"}
    for task, metric in (
        ("ctxeval_test_mc", "acc"),
        ("ctxeval_test_mc", "acc_norm"),
        ("ctxeval_test_gen", "exact_match"),
    ):
        assert rows[(task, metric)]["value"] == result["results"][task][f"{metric},none"]
        assert rows[(task, metric)]["stderr"] == result["results"][task][f"{metric}_stderr,none"]


def test_report_merges_the_run(run_dir):
    from ctxeval.report.merged import build_report

    rep = build_report([run_dir])
    table = rep.tables[0]
    assert table.kind == "lm-eval" and table.columns[2:] == [
        "ctxeval_test_mc acc",
        "ctxeval_test_mc acc_norm",
        "ctxeval_test_gen exact_match",
    ]
    assert [r[1] for r in table.rows] == ["none", "yarn(factor=2)", "self-extend(group_size=2,neighbor_window=32)"]
    assert all(v is not None for r in table.rows for v in r[2:])


def test_resume_runs_only_the_missing_pairs(tmp_path, task_dir, monkeypatch):
    calls = []
    real = lm_eval.simple_evaluate

    def failing_second(*a, **k):
        calls.append(k["tasks"][0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(lm_eval, "simple_evaluate", failing_second)
    out = tmp_path / "run"
    first = bridge(out, task_dir, "-m", "none")
    assert first.exit_code != 0
    assert {r["lm_eval_task"] for r in rows_of(out)} == {"ctxeval_test_mc"}
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    calls.clear()
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda *a, **k: (calls.append(k["tasks"][0]), real(*a, **k))[1])
    second = bridge(out, task_dir, "-m", "none")
    assert second.exit_code == 0, second.output
    assert calls == ["ctxeval_test_gen"]  # the finished task is not run again
    assert {r["lm_eval_task"] for r in rows_of(out)} == {"ctxeval_test_mc", "ctxeval_test_gen"}


def one_line_exit_2(result, fragment):
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0]  # (lm-eval's own log lines may precede it)


def test_unknown_task_is_refused_before_loading(tmp_path, task_dir):
    result = runner.invoke(
        app,
        [
            "lm-eval",
            "--model",
            "/nonexistent",
            "--tasks",
            "ctxeval_test_mcq",
            "--include-path",
            str(task_dir),
            "--out",
            str(tmp_path / "r"),
        ],
    )
    one_line_exit_2(result, "unknown lm-eval task 'ctxeval_test_mcq'")
    assert "ctxeval_test_mc" in result.stderr  # the close match is suggested
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("metadata, fragment", [("{max_seq_lengths", "not JSON"), ("[4096]", "JSON object")])
def test_bad_metadata_is_refused(tmp_path, task_dir, metadata, fragment):
    result = runner.invoke(
        app,
        [
            "lm-eval",
            "--model",
            "/nonexistent",
            "--tasks",
            "ctxeval_test_mc",
            "--include-path",
            str(task_dir),
            "--metadata",
            metadata,
            "--out",
            str(tmp_path / "r"),
        ],
    )
    one_line_exit_2(result, fragment)


def test_missing_lm_eval_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    result = runner.invoke(app, ["lm-eval", "--model", "tiny", "--tasks", "x", "--out", str(tmp_path / "r")])
    one_line_exit_2(result, "pip install 'ctxeval[lm-eval]'")


def test_task_that_needs_the_network_offline_keeps_what_was_measured(tmp_path, task_dir, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    import ctxeval.evals.lm_eval_bridge as bridge_module
    import ctxeval.util.hub

    # no network, whatever this machine has: the hub is unreachable, and the offline switches flipped for it are
    # restored afterwards
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(ctxeval.util.hub, "hub_reachable", lambda: False)
    monkeypatch.setattr(bridge_module, "hub_reachable", lambda: False)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "lm-eval",
            "--model",
            "tiny",
            "--tasks",
            "ctxeval_test_mc,ctxeval_test_online",
            "--include-path",
            str(task_dir),
            "--out",
            str(out),
        ],
    )
    one_line_exit_2(result, "Hugging Face Hub is unreachable")
    assert {r["lm_eval_task"] for r in rows_of(out)} == {"ctxeval_test_mc"}  # measured before it: kept
    assert json.loads((out / "run.json").read_text())["status"] == "error"
