"""torchrun: 2 CPU processes (gloo) give the same rows and tables as one process; a crashed distributed run's
rank files resume with 1 rank; the work split is balanced by cost and deterministic."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.runs.distributed import Dist

runner = CliRunner()
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _torchrun(args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [TORCHRUN, "--nproc-per-node", "2", "--master-port", str(29500 + os.getpid() % 1000), "-m", "ctxeval", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_shard_is_a_balanced_partition():
    items = [("a", 8), ("b", 1), ("c", 4), ("d", 4), ("e", 2), ("f", 1)]
    parts = [Dist(r, 3).shard(items, cost=lambda it: it[1]) for r in range(3)]
    assert sorted(x for p in parts for x in p) == sorted(items)  # every item once
    loads = [sum(c for _, c in p) for p in parts]
    assert max(loads) == 8 and sorted(loads) == [6, 6, 8]  # LPT: the 8 alone, the rest split evenly
    assert parts == [Dist(r, 3).shard(items, cost=lambda it: it[1]) for r in range(3)]  # deterministic
    assert Dist().shard(items, cost=lambda it: it[1]) == items  # one process: everything, in order


@pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun not installed")
def test_torchrun_two_ranks_equals_one_process(tmp_path, tiny_model_dir, text_dir):
    ppl = [
        "ppl",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--docs",
        "2",
        "--lengths",
        "32,64,128",
        "-m",
        "none",
        "-m",
        "yarn:factor=2",
        "-m",
        "dynamic-ntk",
        "--device",
        "cpu",
    ]
    _torchrun([*ppl, "--out", str(tmp_path / "dist")], tmp_path)
    single = runner.invoke(app, [*ppl, "--out", str(tmp_path / "one")])
    assert single.exit_code == 0, single.output
    key = lambda r: (r["label"], r["length"], r["doc"])  # noqa: E731
    dist_rows = {key(r): r["nll_sum"] for r in _rows(tmp_path / "dist" / "rows.jsonl")}
    one_rows = {key(r): r["nll_sum"] for r in _rows(tmp_path / "one" / "rows.jsonl")}
    assert dist_rows == one_rows and len(one_rows) == 3 * 3 * 2
    assert (tmp_path / "dist" / "table.md").read_text() == (tmp_path / "one" / "table.md").read_text()
    assert not list((tmp_path / "dist").glob("rows.rank*.jsonl"))  # merged by rank 0
    record = json.loads((tmp_path / "dist" / "run.json").read_text())
    assert record["status"] == "success" and record["distributed"] == {"world_size": 2}
    assert set(record["methods"]) == {"none", "yarn(factor=2)", "dynamic-ntk"}

    needle = [
        "needle",
        "--model",
        str(tiny_model_dir),
        "--haystack",
        str(text_dir),
        "--lengths",
        "320,384",
        "--depths",
        "0,100",
        "--samples",
        "2",
        "--scoring",
        "forced",
        "-m",
        "none",
        "-m",
        "pi:factor=2",
        "--device",
        "cpu",
    ]
    _torchrun([*needle, "--out", str(tmp_path / "ndist")], tmp_path)
    assert runner.invoke(app, [*needle, "--out", str(tmp_path / "none")]).exit_code == 0
    nkey = lambda r: (r["label"], r["length"], r["depth"], r["sample"])  # noqa: E731
    a = {nkey(r): (r["correct"], round(r["answer_nll"], 4)) for r in _rows(tmp_path / "ndist" / "rows.jsonl")}
    b = {nkey(r): (r["correct"], round(r["answer_nll"], 4)) for r in _rows(tmp_path / "none" / "rows.jsonl")}
    assert a == b and len(a) == 2 * 2 * 2 * 2
    assert (tmp_path / "ndist" / "table.md").read_text() == (tmp_path / "none" / "table.md").read_text()


@pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun not installed")
def test_torchrun_ruler_equals_one_process(tmp_path):
    args = [
        "ruler",
        "--model",
        "tiny",
        "--tasks",
        "niah_single_1,vt,fwe",
        "--lengths",
        "1k",
        "--samples",
        "2",
        "-m",
        "none",
        "-m",
        "yarn:factor=4",
        "--device",
        "cpu",
    ]
    _torchrun([*args, "--out", str(tmp_path / "dist")], tmp_path)
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "one")]).exit_code == 0
    key = lambda r: (r["label"], r["ruler_task"], r["length"], r["sample"])  # noqa: E731
    dist = {key(r): (r["prediction"], r["score"]) for r in _rows(tmp_path / "dist" / "rows.jsonl")}
    one = {key(r): (r["prediction"], r["score"]) for r in _rows(tmp_path / "one" / "rows.jsonl")}
    assert dist == one and len(one) == 2 * 3 * 2
    for task in ("niah_single_1", "vt", "fwe"):  # both ranks wrote the same prompts
        name = f"samples/1024/{task}/validation.jsonl"
        assert (tmp_path / "dist" / name).read_text() == (tmp_path / "one" / name).read_text()
    assert not list((tmp_path / "dist").rglob("*.tmp"))
    assert (tmp_path / "dist" / "table.md").read_text() == (tmp_path / "one" / "table.md").read_text()


def test_crashed_two_rank_run_resumes_with_one_rank(tmp_path, tiny_model_dir, text_dir):
    """A 2-rank run that died: its rows are spread over rows.rank0/1.jsonl, some points missing, run.json
    'running'. One process measures only the missing points and folds everything into rows.jsonl."""
    args = [
        "ppl",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--docs",
        "2",
        "--lengths",
        "32,64",
        "-m",
        "none",
        "-m",
        "ntk:factor=2",
        "--out",
        str(tmp_path / "r"),
    ]
    assert runner.invoke(app, args).exit_code == 0
    run_dir = tmp_path / "r"
    rows = _rows(run_dir / "rows.jsonl")
    reference = (run_dir / "table.md").read_text()
    kept = [r for r in rows if not (r["label"] == "ntk(factor=2)" and r["doc"] == rows[-1]["doc"])]
    missing = len(rows) - len(kept)
    assert missing == 2
    (run_dir / "rows.jsonl").unlink()
    for rank in (0, 1):
        (run_dir / f"rows.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept[rank::2]))
    record = json.loads((run_dir / "run.json").read_text())
    record["status"] = "running"
    (run_dir / "run.json").write_text(json.dumps(record))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    merged = _rows(run_dir / "rows.jsonl")
    assert len(merged) == len(rows)  # the kept rows + only the missing points, measured once
    assert not list(run_dir.glob("rows.rank*.jsonl"))
    assert (run_dir / "table.md").read_text() == reference
    assert json.loads((run_dir / "run.json").read_text())["status"] == "success"


@pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun not installed")
def test_default_run_directory_is_rank_0s_and_a_failing_rank_fails_the_run(tmp_path, tiny_model_dir, text_dir):
    """Without --out every rank writes into rank 0's directory; when one rank raises, the run ends as error (not
    success), rows of the other rank are kept, and a 1-process rerun completes it."""
    args = [
        "ppl",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--docs",
        "2",
        "--lengths",
        "32,64",
        "-m",
        "none",
        "-m",
        "pi:factor=2",
        "--device",
        "cpu",
    ]
    _torchrun(args, tmp_path)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and len(_rows(runs[0] / "rows.jsonl")) == 8

    script = tmp_path / "crash.py"  # rank 1 fails inside its share of the work
    script.write_text(
        "import os, sys\n"
        "import ctxeval.evals.perplexity as P\n"
        "real = P.PplRunner.measure\n"
        "def measure(self, *a, **k):\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('injected failure on rank 1')\n"
        "    return real(self, *a, **k)\n"
        "P.PplRunner.measure = measure\n"
        "from ctxeval.cli import main\n"
        "sys.argv = ['ctxeval'] + sys.argv[1:]\n"
        "main()\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    out = tmp_path / "crashed"
    result = subprocess.run(
        [
            TORCHRUN,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(30500 + os.getpid() % 1000),
            str(script),
            *args,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode != 0
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "error" and "another rank failed" in record["error"]
    assert not (out / "table.md").exists()
    kept = len(_rows(out / "rows.jsonl"))
    assert 0 < kept < 8  # rank 0's share, merged
    again = runner.invoke(app, [*args, "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert len(_rows(out / "rows.jsonl")) == 8
