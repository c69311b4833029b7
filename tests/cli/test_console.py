"""What the terminal shows: progress lines with an ETA and the sample they are about, one summary line at the end of
every measuring command, the per-task and passkey-context tables on stdout, readable tables at 80 columns, no
library reminders that do not apply, and every option name whole in `--help` at 80 columns."""

import csv
import io
import json
import logging
import re

import pytest
from rich.console import Console
from typer.main import get_command
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.cli import console as C
from ctxeval.cli.run import tally
from ctxeval.evals.common import numbered

runner = CliRunner()


# -- progress: ETA ----------------------------------------------------------------------------------------------------


def test_the_remaining_time_is_the_rate_so_far_and_unknown_before_a_point():
    assert C.remaining_seconds(10.0, 0, 100) is None  # nothing done: no rate
    assert C.remaining_seconds(10.0, 25, 100) == pytest.approx(30.0)  # 25 units in 10 s, 75 left
    assert C.remaining_seconds(10.0, 100, 100) == 0
    assert [C.fmt_eta(s) for s in (None, 41.6, 185, 7620)] == ["ETA ?", "ETA 42s", "ETA 3m05s", "ETA 2h07m"]
    assert [C.fmt_duration(s) for s in (26.14, 185, 7620)] == ["26.1 s", "3m05s", "2h07m"]


@pytest.fixture
def clock(monkeypatch):
    """A settable time.perf_counter for the console module."""
    now = [0.0]
    monkeypatch.setattr(C.time, "perf_counter", lambda: now[0])
    return now


@pytest.fixture
def plain_err(monkeypatch):
    """stderr as a file (not a terminal): the progress prints one plain line per point."""
    buffer = io.StringIO()
    monkeypatch.setattr(C, "err", Console(file=buffer, highlight=False, soft_wrap=True, emoji=False))
    return buffer


def test_plain_progress_lines_carry_an_eta_from_the_rate_since_the_total_was_known(clock, plain_err):
    with C.RichProgress() as progress:
        clock[0] = 100.0  # prompts generated, model warmed: the rate starts when the total is known
        progress.start(100)
        clock[0] = 110.0
        progress.advance(25, "none L=128 sample 1/4")
        clock[0] = 130.0
        progress.advance(25, "none L=128 sample 2/4")
        clock[0] = 140.0
        assert C.fmt_eta(progress.eta(since_last=True)) == "ETA 20s"  # the live bar counts down between points
    lines = plain_err.getvalue().splitlines()
    assert lines[0].startswith("[  110.0s  25% ETA 30s") and lines[0].endswith("] none L=128 sample 1/4")
    assert lines[1].startswith("[  130.0s  50% ETA 30s") and lines[1].endswith("] none L=128 sample 2/4")


def test_the_live_bar_has_an_eta_column_that_says_unknown_before_the_first_point(clock):
    progress = C.RichProgress()
    progress.start(10)
    eta = [col for col in progress.bar.columns if isinstance(col, C.EtaColumn)]
    assert len(eta) == 1 and eta[0].render(progress.bar.tasks[0]).plain == "ETA ?"
    clock[0] = 4.0
    progress.live = True  # no plain line, as on a terminal
    progress.advance(4, "x")
    assert eta[0].render(progress.bar.tasks[0]).plain == "ETA 6s"


# -- progress: which sample ------------------------------------------------------------------------------------------


def test_numbered_names_one_item_a_run_or_a_set():
    assert numbered("sample", [3], 25) == "sample 3/25"
    assert numbered("sample", [2, 1, 3, 4], 25) == "samples 1-4/25"
    assert numbered("prompt", [9, 2, 5], 10) == "prompts 2,5,9/10"


def test_ruler_progress_names_each_sample(monkeypatch):
    from ctxeval.evals.prompts.sample import RulerSample
    from ctxeval.evals.ruler.run import RulerRunner
    from ctxeval.specs import expand_specs

    lines = []
    progress = type("P", (), {"note": lambda self, t: None, "advance": lambda self, n, t: lines.append(t)})()
    run = RulerRunner(None, None, "cpu", "tiny", batch_size=1, progress=progress)
    monkeypatch.setattr(run, "predict", lambda prompts, *a, **k: (["no"] * len(prompts), [10] * len(prompts)))
    samples = [RulerSample(i, "Remember 42.", ["42"], 30, " Answer:") for i in range(3)]
    run.measure(expand_specs(["none"])[0], "niah_single_1", 1024, samples[1:], lambda rows: None, of=3)
    assert lines == ["none niah_single_1 L=1024 sample 2/3 0%", "none niah_single_1 L=1024 sample 3/3 0%"]


def test_needle_and_passkey_progress_name_each_prompt(monkeypatch):
    from ctxeval.evals import needle as N
    from ctxeval.specs import expand_specs

    item = type("Item", (), {})
    spec = expand_specs(["none"])[0]

    def items(*cells):  # (depth index, sample, depth)
        out = []
        for d, s, depth in cells:
            it = item()
            it.length, it.depth_index, it.sample_index, it.depth = 600, d, s, depth
            out.append(it)
        return out

    runner_ = N.NeedleRunner.__new__(N.NeedleRunner)
    runner_.cfg = N.NeedleConfig((600,), (0.0, 50.0), samples=2)
    two = items((1, 0, 50.0)), items((1, 1, 50.0))  # one depth, two samples: printed alike before
    assert [runner_.describe(spec, c, [{"correct": 1}]) for c in two] == [
        "none L=600 depth 50% sample 1/2 ok",
        "none L=600 depth 50% sample 2/2 ok",
    ]
    batch = items((0, 1, 0.0), (1, 0, 50.0))
    assert runner_.describe(spec, batch, [{"correct": 0}, {"correct": 1}]) == (
        "none L=600 prompts 2-3/4 (depth 0-50%) 1/2 ok"
    )
    runner_.cfg = N.NeedleConfig((600,), (), samples=10, random_depth=True)  # passkey: one drawn depth per sample
    assert runner_.describe(spec, items((0, 3, 12.5), (0, 7, 80.0)), [{"correct": 1}] * 2) == (
        "none L=600 samples 4,8/10 (depth 12.5-80%) 2/2 ok"
    )


# -- the summary line ------------------------------------------------------------------------------------------------


def _row(label, length, status="ok", **extra):
    return {"model": "m", "label": label, "length": length, "doc": "d", "status": status, **extra}


def test_tally_counts_points_measured_now_reused_and_failed():
    before = [_row("none", 64, nll=1.0), _row("none", 128, status="oom")]
    after = before + [
        _row("none", 128, nll=2.0),
        _row("yarn", 64, nll=3.0),
        _row("yarn", 128, status="oom"),
        _row("pi", 128, status="skipped"),
    ]
    counts = tally(before, after, "ppl")
    assert (counts.measured, counts.reused, counts.failed) == (2, 1, {"oom": 1, "skipped": 1})
    assert str(counts) == ("2 points measured, 1 reused from an earlier run, 2 failed (1 out of memory, 1 skipped)")
    # rows moved (a rank file folded into rows.jsonl) are not new; a row written again is
    assert str(tally(before, before[::-1], "ppl")) == "0 points measured, 1 reused from an earlier run, 0 failed"
    assert tally(before, before + [before[0]], "ppl").measured == 1


def test_a_run_ends_with_one_summary_line_and_a_resume_says_what_it_reused(tmp_path):
    out = tmp_path / "run"
    args = ["ppl", "--model", "tiny", "--lengths", "64,128", "-m", "none", "--out", str(out)]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("done in ") and last.endswith(
        f": 2 points measured, 0 reused from an earlier run, 0 failed; {out}/table.md"
    )
    rows = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text(rows[0] + "\n")  # one point lost: the resume measures it alone
    again = runner.invoke(app, args)
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .endswith(f": 1 point measured, 1 reused from an earlier run, 0 failed; {out}/table.md")
    )


def test_an_interrupted_run_says_what_it_kept_before_the_interruption(tmp_path, monkeypatch):
    from ctxeval.evals import perplexity

    measured = perplexity.sweep

    def then_ctrl_c(*args, **kwargs):
        measured(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(perplexity, "sweep", then_ctrl_c)
    out = tmp_path / "run"
    result = runner.invoke(app, ["ppl", "--model", "tiny", "--lengths", "64,128", "-m", "none", "--out", str(out)])
    assert result.exit_code == 130
    stopped, interrupted = result.stderr.strip().splitlines()[-2:]
    assert stopped.startswith("stopped after ") and stopped.endswith(
        f": 2 points measured, 0 reused from an earlier run, 0 failed; kept in {out}"
    )
    assert interrupted.startswith("interrupted:")


# -- tables ----------------------------------------------------------------------------------------------------------


def _store(tmp_path, task, rows):
    from ctxeval.runs.store import RunStore

    store = RunStore(tmp_path / task, {"task": task})
    store.append(rows)
    return store


def test_ruler_prints_the_per_task_scores_of_table_md(tmp_path):
    from ctxeval.report.kinds.ruler import render_ruler
    from ctxeval.specs import expand_specs

    specs, tasks, lengths = expand_specs(["none", "yarn:factor=2"]), ["niah_single_1", "vt", "cwe"], [1024, 2048]
    score = {
        (s.label, t, L): (i * 7 + j * 3 + k) % 10 / 10
        for i, s in enumerate(specs)
        for j, t in enumerate(tasks)
        for k, L in enumerate(lengths)
    }  # every cell its own number: a mixed-up cell shows
    rows = [
        {"model": "tiny", "label": label, "ruler_task": t, "length": L, "sample": 0, "status": "ok", "score": v}
        for (label, t, L), v in score.items()
    ]
    store = _store(tmp_path, "ruler", rows)
    outputs = render_ruler(store, specs, tasks, 128, 85.6, 1, "tiny: RULER")
    per_task = outputs.tables[1]
    assert per_task.headers == ["method", "task", "1k", "2k"]
    markdown = (store.dir / "table.md").read_text()
    for label, task, *cells in per_task.rows:
        assert cells == [f"{score[(label, task, L)] * 100:.1f}" for L in lengths]
        for L, cell in zip(["1k", "2k"], cells):  # the same numbers as table.md's per-length tables
            section = markdown.split(f"## {L}: score by task")[1].split("##")[0]
            header = [c.strip() for c in section.strip().splitlines()[0].strip("|").split("|")]
            line = next(x for x in section.splitlines() if x.startswith(f"| {label} "))
            assert [c.strip() for c in line.strip("|").split("|")][header.index(task)] == cell
    assert len(per_task.rows) == len(specs) * len(tasks)


def test_passkey_prints_its_context_table(tmp_path):
    from ctxeval.report.kinds.needle import render_retrieval
    from ctxeval.specs import expand_specs

    rows = [
        {
            "model": "tiny",
            "label": "none",
            "length": L,
            "depth": 50.0,
            "sample": s,
            "status": "ok",
            "correct": int(L == 256 or s == 0),
        }
        for L in (256, 512)
        for s in range(2)
    ]
    store = _store(tmp_path, "passkey", rows)
    outputs = render_retrieval(store, "passkey", expand_specs(["none"]), 128, 0.8, "tiny: passkey")
    context = outputs.tables[1]
    assert context.headers == ["method", "passkey context", "passkey accuracy"]
    assert context.rows == [["none", "256", "100%"]]
    assert "| none   | 256             | 100%             |" in (store.dir / "table.md").read_text()


def table_at(monkeypatch, width, *args):
    """print_table's output on a `width`-column console."""
    buffer = io.StringIO()
    monkeypatch.setattr(C, "out", Console(file=buffer, width=width, highlight=False, soft_wrap=True, emoji=False))
    C.print_table(*args)
    return buffer.getvalue()


def cells_of(text):
    """The words of a printed table's lines, its frame characters dropped."""
    return {w for line in text.splitlines() for w in line.replace("│", " ").replace("┃", " ").split()}


VALID_HEADERS = [
    "method",
    "reference length",
    "ppl at reference",
    "longest within 10% of own ppl",
    "x original",
    "longest within 10% of none",
    "x original (vs base)",
]


def test_a_wide_table_fits_80_columns_with_every_cell_whole(monkeypatch):
    rows = [
        ["none", "128", "55.94", "128", "1.00", "128", "1.00"],
        ["yarn(factor=16)", "1,024", "155.78", "2,048", "16.00", "128", "1.00"],
        ["yarn(beta_fast=4,beta_slow=0.25,factor=2)", "1,024", "155.78", "2,048", "16.00", "—", "—"],
    ]
    text = table_at(monkeypatch, 80, "valid length", "caption", VALID_HEADERS, rows)
    assert max(len(line) for line in text.splitlines()) <= 80
    words = cells_of(text)
    assert {c for r in rows for c in r[1:]} <= words  # every number whole, on one line
    assert {"none", "yarn(factor=16)", "yarn(beta_fast=4,", "beta_slow=0.25,"} <= words  # broken only after a comma
    assert text.count("valid length") == 1 and text.rstrip().endswith("caption")  # one table: no box, no split


def test_a_table_too_wide_for_the_terminal_is_split_with_its_names_in_each_part(monkeypatch):
    rows = [["none", "128", "74.91", "128", "1.00", "128", "1.00"], ["yarn(factor=8)", "128", "104.10"] + ["—"] * 4]
    text = table_at(monkeypatch, 44, "valid length", "caption", VALID_HEADERS, rows)
    assert max(len(line) for line in text.splitlines()) <= 44
    parts = text.split("valid length (continued)")
    assert len(parts) >= 2 and all("yarn(factor=8)" in part and "none" in part for part in parts)
    assert {"74.91", "104.10", "1.00"} <= cells_of(text) and text.count("caption") == 1


def test_numbers_and_ranks_keep_their_width_and_parameter_lists_break_between_parameters(monkeypatch):
    # the issue: the tune best-trials table at 80 columns had an empty rank column and one digit per line
    params = "beta_fast=2.487, beta_slow=0.1876, attention_factor=0.997"
    headers = ["rank", "trial", "ppl at 1k", "ppl at 128", "rise at 128", "parameters (as searched)"]
    rows = [[str(i), str(100 + i), "95.16", "79.86", "+0.97%", params] for i in range(1, 11)]
    text = table_at(monkeypatch, 80, "the 10 best trial(s)", None, headers, rows)
    assert max(len(line) for line in text.splitlines()) <= 80
    body = text.split("┡")[1].splitlines()[1:-1]
    assert [line.split("│")[1].strip() for line in body if line.split("│")[1].strip()] == [str(i) for i in range(1, 11)]
    assert {"95.16", "79.86", "+0.97%", *params.split()} <= cells_of(text)
    assert "   1 │" in body[0]  # a rank is a number: right-aligned


def test_stdout_that_is_not_a_terminal_takes_columns_when_it_is_set(monkeypatch):
    console = C.DataConsole(file=io.StringIO())  # not a terminal
    monkeypatch.setenv("COLUMNS", "80")
    assert console.width == 80
    monkeypatch.delenv("COLUMNS")
    assert console.width == C.PIPED_WIDTH  # logs and files: tables at their full width


def test_ppl_prints_its_tables_at_80_columns_with_method_labels_whole(tmp_path):
    # the issue: the valid-length table broke 'yarn(factor=8)' as 'yarn(facto' / 'r=8)', and piped output ignored
    # COLUMNS (CliRunner's stdout is not a terminal)
    args = ["ppl", "--lengths", "128,256,512", "-m", "none", "-m", "yarn:factor=8", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "valid length (ppl within 10%)" in result.stdout
    labels = [line.replace("│", " ").split()[0] for line in lines if line.lstrip("│ ").startswith(("none", "yarn"))]
    assert len(labels) >= 6 and set(labels) == {"none", "yarn(factor=8)"}  # 2 rows x 3 tables, whole
    valid = list(csv.DictReader((tmp_path / "run" / "valid.csv").open()))
    for row in valid:  # every value of the valid-length table whole
        for value in row.values():
            assert not value or value in cells_of(result.stdout) or f"{float(value):.2f}" in cells_of(result.stdout)


def test_methods_at_80_columns_keeps_every_parameter_whole():
    result = runner.invoke(app, ["methods"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    words = cells_of(result.stdout)
    assert {"original_max_position_embeddings=None,", "beta_fast=32.0,", "dynamic-ntk", "leaky-rerope"} <= words


# -- messages that do not apply --------------------------------------------------------------------------------------


@pytest.fixture
def records():
    """Records that reach the transformers generation logger's handlers at WARNING (the tests run transformers at
    ERROR and warning_once remembers what it printed: both undone here)."""
    from transformers.utils import logging as hf_logging

    logger = logging.getLogger("transformers.generation.stopping_criteria")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()
    yield seen
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_the_generation_length_reminder_is_silenced_and_nothing_else(records):
    import torch
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    from ctxeval.models.load import load_model

    load_model("tiny", device="cpu")
    MaxLengthCriteria(max_length=100, max_position_embeddings=4)(torch.zeros(1, 8, dtype=torch.long), None)
    logging.getLogger("transformers.generation.stopping_criteria").warning("another warning")
    assert [r.getMessage() for r in records] == ["another warning"]


def test_lm_eval_runs_without_the_loaded_model_warnings(tmp_path, caplog, records):
    pytest.importorskip("lm_eval")
    (tmp_path / "gen.jsonl").write_text(
        json.dumps({"context": "The word is plum. " + "The sky is blue. " * 40, "answer": "plum"}) + "\n"
    )
    (tmp_path / "gen.yaml").write_text(f"""task: ctxeval_terminal_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}} Answer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 3
  do_sample: false
metric_list:
  - metric: exact_match
""")
    caplog.set_level(logging.WARNING, logger="lm_eval")
    result = runner.invoke(
        app,
        [
            "lm-eval",
            "--model",
            "tiny",
            "--tasks",
            "ctxeval_terminal_gen",
            "--include-path",
            str(tmp_path),
            "--max-length",
            "256",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    lm_eval_warnings = [r.getMessage() for r in caplog.records if r.name == "lm_eval.models.huggingface"]
    assert not any("pretrained" in m for m in lm_eval_warnings), lm_eval_warnings
    assert records == []  # generation runs past the tiny model's 128 tokens: the reminder was due
    assert result.stderr.strip().splitlines()[-1].startswith("done in ")
    assert ": 1 point measured, 0 reused from an earlier run, 0 failed; " in result.stderr


# -- --help at 80 columns --------------------------------------------------------------------------------------------

COMMANDS = ["ppl", "needle", "passkey", "ruler", "entropy", "report", "lm-eval", "bound", "methods", "plan", "tune"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_at_80_columns_shows_every_option_name_whole(command):
    group = get_command(app)
    cmd = group if command is None else group.commands[command]
    names = [name for p in cmd.params for name in (*p.opts, *p.secondary_opts) if name.startswith("-")]
    result = runner.invoke(app, [*([command] if command else []), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    words = set(result.output.replace(",", " ").replace("/", " ").split())
    assert [n for n in names if n not in words] == []
    if command is None:
        assert "Perplexity vs. context length" in result.output  # not cut at 'vs.'


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_each_value_by_what_it_is_not_by_its_python_type(command):
    # the issue: '-m, --method <list[str]>', '--out <path>', 'runs... <list[Path]>'
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    leaked = re.findall(r"<(?:str|int|float|bool|path|Path|list\[[^>]*\])>", result.output)
    assert leaked == []
    option_lines = [line.split() for line in result.output.splitlines() if line.lstrip().startswith("-")]
    takes_value = [words for words in option_lines if len(words) > 1 and not words[1].startswith(("/", "-"))]
    assert takes_value  # every command has options with a value


def test_help_values_read_as_their_meaning():
    help_of = {c: runner.invoke(app, [c, "--help"], env={"COLUMNS": "200"}).output for c in ("ppl", "report", "tune")}
    assert "-m, --method METHOD" in help_of["ppl"] and "--lengths LENGTHS" in help_of["ppl"]
    assert "--out DIR" in help_of["ppl"] and "--docs N" in help_of["ppl"] and "--model MODEL" in help_of["ppl"]
    assert "RUN_DIR..." in help_of["report"] and "--html FILE" in help_of["report"]
    assert "--space NAME=LOW:HIGH" in help_of["tune"] and "--export DIR" in help_of["tune"]


def test_the_command_list_gives_each_command_a_whole_summary_and_examples_follow():
    # the issue: `ctxeval --help` cut every summary mid-phrase ('List the RoPE methods (frequencies) and attention
    # methods,...') and showed no example
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:")[1].split("Examples:")[0]
    summaries = dict(line.strip().split(None, 1) for line in listed.strip().splitlines())
    assert set(summaries) == set(get_command(app).commands)
    assert all(not text.endswith("...") and text.endswith((".", ")")) for text in summaries.values()), summaries
    examples = result.output.split("Examples:")[1]
    assert "ctxeval ppl && ctxeval needle" in examples and "ctxeval report runs/* --html report.html" in examples
