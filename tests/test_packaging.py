"""The presets live in the top-level tasks/ folder and ship as `ctxeval.tasks`: a built wheel and an editable install
must both find every one of them (and the bundled tiny model), from any working directory."""

import json
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.stem for p in (REPO / "tasks").glob("*.toml"))
# run in a fresh interpreter: where the package ctxeval.tasks is (no checkout fallback), the preset names, and that
# each preset loads
PROBE = (
    "import json; from importlib.resources import files; from ctxeval.data.presets import preset_names, load_task\n"
    "names = preset_names()\n"
    "for n in names: load_task(n, n.split('-')[0])\n"
    "print(json.dumps({'folder': str(files('ctxeval.tasks')), 'names': names}))\n"
)


def _probe(cwd: Path, env: dict | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_a_built_wheel_carries_every_preset_and_the_tiny_model(tmp_path):
    assert len(PRESETS) >= 9
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info next to pyproject.toml
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "results", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"
        ),
    )
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    wheel = next(tmp_path.glob("ctxeval-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"ctxeval/tasks/{p}.toml" for p in PRESETS} <= names
    assert {"ctxeval/tiny/model/model.safetensors", "ctxeval/tiny/model/config.json"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    found = _probe(tmp_path, env={"PYTHONPATH": str(site), "PATH": ""})  # the wheel's ctxeval, not the checkout's
    assert Path(found["folder"]).is_relative_to(site) and found["names"] == PRESETS


def test_an_editable_install_finds_every_preset(tmp_path):
    direct = distribution("ctxeval").read_text("direct_url.json")
    if not direct or not json.loads(direct).get("dir_info", {}).get("editable"):
        pytest.skip("ctxeval is not installed in editable mode here")
    found = _probe(tmp_path)  # a directory outside the checkout: only the install can find the package
    assert Path(found["folder"]).resolve() == (REPO / "tasks").resolve() and found["names"] == PRESETS
