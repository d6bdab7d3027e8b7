"""Every relative link in the project's Markdown resolves: the file it names exists, and its ``#anchor``,
if any, is a heading of that file (GitHub's heading ids).

    python tools/check_doc_links.py                  # README.md and docs/**/*.md
    python tools/check_doc_links.py docs/models      # files or directories

Links inside fenced code blocks and inline code are not links. Absolute URLs (``http:``, ``mailto:``...)
are not checked. Prints one line per broken link, ``FILE:LINE: target: why``, and exits 1 if any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ("README.md", "docs")

#: [text](target) or ![alt](target), the target up to whitespace or ")"; an optional "title" after it
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.rglob("*.md")))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return out


def prose_lines(text: str, blank_code: bool = True):
    """(line number, line) for every line outside fenced code blocks, its inline code blanked unless
    ``blank_code`` is False."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line) if blank_code else line


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text without markup, lowercased, punctuation dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _n, line in prose_lines(path.read_text(encoding="utf-8"), blank_code=False):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def broken_links(path: Path) -> list[tuple[int, str, str]]:
    """(line, target, why) for each relative link of ``path`` that does not resolve."""
    problems = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            target = m.group(1)
            if SCHEME.match(target):
                continue
            name, _, anchor = target.partition("#")
            dest = path if not name else (path.parent / name)
            if not dest.exists():
                problems.append((n, target, "no such file"))
                continue
            if anchor and dest.suffix == ".md" and dest.is_file() and anchor not in anchors(dest):
                problems.append((n, target, f"no heading #{anchor} in {dest.name}"))
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", type=Path, help="Markdown files or directories (default: README.md and docs/)")
    args = p.parse_args(argv)
    paths = args.paths or [ROOT / d for d in DEFAULT if (ROOT / d).exists()]
    bad = 0
    files = markdown_files(paths)
    for f in files:
        for n, target, why in broken_links(f):
            print(f"{f}:{n}: {target}: {why}")
            bad += 1
    print(f"{len(files)} files, {bad} broken links", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
