"""The presets live in the top-level tasks/ folder and ship as `ctxeval.tasks`: a built wheel and an editable install
must both find every one of them (and the bundled tiny model), from any working directory; the wheel carries the HTML
report's style sheet and script, and the pages it renders inline them."""

import json
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel built from a copy of the checkout, and the folder it is unpacked in (an install without pip)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
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
    built = next(tmp_path.glob("ctxeval-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(built).extractall(site)
    return built, site


def test_a_built_wheel_carries_every_preset_and_the_tiny_model(wheel, tmp_path):
    assert len(PRESETS) >= 9
    built, site = wheel
    names = set(zipfile.ZipFile(built).namelist())
    assert {f"ctxeval/tasks/{p}.toml" for p in PRESETS} <= names
    assert {"ctxeval/tiny/model/model.safetensors", "ctxeval/tiny/model/config.json"} <= names
    family = [p.relative_to(REPO).as_posix() for p in (REPO / "ctxeval" / "tiny" / "family").glob("*/*")]
    assert set(family) <= names  # the position-encoding family's weights, cards and logs
    found = _probe(tmp_path, env={"PYTHONPATH": str(site), "PATH": ""})  # the wheel's ctxeval, not the checkout's
    assert Path(found["folder"]).is_relative_to(site) and found["names"] == PRESETS


def test_the_wheel_carries_every_package_of_the_checkout(wheel):
    """pyproject.toml lists the packages by hand: a new package left out of it imports in an editable install and is
    missing from a wheel (ctxeval.evals.retrieval was, once)."""
    built, _ = wheel
    names = set(zipfile.ZipFile(built).namelist())
    packages = sorted(str(p.relative_to(REPO)) for p in (REPO / "ctxeval").rglob("__init__.py"))
    assert len(packages) >= 14
    assert [p for p in packages if p not in names] == []


# the report's page built by the installed package, from a committed run: where its assets are, what they hold, and
# the page (written to a file: it is large)
REPORT_PROBE = (
    "import json, sys; from importlib.resources import files; from ctxeval.report.html import to_html\n"
    "from ctxeval.report.merged import build_report\n"
    "page = to_html(build_report([sys.argv[1]]))\n"
    "open(sys.argv[2], 'w', encoding='utf-8').write(page)\n"
    "folder = files('ctxeval.report') / 'assets'\n"
    "print(json.dumps({'folder': str(folder), 'css': (folder / 'report.css').read_text(encoding='utf-8'),\n"
    "                  'js': (folder / 'report.js').read_text(encoding='utf-8')}))\n"
)


def test_the_wheel_carries_the_html_reports_style_sheet_and_script_and_its_pages_inline_them(wheel, tmp_path):
    built, site = wheel
    assert {"ctxeval/report/assets/report.css", "ctxeval/report/assets/report.js"} <= set(
        zipfile.ZipFile(built).namelist()
    )
    out = tmp_path / "report.html"
    result = subprocess.run(
        [sys.executable, "-c", REPORT_PROBE, str(REPO / "results" / "ppl-tiny-quickstart"), str(out)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": ""},  # the wheel's ctxeval, not the checkout's
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout)
    assert Path(found["folder"]).is_relative_to(site)
    assets = REPO / "ctxeval" / "report" / "assets"
    assert found["css"] == (assets / "report.css").read_text(encoding="utf-8")
    assert found["js"] == (assets / "report.js").read_text(encoding="utf-8")
    page = out.read_text(encoding="utf-8")
    assert f"<style>\n{found['css']}</style>" in page and f"<script>\n{found['js']}</script>" in page
    assert 'id="ppl-1"' in page  # the run's table, rendered by the installed package


def test_an_editable_install_finds_every_preset(tmp_path):
    direct = distribution("ctxeval").read_text("direct_url.json")
    if not direct or not json.loads(direct).get("dir_info", {}).get("editable"):
        pytest.skip("ctxeval is not installed in editable mode here")
    found = _probe(tmp_path)  # a directory outside the checkout: only the install can find the package
    assert Path(found["folder"]).resolve() == (REPO / "tasks").resolve() and found["names"] == PRESETS
