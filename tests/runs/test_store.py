"""The run store (ctxeval/runs/store.py) as a crash, a resume and a torchrun job leave it: rows appended around a torn
line, rank files read and merged in rank order, run.json's record and history, the provenance it claims, and the
status a run ends with. Written for mutmut's survivors over runs/store.py (docs/testing.md)."""

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import ctxeval.runs.store as store_module
from ctxeval.errors import CtxevalError
from ctxeval.runs.store import RunStore, environment, now_utc, read_rows, run_status


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def test_a_torn_last_line_is_closed_before_the_next_row_and_skipped_on_reading(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.append([{"i": 0}])
        with open(store.rows_path, "a", encoding="utf-8") as fh:
            fh.write('{"i": 1, "tor')  # the process died mid-write
        store.append([{"i": 2}, {"i": 3, "text": "Émile — naïve"}])
        assert lines(store.rows_path) == [
            '{"i": 0}',
            '{"i": 1, "tor',
            '{"i": 2}',
            '{"i": 3, "text": "\\u00c9mile \\u2014 na\\u00efve"}',
            "",
        ]
        assert store.rows() == [{"i": 0}, {"i": 2}, {"i": 3, "text": "Émile — naïve"}]  # past the torn line too
        store.append([{"i": 4}])  # after a complete line nothing is inserted
        assert lines(store.rows_path)[-3:] == ['{"i": 3, "text": "\\u00c9mile \\u2014 na\\u00efve"}', '{"i": 4}', ""]


def test_the_first_row_of_an_empty_file_and_a_one_character_torn_line(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.append([{"i": 0}])
        assert store.rows_path.read_text() == '{"i": 0}\n'  # no leading newline in an empty file
        store.rows_path.write_text("{")  # a one-byte torn line
        store.append([{"i": 1}])
        assert store.rows_path.read_text() == '{\n{"i": 1}\n' and store.rows() == [{"i": 1}]


def test_numpy_numbers_are_written_as_numbers(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.append([{"nll": np.float32(1.5), "n": np.int64(3)}])
        assert store.rows() == [{"nll": 1.5, "n": 3.0}]


def test_read_rows_skips_blank_and_garbled_lines_anywhere(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n   \nnot json\n{"a": 2}\n{"a": 3')
    assert read_rows(path) == [{"a": 1}, {"a": 2}]
    assert read_rows(tmp_path / "missing.jsonl") == []


def test_rank_files_are_read_and_merged_in_rank_order(tmp_path):
    ranks = list(range(12))  # rank 10 and 11 sort before 2 as text; a dozen files make a lucky listing order unlikely
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.start({})  # rank 0 prepares the directory
        store.append([{"rank": "main"}])
        for r in reversed(ranks[1:]):  # ranks > 0 open the directory rank 0 holds
            RunStore(store.dir, {"t": 1}, rank=r).append([{"rank": r}, {"rank": r, "second": True}])
        (store.dir / "rows.rank0.jsonl").write_text('{"rank": 0}\n{"rank": 0, "second": true}\n')
        (store.dir / "rows.rankX.jsonl").write_text('{"rank": "X"}\n')  # not a rank number: read first
        expected = [{"rank": "main"}, {"rank": "X"}] + [
            row for r in ranks for row in ({"rank": r}, {"rank": r, "second": True})
        ]
        assert store.rows() == expected
        store.merge_rank_files()
        assert read_rows(store.rows_path) == expected and store.rows() == expected
        assert sorted(p.name for p in store.dir.iterdir()) == [".lock", "rows.jsonl", "run.json"]  # no rank file left


def test_an_empty_rank_file_is_removed_on_merge(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        (store.dir / "rows.rank1.jsonl").write_text("")
        store.merge_rank_files()
        assert not (store.dir / "rows.rank1.jsonl").exists() and not store.rows_path.exists()


def test_run_json_record_and_the_history_of_earlier_starts(tmp_path, monkeypatch):
    stamps = iter(["2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00", "2026-01-01T00:02:00+00:00"])
    monkeypatch.setattr(store_module, "now_utc", lambda: next(stamps))
    monkeypatch.setattr(store_module, "environment", lambda: {"machine": "first"})
    spec = {"task": "ppl", "lengths": (32, 64)}
    with RunStore(tmp_path / "r", spec) as store:
        store.start({"model": Path("/models/m")})
        first = json.loads(store.run_path.read_text())
        assert first == {
            "status": "running",
            "started": "2026-01-01T00:00:00+00:00",
            "finished": None,
            "spec": {"task": "ppl", "lengths": [32, 64]},
            "model": "/models/m",
            "environment": {"machine": "first"},
            "history": [],
        }
        assert store.run_path.read_text() == json.dumps(first, indent=2)  # readable by a person
        store.finish("error", error="boom", rows=3)
        ended = json.loads(store.run_path.read_text())
        assert (ended["status"], ended["finished"], ended["error"], ended["rows"]) == (
            "error",
            "2026-01-01T00:01:00+00:00",
            "boom",
            3,
        )
        assert not (store.dir / "run.json.tmp").exists()
    monkeypatch.setattr(store_module, "environment", lambda: {"machine": "second"})
    with RunStore(tmp_path / "r", spec) as again:  # the same spec: a resume
        again.start({"model": "/models/m"})
        record = json.loads(again.run_path.read_text())
    assert record["history"] == [
        {
            "status": "error",
            "started": "2026-01-01T00:00:00+00:00",
            "finished": "2026-01-01T00:01:00+00:00",
            "error": "boom",
            "environment": {"machine": "first"},
        }
    ]
    assert record["status"] == "running" and record["environment"] == {"machine": "second"}
    assert record["started"] == "2026-01-01T00:02:00+00:00" and record["finished"] is None
    monkeypatch.setattr(store_module, "now_utc", lambda: "2026-01-01T00:03:00+00:00")
    with RunStore(tmp_path / "r", spec) as third:  # every earlier start stays in the history, oldest first
        third.start({"model": "/models/m"})
        history = json.loads(third.run_path.read_text())["history"]
    assert [h["started"] for h in history] == ["2026-01-01T00:00:00+00:00", "2026-01-01T00:02:00+00:00"]
    assert history[1]["environment"] == {"machine": "second"} and history[1]["status"] == "running"


@pytest.mark.parametrize(
    "raised, status, error",
    [
        (None, "success", None),
        (KeyboardInterrupt, "interrupted", "interrupted by the user (Ctrl-C); rerun the same command to resume"),
        (ValueError("bad length"), "error", "ValueError: bad length"),
    ],
)
def test_run_status_finalises_whatever_happens(tmp_path, raised, status, error):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.start({})
        propagated = None
        try:
            with run_status(store) as inside:
                assert inside is store
                if raised is not None:
                    raise raised
        except BaseException as exc:
            propagated = exc
        if raised is None:
            assert propagated is None
        else:  # the exception is never swallowed
            assert propagated is raised or isinstance(propagated, raised)
        record = json.loads(store.run_path.read_text())
    assert (record["status"], record["error"]) == (status, error) and record["finished"] is not None


def test_now_utc_is_utc_to_the_second():
    stamp = now_utc()
    parsed = dt.datetime.fromisoformat(stamp)
    assert stamp.endswith("+00:00") and parsed.microsecond == 0
    assert abs((dt.datetime.now(dt.timezone.utc) - parsed).total_seconds()) < 5


@pytest.mark.parametrize(
    "kernels_on, kernels",
    [
        ((True, True, True, True), ["flash", "mem_efficient", "cudnn", "math"]),
        ((False, True, False, True), ["mem_efficient", "math"]),
    ],
)
def test_environment_is_what_this_process_runs_on(monkeypatch, kernels_on, kernels):
    import torch

    def version_without_gguf(name):
        if name == "gguf":
            raise PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(store_module, "version", version_without_gguf)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: {0: SimpleNamespace(name="NVIDIA H200", total_memory=int(139.83 * 2**30), major=9, minor=0)}[i],
    )  # the first GPU's
    for kernel, on in zip(("flash", "mem_efficient", "cudnn", "math"), kernels_on):
        monkeypatch.setattr(torch.backends.cuda, f"{kernel}_sdp_enabled", lambda on=on: on)
    env = environment()
    expected_versions = {
        name: version(name)
        for name in ("ctxeval", "torch", "transformers", "datasets", "numpy", "accelerate")
        if _installed(name)
    }
    assert {k: v for k, v in env["versions"].items() if v is not None} == expected_versions
    assert set(env["versions"]) == {"ctxeval", "torch", "transformers", "datasets", "numpy", "accelerate", "gguf"}
    assert env["versions"]["gguf"] is None
    assert env["gpu"] == {
        "name": "NVIDIA H200",
        "memory_gib": 139.8,
        "count": 2,
        "capability": "9.0",
        "sdpa_kernels": kernels,
    }
    assert (env["python"], env["platform"], env["machine"], env["cpu_count"], env["argv"]) == (
        platform.python_version(),
        platform.platform(),
        platform.machine(),
        os.cpu_count(),
        [Path(sys.argv[0]).name, *sys.argv[1:]],  # the program by name: a run records no path of the machine
    )


def test_the_git_commit_of_the_checkout_ctxeval_runs_from(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "ctxeval" / "runs").mkdir(parents=True)
    monkeypatch.setattr(store_module, "__file__", str(checkout / "ctxeval" / "runs/store.py"))
    assert environment()["git_commit"] is None  # not a git checkout (an installed wheel, a copied tree)

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (checkout / "ctxeval" / "runs/store.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "first")
    head = git("rev-parse", "HEAD")
    assert len(head) == 40 and environment()["git_commit"] == head
    (checkout / "notes.txt").write_text("untracked")  # untracked files do not make the checkout dirty
    assert environment()["git_commit"] == head
    (checkout / "ctxeval" / "runs/store.py").write_text("x = 2\n")  # a tracked file changed: the code is not HEAD's
    assert environment()["git_commit"] == head + "+dirty"

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)  # a machine without git
    assert environment()["git_commit"] is None


def test_environment_without_cuda_has_no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert environment()["gpu"] is None


def _installed(name: str) -> bool:
    try:
        version(name)
        return True
    except PackageNotFoundError:
        return False


def test_where_each_process_appends(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as single:
        single.start({})
        single.append([{"i": 0}])
        RunStore(single.dir, {"t": 1}, rank=3).append([{"i": 3}])
        assert sorted(p.name for p in single.dir.glob("rows*")) == ["rows.jsonl", "rows.rank3.jsonl"]
        assert read_rows(single.rows_path) == [{"i": 0}] and read_rows(single.dir / "rows.rank3.jsonl") == [{"i": 3}]


def test_a_spec_is_normalised_as_json_would_store_it(tmp_path):
    with RunStore(tmp_path / "r", {"lengths": (32, 64), "data": Path("/d")}) as store:
        assert store.spec == {"lengths": [32, 64], "data": "/d"}
        store.start({})
    with RunStore(tmp_path / "r", {"lengths": [32, 64], "data": "/d"}) as same:  # the same run, as read back
        assert same.record["status"] == "running"


def test_refusals_name_what_to_do(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(store_module.CtxevalError) as caught:
        RunStore(tmp_path / "afile", {"t": 1})
    assert str(caught.value) == f"--out {tmp_path / 'afile'} is a file, not a directory; choose a directory path"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(store_module.CtxevalError) as caught:
        RunStore(tmp_path / "other", {"t": 1})
    assert str(caught.value) == (
        f"{tmp_path / 'other'} exists and is not a ctxeval run directory; use another --out or --overwrite"
    )
    with RunStore(tmp_path / "r", {"task": "ppl", "lengths": [32], "seed": 0}) as store:
        store.start({})
    with pytest.raises(store_module.CtxevalError) as caught:
        RunStore(tmp_path / "r", {"task": "ppl", "lengths": [64], "bos": True})
    assert str(caught.value) == (
        f"{tmp_path / 'r'} holds a run with a different spec (differs in: bos, lengths, seed); "
        "use another --out, or --overwrite to replace it"
    )
    with pytest.raises(store_module.CtxevalError) as caught:
        RunStore(tmp_path / "r", {"task": "ppl", "lengths": [64]}, rank=1)
    assert str(caught.value) == (
        f"{tmp_path / 'r'}: run.json holds another spec than this rank's; all ranks must run one command"
    )
    assert json.loads((tmp_path / "r" / "run.json").read_text())["spec"]["lengths"] == [32]  # nothing replaced


def test_a_run_json_without_a_spec_is_refused_in_one_line(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_text("{}")
    with pytest.raises(store_module.CtxevalError, match=r"differs in: lengths, task\); use another --out"):
        RunStore(tmp_path / "r", {"task": "ppl", "lengths": [32]})


def test_overwrite_replaces_a_run_and_its_files(tmp_path):
    with RunStore(tmp_path / "r", {"t": 1}) as store:
        store.start({})
        store.append([{"i": 0}])
        (store.dir / "sub").mkdir()
        (store.dir / "sub" / "x.png").write_text("p")
    with RunStore(tmp_path / "r", {"t": 2}, overwrite=True) as fresh:
        assert fresh.record == {} and fresh.rows() == []
        assert sorted(p.name for p in fresh.dir.iterdir()) == [".lock"]  # the lock this store holds stays
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with RunStore(tmp_path / "other", {"t": 1}, overwrite=True) as taken:  # not a run directory: --overwrite takes it
        assert taken.rows() == []


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2, "b"')
    assert read_rows(path) == [{"a": 1}]


def test_run_status_records_errors_and_interrupts(tmp_path):
    store = RunStore(tmp_path / "r", {"x": 1})
    store.start({})
    with pytest.raises(ValueError):
        with run_status(store):
            raise ValueError("boom")
    first = json.loads((tmp_path / "r" / "run.json").read_text())
    assert first["status"] == "error"
    store.close()  # releases the directory's lock
    store = RunStore(tmp_path / "r", {"x": 1})  # same spec: resume
    store.start({})
    with pytest.raises(KeyboardInterrupt):
        with run_status(store):
            raise KeyboardInterrupt
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["history"][0]["status"] == "error"
    assert record["history"][0]["environment"] == first["environment"]  # how the earlier rows were made stays recorded
    store.close()
    with pytest.raises(CtxevalError, match="different spec"):
        RunStore(tmp_path / "r", {"x": 2})


def test_append_after_a_torn_line_keeps_the_new_row(tmp_path):
    store = RunStore(tmp_path / "r", {"x": 1})
    store.append([{"a": 1}])
    with open(store.rows_path, "a") as fh:
        fh.write('{"a": 2, "b"')  # killed mid-write
    store.append([{"a": 3}])
    assert read_rows(store.rows_path) == [{"a": 1}, {"a": 3}]


def test_rows_that_cannot_be_appended_are_one_line_and_keep_what_is_there(tmp_path):
    from ctxeval.runs.store import RunStore

    with RunStore(tmp_path / "run", {"task": "ppl"}) as store:
        store.append([{"model": "m", "label": "none", "length": 64, "doc": "a", "status": "oom"}])
        kept = store.rows_path.read_bytes()
        store.append_path = tmp_path / "run"  # a directory: the kernel refuses the append, as a full disk would
        with pytest.raises(CtxevalError, match="cannot append to .* the points measured so far are kept"):
            store.append([{"model": "m", "label": "none", "length": 128, "doc": "a", "status": "oom"}])
        assert store.rows_path.read_bytes() == kept
