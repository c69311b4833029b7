"""The documentation's links: every relative link in README.md and docs/*.md names a file (or folder) of the
repository, and every #anchor into a markdown page names one of its headings."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")  # [text](target); the target holds no space or parenthesis
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's ids of a page's headings: lower case, punctuation dropped, spaces as '-', repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: `a[i](x)` is no link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, mailto: ...


def test_the_pages_are_there():
    assert len(PAGES) >= 19 and (REPO / "docs" / "install.md") in PAGES


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page: `one` (two)\n\n[x](missing.md) [y](#a-page-one-two) [z](#nowhere) [w](https://x.org/a)\n"
    )
    assert links(page) == ["missing.md", "#a-page-one-two", "#nowhere"]
    assert anchors(page) == {"a-page-one-two"}


def layout_tree() -> dict[str, set[str]]:
    """docs/development.md's layout: folder (relative to ctxeval/) -> the module names its line lists."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("## Code layout", 1)[1].split("```", 2)[1]
    tree: dict[str, set[str]] = {}
    parents: list[str] = []
    for line in block.splitlines():
        entry = re.match(r"^(\s+)([\w]+)/\s+(.*)$", line)
        if not entry:
            continue
        depth = (len(entry.group(1)) - 2) // 2
        parents = parents[:depth] + [entry.group(2)]
        names = re.split(r"\s{2,}", entry.group(3).strip())[0]
        tree["/".join(parents)] = set(re.sub(r"\(.*?\)", "", names).split())
    return tree


def test_the_layout_in_development_md_matches_the_tree():
    tree = layout_tree()
    package = REPO / "ctxeval"
    folders = {
        str(p.relative_to(package))
        for p in package.rglob("*")
        if p.is_dir() and p.name != "__pycache__" and p.relative_to(package).parts[:1] != ("tiny",)
    } | {"tiny"}  # tiny's folders (model/, family/NAME/) hold weights, not code; its line names them in prose
    assert set(tree) == folders, sorted(set(tree) ^ folders)
    for folder, listed in tree.items():
        if folder == "tiny" or folder.endswith("assets"):
            continue  # tiny's line names its __main__ and model/ in prose; assets hold data files
        modules = {p.stem for p in (package / folder).glob("*.py") if p.stem != "__init__"}
        assert listed == modules, (folder, sorted(listed ^ modules))
