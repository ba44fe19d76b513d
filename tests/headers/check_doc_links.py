#!/usr/bin/env python3
"""Checks that the documentation's relative links resolve and that it stands alone.

Scans the repository's top-level *.md files and docs/**/*.md for Markdown links `[text](target)`
outside code (fenced blocks and inline code):
  - a relative target must name an existing file or directory, resolved from the linking file;
  - a `#fragment` (on a .md target or alone) must be the GitHub anchor of a heading of that page;
and for any mention of the project's private working files (`../shared/`, the specs), which a
reader of the repository does not have. Web links (http, https, mailto) are not fetched.
Prints every problem as file:line and exits 1 if there is one.
Usage: check_doc_links.py <repository root>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
docs = sorted(root.glob("*.md")) + sorted((root / "docs").rglob("*.md"))

link = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
inline_code = re.compile(r"(`+).*?\1")
private = re.compile(r"\.\./shared/|/work/shared|\bshared/(?:spec|paper)/")


def unfenced_lines(text):
    """(line number, line) pairs outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if fence:
            if marker and stripped.startswith(fence):
                fence = None
            continue
        if marker:
            fence = marker.group(1)
            continue
        yield number, line


def prose_lines(text):
    """Lines outside fenced code with inline code blanked out (links inside code are not links)."""
    for number, line in unfenced_lines(text):
        yield number, inline_code.sub("", line)


def github_anchor(heading):
    """GitHub's anchor of a heading: links reduced to their text, lower case, every character but
    letters, digits, '_', '-' and spaces dropped, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


anchor_cache = {}


def page_anchors(page):
    if page not in anchor_cache:
        seen = {}
        found = set()
        # Headings keep their inline code: its text is part of the anchor.
        for _, line in unfenced_lines(page.read_text(encoding="utf-8")):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            base = github_anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[page] = found
    return anchor_cache[page]


problems = []
checked = 0
for doc in docs:
    rel = doc.relative_to(root)
    text = doc.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if private.search(line):
            problems.append(f"{rel}:{number}: cites the project's private files (../shared, the specs)")
    for number, line in prose_lines(text):
        for m in link.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            checked += 1
            path_part, _, fragment = target.partition("#")
            page = (doc.parent / path_part).resolve() if path_part else doc
            if not page.exists():
                problems.append(f"{rel}:{number}: {target}: no such file")
                continue
            if fragment and page.suffix == ".md" and fragment not in page_anchors(page):
                problems.append(f"{rel}:{number}: {target}: no heading with anchor #{fragment}")

for p in problems:
    print(p)
print(f"checked {checked} links in {len(docs)} documents: {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
