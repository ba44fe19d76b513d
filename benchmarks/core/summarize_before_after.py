"""Markdown table of two builds of reco_bench_objective_cpu run side by side (same machine, same
session, same thread count): each preset's time and fraction of copy bandwidth before and after.

    for b in before after; do
      OMP_NUM_THREADS=1 build-$b/benchmarks/core/reco_bench_objective_cpu \\
          --benchmark_filter='copy_cpu|packed(_no_diagnostics|_f64)?/(4194304|16777216)' \\
          --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \\
          --benchmark_out=$b.json --benchmark_out_format=json
    done
    python3 summarize_before_after.py before.json after.json

Medians of wall time, or of the calling thread's CPU time with a third argument "cpu_time" (one
thread: it leaves out the time a loaded machine takes the core away). "fraction" = copy / objective, each build's objective against its own run's
copy of the same compulsory bytes (1 = the machine's limit); "no diagnostics" is the after build's
call with reco::cpu::diagnostics = false; "f64" the same call on the batch in double.
"""
import json
import sys


def medians(path, field):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b.get("run_name", b["name"]).replace("/real_time", "")
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        out[name] = b[field] * scale
    threads = int(data["benchmarks"][0].get("threads", 1)) if data["benchmarks"] else 1
    return out, threads


def cell(m, name):
    return m.get(name)


def main(before_path, after_path, field="real_time"):
    before, threads = medians(before_path, field)
    after, _ = medians(after_path, field)
    order = ["grpo", "reco", "dapo", "rule_80_20", "clip_cov", "kl_cov"]
    keys = sorted({(n.split("/")[1], int(n.split("/")[3])) for n in after
                   if n.startswith("objective_cpu/") and n.split("/")[2] == "packed"},
                  key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[0], k[1]))
    print("| preset | N | threads | copy (before / after run) | before | fraction | after | **fraction** "
          "| after, no diagnostics | fraction | f64 before | f64 after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset, n in keys:
        cb, ca = before.get(f"copy_cpu/{preset}/{n}"), after.get(f"copy_cpu/{preset}/{n}")
        tb, ta = before.get(f"objective_cpu/{preset}/packed/{n}"), after.get(f"objective_cpu/{preset}/packed/{n}")
        tn = after.get(f"objective_cpu/{preset}/packed_no_diagnostics/{n}")
        fb, fa = before.get(f"objective_cpu/{preset}/packed_f64/{n}"), after.get(f"objective_cpu/{preset}/packed_f64/{n}")
        if None in (cb, ca, tb, ta):
            continue
        ms = lambda x: f"{x:.1f} ms" if x is not None else "—"
        fr = lambda c, t: f"{c / t:.3f}" if t else "—"
        print(f"| {preset} | {n:,} | {threads} | {cb:.2f} / {ca:.2f} ms | {ms(tb)} | {fr(cb, tb)} | {ms(ta)} | "
              f"**{fr(ca, ta)}** | {ms(tn)} | {fr(ca, tn) if tn else '—'} | {ms(fb)} | {ms(fa)} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[3:4])
