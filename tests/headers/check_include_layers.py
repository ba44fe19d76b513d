#!/usr/bin/env python3
"""Checks the include graph's layers (docs/design.md): no header of the core (include/reco/*.hpp,
the components' directories, reco/detail/) or of reco/algorithm/ includes a header of
reco/backend/cpu/, reco/backend/cuda.cuh, reco/fused/ or reco/step_plan/ (reco/step_plan.hpp
included), directly or through the headers it includes; reco/reco.hpp, the umbrella of every
host header, is left out. Prints each offending chain and exits 1 if there is one.
Usage: check_include_layers.py <repository root>
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
inc = root / "include"
upper = ("reco/backend/cpu/", "reco/backend/cpu.hpp", "reco/backend/cuda.cuh", "reco/fused/", "reco/step_plan/",
         "reco/step_plan.hpp")
umbrellas = {"reco/reco.hpp"}


def name(p):
    return p.relative_to(inc).as_posix()


def lower(n):
    if n in umbrellas or n.startswith(upper):
        return False
    top = n.split("/")
    return len(top) == 2 or top[1] not in ("backend", "fused", "step_plan", "eval", "logits", "batch_ops")


graph = {}
for p in inc.rglob("*"):
    if p.suffix in (".hpp", ".cuh", ".h"):
        graph[name(p)] = re.findall(r'^\s*#\s*include\s+"(reco/[^"]+)"', p.read_text(encoding="utf-8"), re.M)

bad = 0
for start in sorted(n for n in graph if lower(n)):
    seen, stack = {start: None}, [start]
    while stack:
        n = stack.pop()
        for d in graph.get(n, []):
            if d in seen:
                continue
            seen[d] = n
            if d.startswith(upper):
                chain, x = [d], n
                while x is not None:
                    chain.append(x)
                    x = seen[x]
                print(" -> ".join(reversed(chain)))
                bad += 1
            else:
                stack.append(d)
if bad == 0:
    print(f"{sum(1 for n in graph if lower(n))} core and algorithm headers include no backend, fused or plan header")
sys.exit(1 if bad else 0)
