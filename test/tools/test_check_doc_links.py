"""tools/check_doc_links.py: every relative link in README.md and docs/ resolves, to a file and, with an
#anchor, to a heading of it; code is not a link; absolute URLs are not checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location("check_doc_links", ROOT / "tools" / "check_doc_links.py")
check_doc_links = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_doc_links)


def test_the_projects_docs_have_no_broken_link(capsys):
    assert check_doc_links.main([]) == 0, capsys.readouterr().out


def test_broken_files_and_anchors_are_found_and_code_is_not_a_link(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# Figures: today's `bench` (v2)\n\n## Figures: today's `bench` (v2)\n")
    (tmp_path / "fig.png").write_bytes(b"")
    page = tmp_path / "a.md"
    page.write_text(
        "# A page\n"
        "[ok](sub/b.md) [ok](fig.png) ![ok](./fig.png) [ok](sub/b.md#figures-todays-bench-v2)\n"
        "[ok](sub/b.md#figures-todays-bench-v2-1) [ok](#a-page) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [bad anchor](sub/b.md#nowhere) [bad here](#nope)\n"
        "`[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
    )
    assert check_doc_links.broken_links(page) == [
        (4, "missing.md", "no such file"),
        (4, "sub/b.md#nowhere", "no heading #nowhere in b.md"),
        (4, "#nope", "no heading #nope in a.md"),
    ]
    assert check_doc_links.main([str(page)]) == 1
    assert check_doc_links.main([str(tmp_path / "sub")]) == 0
