#!/usr/bin/env python3
"""Checks that the names the documentation uses exist in the code.

Scans README.md and docs/**/*.md for
  - qualified names `reco::a::b`: every component must be an identifier of include/ or adapters/
    (or a CMake target of the project);
  - header paths `reco/....hpp|.cuh|.h`: the file must exist under include/ or adapters/*/include/;
  - result fields `x.stats.field` / `stats.field`: the field must be an identifier of the result
    and statistics headers.
Prints every mismatch as file:line and exits 1 if there is one.
Usage: check_doc_names.py <repository root>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
code_suffixes = {".hpp", ".cuh", ".h", ".cpp", ".cu", ".py", ".cmake", ".txt"}


def code_files(*dirs):
    for d in dirs:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and p.suffix in code_suffixes and (p.suffix != ".txt" or p.name == "CMakeLists.txt"):
                yield p


def identifiers(paths):
    """Identifiers of the code proper: #include lines and comments are left out, so a header's
    file name or a name mentioned in passing does not count as a definition."""
    out = set()
    for p in paths:
        text = p.read_text(encoding="utf-8", errors="replace")
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"^\s*#\s*include.*$", " ", text, flags=re.M)
        text = re.sub(r"//.*$", " ", text, flags=re.M)
        if p.suffix in (".py", ".cmake", ".txt"):
            text = re.sub(r"#.*$", " ", text, flags=re.M)
        out.update(re.findall(r"[A-Za-z_]\w*", text))
    return out


# CMake targets (reco::core, reco::cpu, ...) count as names too.
code_ids = identifiers(list(code_files("include", "adapters", "cmake")) + [root / "CMakeLists.txt"])
stats_ids = identifiers([root / "include/reco/result.hpp"] +
                        list((root / "adapters/torch/include/reco/torch").glob("*.hpp")))
# Headers a page asks the reader to create (its worked example), not part of the library.
example_headers = {"reco/clip/log_clip.hpp"}  # docs/extending.md
header_roots = [root / "include"] + [p for p in (root / "adapters").glob("*/include")]

qualified = re.compile(r"\breco::((?:\w+::)*\w+)")
header = re.compile(r"\breco/[\w/]+\.(?:hpp|cuh|h)\b")
stats_field = re.compile(r"(?<![\w.])(?:\w+\.)*stats\.(\w+)")

docs = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
problems = []
for doc in docs:
    rel = doc.relative_to(root)
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for m in qualified.finditer(line):
            missing = [part for part in m.group(1).split("::") if part not in code_ids]
            if missing:
                problems.append(f"{rel}:{number}: reco::{m.group(1)}: no {', '.join(missing)} in include/ or adapters/")
        for m in header.finditer(line):
            if m.group(0) not in example_headers and not any((r / m.group(0)).is_file() for r in header_roots):
                problems.append(f"{rel}:{number}: header {m.group(0)} does not exist")
        for m in stats_field.finditer(line):
            if m.group(0).startswith("scipy.") or line[m.end():].startswith("("):
                continue  # scipy.stats, or a method call on a stats tensor (Python)
            if m.group(1) not in stats_ids:
                problems.append(f"{rel}:{number}: {m.group(0)}: no field {m.group(1)} in the result headers")

for p in problems:
    print(p)
print(f"checked {len(docs)} documents: {len(problems)} unknown name(s)")
sys.exit(1 if problems else 0)
