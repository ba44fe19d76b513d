#!/usr/bin/env python3
"""Turns the JSON files of run_gpu_benchmarks.sh into the markdown tables of docs/benchmarks.md.

  python3 benchmarks/cuda/summarize_gpu_benchmarks.py <results dir>   # writes <dir>/summary.md

Reads objective_cuda.json (Google Benchmark), objective_torch_cuda.json (optional), liger.json
(optional) and environment.txt from the directory. Every number printed comes from those files.
"""
import json
import os
import re
import sys


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def counters(bench):
    """name -> the benchmark's counters (iteration runs only)."""
    out = {}
    for b in bench.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        out[b["name"].split("/manual_time")[0].split("/iterations:")[0]] = b
    return out


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def objective_tables(c):
    lines = []
    pat = re.compile(r"^objective/(fused|generic)/([a-z0-9_]+)/(kl|nokl)/N:(\d+)$")
    rows = {}
    for name, b in c.items():
        m = pat.match(name)
        if m:
            impl, preset, kl, n = m.groups()
            rows.setdefault((preset, kl, int(n)), {})[impl] = b
    lines.append("| preset | KL | N | fused median µs (min–max) | GB/s | vs copy | generic median µs | "
                 "generic/fused | graph µs | kernels |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (preset, kl, n) in sorted(rows):
        f, g = rows[(preset, kl, n)].get("fused"), rows[(preset, kl, n)].get("generic")
        if f is None:
            continue
        ratio = g["median_us"] / f["median_us"] if g else None
        lines.append(
            f"| {preset} | {kl} | {n} | {fmt(f['median_us'])} ({fmt(f['min_us'])}–{fmt(f['max_us'])}) | "
            f"{fmt(f['GB/s'])} | {fmt(f['vs_copy'], 2)} | {fmt(g['median_us']) if g else '–'} | {fmt(ratio, 2)} | "
            f"{fmt(f.get('graph_median_us'))} | {fmt(f.get('kernels'), 0)} |")
    lines.append("")
    pat = re.compile(r"^objective_presets/(fused|generic)/([a-z0-9_]+)/N:(\d+)$")
    rows = {}
    for name, b in c.items():
        m = pat.match(name)
        if m:
            impl, preset, n = m.groups()
            rows.setdefault(preset, {})[impl] = b
    if rows:
        lines.append("| preset (N = 1,048,576) | fused median µs | GB/s | vs copy | generic median µs | generic/fused |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for preset in sorted(rows):
            f, g = rows[preset].get("fused"), rows[preset].get("generic")
            if f is None:
                continue
            lines.append(f"| {preset} | {fmt(f['median_us'])} | {fmt(f['GB/s'])} | {fmt(f['vs_copy'], 2)} | "
                         f"{fmt(g['median_us']) if g else '–'} | {fmt(g['median_us'] / f['median_us'], 2) if g else '–'} |")
        lines.append("")
    return lines


def torch_table(c):
    pat = re.compile(r"^objective_torch/(torch_eager|reco_fused)/([a-z0-9_]+)/N:(\d+)$")
    rows = {}
    for name, b in c.items():
        m = pat.match(name)
        if m:
            impl, preset, n = m.groups()
            rows.setdefault((preset, int(n)), {})[impl] = b
    lines = ["| preset | N (valid tokens) | LibTorch eager median µs | reco fused median µs | eager/reco |",
             "|---|---:|---:|---:|---:|"]
    for key in sorted(rows):
        t, r = rows[key].get("torch_eager"), rows[key].get("reco_fused")
        if t is None or r is None:
            continue
        lines.append(f"| {key[0]} | {int(r['valid_tokens'])} | {fmt(t['median_us'])} | {fmt(r['median_us'])} | "
                     f"{fmt(t['median_us'] / r['median_us'], 1)} |")
    lines.append("")
    return lines


def liger_table(d):
    lines = [f"Liger-Kernel {d.get('liger')}, torch {d.get('torch')}.", "",
             "| B | L | V | Liger grpo_loss median ms | reco median ms | Liger/reco |", "|---:|---:|---:|---:|---:|---:|"]
    for s in d.get("shapes", []):
        li = s.get("liger")
        lines.append(f"| {s['B']} | {s['L']} | {s['V']} | {fmt(li['median_ms'], 3) if li else '–'} | "
                     f"{fmt(s['reco']['median_ms'], 3)} | {fmt(s.get('liger_over_reco'), 2)} |")
    lines.append("")
    return lines


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    out = ["# GPU benchmark results", ""]
    env = os.path.join(d, "environment.txt")
    if os.path.exists(env):
        out += ["```", open(env).read().rstrip(), "```", ""]
    obj = load(os.path.join(d, "objective_cuda.json"))
    if obj:
        out += ["## Per-token objective: fused vs generic CUDA path", ""] + objective_tables(counters(obj))
    tor = load(os.path.join(d, "objective_torch_cuda.json"))
    if tor:
        out += ["## LibTorch eager composites vs reco (same padded tensors, same binary)", ""] + torch_table(counters(tor))
    lig = load(os.path.join(d, "liger.json"))
    if lig:
        out += ["## Liger-Kernel Triton grpo_loss vs reco logits + objective (same process)", ""] + liger_table(lig)
    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print(os.path.join(d, "summary.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
