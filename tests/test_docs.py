"""Every relative link in README.md and docs/*.md points to a file or folder that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target); the target ends at the first space (an optional "title" follows) or ")".
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def relative_links(text: str) -> list[str]:
    """The link targets of a markdown text that name a local path, without their #fragment."""
    text = FENCE.sub("", text)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)  # nor does inline code
    targets = []
    for target in LINK.findall(text):
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def broken_links(page: Path) -> list[str]:
    return [t for t in relative_links(page.read_text(encoding="utf-8")) if not (page.parent / t).exists()]


def test_the_pages_exist_and_have_links():
    assert (ROOT / "docs").is_dir() and len(PAGES) > 1
    assert relative_links((ROOT / "README.md").read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} links to missing paths"


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](../there.md#part) ![ok](../docs) [web](https://example.org/x) [anchor](#here) [mail](mailto:a@b.c)\n"
        "`[not a link](nowhere.md)`\n```\n[not a link](nowhere.md)\n```\n"
        '[broken](there.md) ![broken picture](images/missing.png "title")\n'
    )
    assert broken_links(page) == ["there.md", "images/missing.png"]
