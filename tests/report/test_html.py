"""`ctxeval report --html`: one self-contained page (nothing loaded from the network, figures as data URIs), every
table of the report sortable, missing cells shown as missing (never 0), each run's provenance; and the page as
headless Chromium renders it (a real screenshot, the DOM after the page's script ran, a real click on a header)."""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from html import escape, unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report.run_dirs import cli, entropy_run, needle_run, ppl_run

from ctxeval.report import figures as report_figures
from ctxeval.report import merged
from ctxeval.report.html import asset, to_html, write_html
from ctxeval.report.render import write_plots

SELF_EXTEND = "self-extend(group_size=4,neighbor_window=32)"
HOSTILE = "<script>alert(1)</script>"  # a value from a run.json: must come out as text


def rewrite(run_dir, record_fn=None, row_fn=None):
    """Edit a hand-written run directory's run.json / rows.jsonl in place."""
    if record_fn:
        record = json.loads((run_dir / "run.json").read_text())
        record_fn(record)
        (run_dir / "run.json").write_text(json.dumps(record, indent=2))
    if row_fn:
        rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
        (run_dir / "rows.jsonl").write_text("".join(json.dumps(row_fn(r)) + "\n" for r in rows))
    return run_dir


def with_positions_and_key_tokens(row):
    """Loss-by-position sums and LongPPL key-token sums, as ctxeval ppl --key-tokens writes them."""
    if row["status"] != "ok":
        return row
    nll = row["nll_sum"] / row["n_tokens"]
    tokens = [8, 24, row["length"] - 1 - 32]
    return {
        **row,
        "position_edges": [0, 8, 32, row["length"]],
        "position_tokens": tokens,
        "position_nll_sum": [n * nll * f for n, f in zip(tokens, (1.2, 1.0, 0.9))],
        "key_tokens": 5,
        "key_nll_sum": 5 * (nll + 0.5),
    }


def provenance(record):
    record["environment"] = {
        "versions": {"ctxeval": "0.1.0", "torch": "2.13.0+cpu"},
        "python": "3.11.7",
        "git_commit": "abc1234+dirty",
        "gpu": None,
        "cpu_count": 2,
        "argv": ["/venv/bin/ctxeval", "ppl", "--model", "m1", "--note", HOSTILE],
    }
    geometry = {"rotary_dim": 16, "base": 10000.0, "original_length": 128}

    def effective(factor, diff):
        return [
            {
                "length": None,
                "attention_factor": factor,
                "attention_factor_readback": factor,
                "inv_freq": [1.0, 0.1],
                "inv_freq_readback": [1.0, 0.1],
                "max_rel_diff": diff,
            }
        ]

    record["methods"] = {
        "none": {
            "method": "none",
            "params": {},
            "length_dependent": False,
            "geometry": geometry,
            "effective": effective(1.0, 6.44e-08),
        },
        "yarn(factor=2)": {
            "method": "yarn",
            "params": {"factor": 2.0, "beta_fast": 32.0},
            "length_dependent": False,
            "geometry": geometry,
            "effective": effective(1.0693147, 1.08e-07),
        },
        SELF_EXTEND: {
            "method": "none",
            "params": {},
            "length_dependent": False,
            "geometry": geometry,
            "effective": effective(1.0, 6.44e-08),
            "attention_methods": [{"name": "self-extend", "params": {"group_size": 4, "neighbor_window": 32}}],
            "attention_check": {"layers_running_it": 2, "probe_tokens": 80, "max_abs_diff_vs_reference": 3.09e-07},
        },
    }
    record["key_tokens"] = {"evaluator": "m1", "method": "none", "context": 32}
    record["history"] = [
        {
            "status": "oom",
            "started": "2025-12-31T00:00:00+00:00",
            "finished": None,
            "error": "out of memory",
            "environment": {"git_commit": "0ld0ld0"},
        }
    ]


def make_runs(root):
    a = ppl_run(
        root,
        "a",
        ppl={"none": {64: 10.0, 128: 12.0}, "yarn(factor=2)": {64: 11.0, 128: 11.5}, SELF_EXTEND: {128: 11.8}},
        failed=[("yarn(factor=2)", 256, "oom")],
    )
    rewrite(a, provenance, with_positions_and_key_tokens)
    b = ppl_run(
        root,
        "b",
        model="m2",
        original=256,
        ppl={"none": {64: 9.0, 128: 9.5, 256: 30.0}, "yarn(factor=2)": {64: 9.2, 128: 9.4, 256: 9.9}},
    )
    n = needle_run(root, "n", acc={"none": {64: 1, 128: 0}, "yarn(factor=2)": {128: 1}})
    k = needle_run(
        root,
        "k",
        task="passkey",
        samples=5,
        haystack="filler",
        acc={"none": {64: [1, 1, 1, 1, 1], 128: [1, 1, 1, 1, 0], 256: [1, 0, 0, 0, 0]}},
    )
    e = entropy_run(root, "e", status="running", failed=[("yarn(factor=2)", 256, "oom")])
    return [a, b, n, k, e]


class Tables(HTMLParser):
    """The page's tables: id -> rows of cells (text, attributes); and every tag's attributes."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tables, self.tags, self._table, self._row, self._cell = {}, [], None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id") or f"anonymous-{len(self.tables)}", [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ["", {**attrs, "tag": tag}]
            self._row.append(self._cell)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag in ("td", "th"):
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data


def body_rows(table):
    """A parsed table's body rows as {header text: (cell text, attributes)} (header arrows left out)."""
    headers = [text.strip() for text, _ in table[0]]
    return [{h: (text.strip(), attrs) for h, (text, attrs) in zip(headers, row)} for row in table[1:]]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = make_runs(root)
    rep = merged.build_report(runs)
    out = tmp_path_factory.mktemp("html") / "report.html"
    write_html(rep, out)
    return rep, out, out.read_text(encoding="utf-8")


# -- the file ----------------------------------------------------------------------------------------------------


def test_page_loads_nothing_from_anywhere_and_embeds_every_figure(page):
    rep, _, text = page
    parsed = Tables(text)
    assert not re.search(r"https?://", text)  # not even as text: these runs name no URL
    assert not re.search(r"<link\b|@import|url\(|<iframe|<object|<embed", text, re.I)
    for tag, attrs in parsed.tags:
        assert not (tag == "script" and "src" in attrs)
        assert attrs.get("href", "#").startswith("#"), (tag, attrs)  # in-page anchors only
    images = [attrs for tag, attrs in parsed.tags if tag == "img"]
    assert len(images) == 5  # ppl-1, ppl-1-positions, needle-1, passkey-1, entropy-1
    for attrs in images:
        assert attrs["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(attrs["src"].split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    for key in ("ppl-1", "ppl-1-positions", "needle-1", "passkey-1", "entropy-1"):
        assert f'id="fig-{key}"' in text


def test_every_table_title_caption_footnote_and_note_is_there(page):
    rep, _, text = page
    tables = Tables(text).tables
    assert {t.id for t in rep.tables} == {
        "ppl-1",
        "ppl-1-valid",
        "ppl-1-longppl",
        "ppl-1-positions",
        "needle-1",
        "passkey-1",
        "entropy-1",
    }
    for table in rep.tables:
        assert table.id in tables, table.id
        assert escape(table.title) in text and escape(table.caption) in text
        assert [c[0].strip() for c in tables[table.id][0]] == table.headers
        assert [[c[0] for c in row] for row in tables[table.id][1:]] == table.cells  # exactly the markdown's cells
        for footnote in table.footnotes:
            assert escape(footnote) in text
    assert any("†" in f for t in rep.tables for f in t.footnotes)
    notes = rep.notes + [n for g in rep.groups for n in g.notes]
    assert any("incomplete (status running)" in n for n in notes)
    for note in notes:
        assert escape(note) in text
    for group in rep.groups:
        assert f'id="group-{group.id}"' in text and escape(group.title) in text and escape(group.description) in text


def test_values_sort_keys_and_missing_cells(page):
    rep, _, text = page
    tables = Tables(text).tables
    ppl = {(r["model"][0], r["method"][0]): r for r in body_rows(tables["ppl-1"])}
    assert ppl[("m1", "none")]["128"] == ("12.00", {"class": "num", "data-v": "12.0", "tag": "td"})
    assert ppl[("m2", "none")]["256"][0] == "30.00"
    never = ppl[("m1", "none")]["256"]  # m1 was never measured at 256: missing, not zero
    oom = ppl[("m1", "yarn(factor=2)")]["256"]
    assert never[0] == "—" and "missing" in never[1]["class"] and "st-missing" in never[1]["class"]
    assert oom[0] == "OOM" and "st-oom" in oom[1]["class"]
    assert "data-v" not in never[1] and "data-v" not in oom[1]  # no sort key: sorted last
    assert ppl[("m1", SELF_EXTEND)]["64"][0] == "—"
    for table in tables.values():  # no missing cell anywhere reads as a number
        for row in table[1:]:
            for cell_text, attrs in row:
                if "missing" in attrs.get("class", ""):
                    assert not re.fullmatch(r"[\d.,%]+", cell_text.strip()), (cell_text, attrs)
    entropy = {(r["model"][0], r["method"][0]): r for r in body_rows(tables["entropy-1"])}
    assert entropy[("m1", "yarn(factor=2)")]["256"][0] == "OOM"
    uniform = tables["entropy-1"][-1]
    assert [c[0] for c in uniform[:2]] == ["any model", "uniform (ln of visible keys)"]
    assert re.search(r'<tr data-i="\d+" class="reference"><td class="id" data-v="any model">', text)
    longppl = {(r["model"][0], r["method"][0]): r for r in body_rows(tables["ppl-1-longppl"])}
    assert longppl[("m1", "key tokens (count)")]["64"][0] == "5"
    positions = body_rows(tables["ppl-1-positions"])
    assert [h for h in positions[0]][:3] == ["model", "method", "at"]
    needle = {(r["model"][0], r["method"][0]): r for r in body_rows(tables["needle-1"])}
    assert needle[("m1", "yarn(factor=2)")]["64"][0] == "—" and needle[("m1", "none")]["128"][0] == "0%"
    assert needle[("m1", "none")]["128"][1]["data-v"] == "0.0"  # a measured 0 is a value, not a missing cell


def test_sorting_script_is_inline(page):
    _, _, text = page
    script = text[text.index("<script>") : text.index("</script>")]
    assert "table.sortable" in script and "addEventListener('click'" in script and "parseFloat" in script
    assert "data-v" in script and "aria-sort" in script
    assert text.count('class="sortable') >= 7 and 'data-type="num"' in text


def test_provenance_of_every_run(page):
    rep, _, text = page
    for i, run in enumerate(rep.runs, 1):
        assert f'<details class="run" id="run-{i}">' in text and escape(run.name) in text
    assert escape(f"ctxeval ppl --model m1 --note '{HOSTILE}'") in text  # the command, escaped: never markup
    assert HOSTILE not in text
    assert "abc1234+dirty" in text and "0ld0ld0" in text and "out of memory" in text
    tables = Tables(text).tables
    methods = {r["label"][0]: r for r in body_rows(tables["run-1-methods"])}
    assert methods["none"]["RoPE read-back (max rel diff)"][0] == "6.44e-08"
    assert methods["yarn(factor=2)"]["attention factor (set / read back)"][0] == "1.069 / 1.069"
    assert methods[SELF_EXTEND]["attention methods"][0] == "self-extend(group_size=4, neighbor_window=32)"
    assert methods[SELF_EXTEND]["attention check (max abs diff)"][0].startswith("3.09e-07 (2 layers, 80 probe")
    assert "every method: geometry: rotary_dim=16, base=10000, original_length=128" in text
    assert "evaluator" in text and "torch 2.13.0+cpu" in text  # run.json's key_tokens and versions


def test_to_html_without_figures_and_write_plots_keys(page, tmp_path):
    rep, _, _ = page
    bare = to_html(rep)
    assert "<img" not in bare and 'id="ppl-1"' in bare
    images = write_plots(rep, tmp_path)
    assert {"ppl-1", "ppl-1-positions"} <= set(images)


def test_the_style_sheet_and_script_are_the_asset_files_inlined(page):
    _, _, text = page
    folder = Path(merged.__file__).parent / "assets"
    css = (folder / "report.css").read_text(encoding="utf-8")
    js = (folder / "report.js").read_text(encoding="utf-8")
    assert asset("report.css") == css and asset("report.js") == js
    assert text.count("<style>") == 1 and f"<style>\n{css}</style>" in text
    assert text.count("<script>") == 1 and f"<script>\n{js}</script>" in text
    assert "table.sortable" in css and "sortBy" in js  # the real files, not empty ones


def test_a_tune_run_s_figures_are_on_the_page(monkeypatch, tmp_path):
    """Issue 39: a report over a tune run embedded none of its figures (tune-objective, -pareto, -factors)."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    rep = merged.build_report(["results/tune-tiny-pydoc-yarn"])
    path = write_html(rep, tmp_path / "page.html")
    text = path.read_text(encoding="utf-8")
    tune = next(g for g in rep.groups if g.kind == "tune")
    for part in ("objective", "pareto", "factors"):
        match = re.search(rf'<figure id="fig-{tune.id}-{part}"><img alt="([^"]*)" src="data:image/png;base64,', text)
        assert match, part
    section = text.split(f'id="group-{tune.id}"', 1)[1].split("</section>", 1)[0]
    assert section.count("<img ") == 3  # in the tune group's own section, under its table
    assert "perplexity at the target by trial, with the best so far" in section
    assert len([attrs for tag, attrs in Tables(text).tags if tag == "img"]) == 4  # + the held-out ppl figure


def test_headings_are_short_and_the_protocol_is_each_figure_s_caption(page):
    """Issue 39: the protocol string sat in every figure's title; it is the caption's second line now."""
    rep, _, text = page
    for group in rep.groups:
        assert f"<h2>{escape(report_figures.heading(group))}</h2>" in text
        figures = re.findall(rf'<figure id="fig-{group.id}(?:-[a-z0-9-]+)?">.*?</figure>', text, re.S)
        for figure in figures:
            caption = re.search(r"<figcaption>(.*?)</figcaption>", figure, re.S).group(1)
            assert f'<span class="fig-protocol">Protocol: {escape(group.description)}.</span>' in caption
            alt = re.search(r'alt="([^"]*)"', figure).group(1)
            assert "Protocol" not in alt and len(unescape(alt)) <= report_figures.HEADING_MAX + 40
    css = asset("report.css")
    assert re.search(r"figure img \{[^}]*max-width: 100%;[^}]*height: auto;", css)  # a figure never widens the page


# The page for one committed run of every kind, as the code before the style sheet and script became files (and
# before merged.py was split) rendered it: any change of the page's bytes is a change of behaviour. Issue 39 changed
# it on purpose by two lines of the style sheet (a figure caption's width, its protocol line); figures are not part
# of it (to_html without images), nor headings (these runs' are short and stay as they were). Commit 0d8b743 (issue
# 39 item 6) changed it on purpose too: a valid length at the longest length evaluated reads '≥ L (not reached)';
# and bbf3d1b: the tiny tune run's run.json names its export directory and weights' source without a machine's path.
# Issue 53: the valid-length caption's note on `≥ L` (a lower bound also where the next length was never measured).
COMMITTED_RUNS = [
    "ppl-tiny-pydoc",
    "ppl-smollm2-austen-positions",
    "ppl-smollm2-austen-longppl",
    "needle-tiny-pydoc",
    "passkey-smollm2-filler",
    "entropy-tiny-pydoc",
    "ruler-tiny-pydoc",
    "lm-eval-tiny-examples",
    "tune-tiny-pydoc-yarn",
]
COMMITTED_PAGE_SHA256 = "aef7ab87630049e76328c1273c7d8a38edbca30e67017ea13b7cec61439bac70"


def test_the_page_of_committed_runs_is_byte_identical(monkeypatch):
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the run names are the relative paths, as on the command line
    page = to_html(merged.build_report([f"results/{name}" for name in COMMITTED_RUNS]))
    assert len(page) == 177957
    assert hashlib.sha256(page.encode("utf-8")).hexdigest() == COMMITTED_PAGE_SHA256


# -- the command -------------------------------------------------------------------------------------------------


def test_cli_html_with_and_without_out(tmp_path):
    a, n = ppl_run(tmp_path, "a"), needle_run(tmp_path, "n")
    result = cli(a, n, "--html", tmp_path / "page.html")
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stderr and "## Needle in a haystack" in result.stdout  # stdout keeps the markdown
    assert 'id="needle-1"' in (tmp_path / "page.html").read_text(encoding="utf-8")
    both = cli(a, n, "--out", tmp_path / "rep", "--html", tmp_path / "rep" / "report.html", "--format", "json")
    assert both.exit_code == 0, both.output
    written = json.loads((tmp_path / "rep" / "report.json").read_text())
    printed = json.loads(both.stdout)  # --format json printed the tables --out wrote (the file adds figure names)
    assert [[t["rows"] for t in g["tables"]] for g in printed["groups"]] == [
        [t["rows"] for t in g["tables"]] for g in written["groups"]
    ]
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert all(f'id="{g["id"]}"' in page for g in written["groups"])
    assert not list(a.glob("*.html")) and not list(a.glob("table.md"))


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("directory", "is a directory"),
        ("no parent", "does not exist"),
        ("in a run", "inside a run directory"),
        ("is --out", "is the --out"),
    ],
)
def test_cli_bad_html_path_is_one_line_exit_2(tmp_path, case, fragment):
    a = ppl_run(tmp_path, "a")
    args = {
        "directory": ["--html", tmp_path],
        "no parent": ["--html", tmp_path / "nope" / "r.html"],
        "in a run": ["--html", a / "r.html"],
        "is --out": ["--out", tmp_path / "o", "--html", tmp_path / "o"],
    }[case]
    result = cli(a, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
    assert not list(tmp_path.rglob("*.html"))


def test_cli_html_alone_writes_only_the_page(tmp_path):
    a = ppl_run(tmp_path / "runs", "a")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = cli(a, "--html", tmp_path / "page.html", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == sorted(before + [Path("page.html")])
    assert result.stderr.splitlines()[0] == f"wrote {tmp_path / 'page.html'}"


def test_cli_html_error_names_the_real_cause(tmp_path, monkeypatch):
    a = ppl_run(tmp_path, "a")
    (tmp_path / "file").write_text("x")
    deep = cli(a, "--html", tmp_path / "file" / "sub" / "r.html")  # a file where a folder should be, two levels up
    assert deep.exit_code == 2, deep.output
    assert deep.stderr.strip() == (
        f"error: --html {tmp_path / 'file' / 'sub' / 'r.html'}: {tmp_path / 'file'} is a "
        "file, not a directory; choose another path"
    )

    import ctxeval.report.html as page_module

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(page_module.tempfile, "mkstemp", refused)  # a folder this user cannot write (tests run as root)
    monkeypatch.setattr(page_module, "write_plots", lambda *a, **k: pytest.fail("the report was built first"))
    locked = cli(a, "--html", tmp_path / "r.html")
    assert locked.exit_code == 2, locked.output
    assert locked.stderr.strip() == (
        f"error: --html {tmp_path / 'r.html'}: cannot write in {tmp_path} (Permission denied); choose another path"
    )
    assert not (tmp_path / "r.html").exists()


# -- in a browser ------------------------------------------------------------------------------------------------


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        if path := shutil.which(name):
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("no chromium binary on PATH in CI: .ci/run installs it (apt-get install -y -qq chromium)")
    pytest.skip("no chromium binary (apt-get install chromium) to render the HTML report")


def headless(binary, profile, *args):
    result = subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_chromium_renders_the_page(page, tmp_path):
    binary = chromium()
    rep, path, _ = page
    url = path.resolve().as_uri()
    shot = tmp_path / "shot.png"
    headless(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,2000", url)
    from matplotlib import image as mpimg

    pixels = mpimg.imread(shot)[..., :3]  # floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1200)
    ink = (pixels < 0.92).any(axis=2)
    assert ink.mean() > 0.03, f"screenshot almost blank: {ink.mean():.1%} non-white"
    assert ink[:200].any() and ink[1000:].any()  # text at the top, content further down
    colour = (pixels.max(axis=2) - pixels.min(axis=2)) > 0.25
    assert colour.sum() > 2000  # figures' curves, links, OOM cells: not just grey text

    dom = headless(binary, tmp_path / "profile", "--dump-dom", url)
    tables = Tables(dom).tables
    assert {t.id for t in rep.tables} <= set(tables)
    assert re.search(r'<html[^>]*class="[^"]*\bjs\b', dom)  # the page's script ran
    n_sortable = len(re.findall(r'<table[^>]*class="sortable', dom))
    assert f'data-sortable-tables="{n_sortable}"' in dom and n_sortable >= len(rep.tables) + 1
    assert [[c[0] for c in row] for row in tables["ppl-1"][1:]] == rep.groups[0].tables[0].cells


CLICKS = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('ppl-1'), heads = table.tHead.rows[0].cells, col = -1;
  for (var c = 0; c < heads.length; c++) if (heads[c].textContent.trim() === '256') col = c;
  function order() {
    return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
      return r.cells[0].textContent + '/' + r.cells[1].textContent + '=' + r.cells[col].textContent; }).join('|');
  }
  var seen = [];
  for (var i = 0; i < 3; i++) { heads[col].click(); seen.push(heads[col].getAttribute('aria-sort') + ':' + order()); }
  var method = heads[1]; method.click();
  seen.push('method:' + order());
  document.body.setAttribute('data-test-sorts', JSON.stringify(seen));
  document.body.setAttribute('data-test-images', Array.prototype.map.call(document.querySelectorAll('figure img'),
    function (img) { return img.naturalWidth; }).join(','));
});
</script></body>"""


def test_clicking_a_header_sorts_numerically_missing_last(page, tmp_path):
    binary = chromium()
    _, path, text = page
    clicked = tmp_path / "clicked.html"
    clicked.write_text(text.replace("</body>", CLICKS), encoding="utf-8")
    dom = headless(binary, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom", clicked.as_uri())
    match = re.search(r'data-test-sorts="([^"]*)"', dom)
    assert match, "the injected clicks did not run"
    asc, desc, back, by_method = json.loads(unescape(match.group(1)))
    # numeric, not textual ("9.90" < "30.00"), the cells without a value last both ways, ties in the report's order
    assert asc == f"ascending:m2/yarn(factor=2)=9.90|m2/none=30.00|m1/none=—|m1/yarn(factor=2)=OOM|m1/{SELF_EXTEND}=—"
    assert desc == f"descending:m2/none=30.00|m2/yarn(factor=2)=9.90|m1/none=—|m1/yarn(factor=2)=OOM|m1/{SELF_EXTEND}=—"
    assert back == "none:m1/none=—|m1/yarn(factor=2)=OOM|m1/" + SELF_EXTEND + "=—|m2/none=30.00|m2/yarn(factor=2)=9.90"
    assert by_method.startswith("method:m1/none=—|m2/none=30.00|m1/" + SELF_EXTEND)
    widths = re.search(r'data-test-images="([^"]*)"', dom).group(1).split(",")
    assert len(widths) == 5 and all(int(w) > 300 for w in widths)  # every embedded PNG decoded


ENLARGE = """<script>
window.addEventListener('load', function () {
  var img = document.querySelector('figure img'), box = document.getElementById('lightbox'), seen = {};
  seen.natural = img.naturalWidth; seen.shown = img.offsetWidth;
  seen.figureScrolls = img.parentNode.scrollWidth > img.parentNode.clientWidth;
  img.click();
  var big = box.querySelector('img');
  seen.open = !box.hidden && getComputedStyle(box).display !== 'none' && getComputedStyle(box).position === 'fixed';
  seen.sameImage = big.src === img.src; seen.bigWidth = big.clientWidth;
  seen.caption = box.querySelector('p').textContent === img.parentNode.querySelector('figcaption').textContent;
  document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}));
  seen.closedByEscape = box.hidden && getComputedStyle(box).display === 'none';
  img.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
  seen.openedByEnter = !box.hidden;
  box.click();
  seen.closedByClick = box.hidden;
  document.body.setAttribute('data-test-enlarge', JSON.stringify(seen));
});
</script></body>"""


def test_a_figure_never_shrinks_unreadably_and_a_click_enlarges_it(page, tmp_path):
    """Issue 26: wide heatmap grids shrank with the page until unreadable. In a window far narrower than the figure
    it keeps 3/4 of its size (the figure scrolls sideways); a click shows it at full size over the page."""
    binary = chromium()
    _, path, text = page
    clicked = tmp_path / "enlarge.html"
    clicked.write_text(text.replace("</body>", ENLARGE), encoding="utf-8")
    dom = headless(
        binary,
        tmp_path / "profile",
        "--window-size=500,900",
        "--virtual-time-budget=5000",
        "--dump-dom",
        clicked.as_uri(),
    )
    match = re.search(r'data-test-enlarge="([^"]*)"', dom)
    assert match, "the injected clicks did not run"
    seen = json.loads(unescape(match.group(1)))
    assert seen["natural"] > 700 and seen["shown"] >= 0.75 * seen["natural"] - 1 and seen["figureScrolls"], seen
    assert seen["open"] and seen["sameImage"] and seen["caption"], seen
    assert seen["bigWidth"] == seen["natural"], seen  # full size, not fitted to the 500-pixel window
    assert seen["closedByEscape"] and seen["openedByEnter"] and seen["closedByClick"], seen


FITS = """<script>
window.addEventListener('load', function () {
  var main = document.querySelector('main'), style = getComputedStyle(main), seen = [];
  var right = main.getBoundingClientRect().right - parseFloat(style.paddingRight);
  Array.prototype.forEach.call(document.querySelectorAll('figure'), function (figure) {
    var img = figure.querySelector('img');
    seen.push({id: figure.id, natural: img.naturalWidth, shown: img.clientWidth,
               right: img.getBoundingClientRect().right, column: right,
               scrolls: figure.scrollWidth > figure.clientWidth});
  });
  document.body.setAttribute('data-test-fits', JSON.stringify({
    page: document.documentElement.scrollWidth, window: window.innerWidth, figures: seen}));
});
</script></body>"""


def test_a_four_method_needle_grid_fits_the_page_at_1400_px(tmp_path):
    """Issue 39: at a 1400 px window the 4-method needle figure (four panels side by side, 2,256 px) overflowed the
    page's column: it had to be scrolled sideways. The panels now wrap into rows: every figure shows whole, at its
    own size."""
    binary = chromium()
    runs = [
        needle_run(
            tmp_path,
            "n4",
            acc={
                label: {128: 1, 256: 0, 512: 1, 1024: 0}
                for label in ("none", "pi(factor=4)", "yarn(factor=4)", "yarn(beta_fast=4,beta_slow=0.25,factor=4)")
            },
            depths=(0.0, 25.0, 50.0, 75.0, 100.0),
        ),
        needle_run(tmp_path, "k", task="passkey", samples=5, haystack="filler", acc={"none": {128: 1, 256: 0}}),
    ]
    page = write_html(merged.build_report(runs), tmp_path / "page.html")
    probe = tmp_path / "fits.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", FITS), encoding="utf-8")
    dom = headless(
        binary,
        tmp_path / "profile",
        "--window-size=1400,2000",
        "--virtual-time-budget=5000",
        "--dump-dom",
        probe.as_uri(),
    )
    match = re.search(r'data-test-fits="([^"]*)"', dom)
    assert match, "the injected probe did not run"
    seen = json.loads(unescape(match.group(1)))
    assert seen["page"] <= seen["window"], seen  # nothing widens the page
    assert [f["id"] for f in seen["figures"]] == ["fig-needle-1", "fig-passkey-1"]
    for figure in seen["figures"]:
        assert not figure["scrolls"] and figure["right"] <= figure["column"] + 1, figure
        assert figure["shown"] == figure["natural"], figure  # at its own size: not shrunk to fit either
    shot = tmp_path / "shot.png"
    headless(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,2000", page.as_uri())
    keep = os.environ.get("CTXEVAL_KEEP_SCREENSHOT")  # a person may look at it: CTXEVAL_KEEP_SCREENSHOT=/tmp/x.png
    if keep:
        shutil.copyfile(shot, keep)
