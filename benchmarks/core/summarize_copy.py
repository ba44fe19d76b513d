"""Markdown table of each preset's fraction of copy bandwidth from reco_bench_objective_cpu's JSON.

    OMP_NUM_THREADS=1 reco_bench_objective_cpu --benchmark_filter='copy_cpu|packed/(4194304|16777216)' \
        --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out=run.json --benchmark_out_format=json
    python3 summarize_copy.py run.json [run2.json ...]

Pairs "objective_cpu/<preset>/packed/<N>" with "copy_cpu/<preset>/<N>" (the same compulsory bytes
moved by memcpy, same thread count) and reports the medians of wall time over the repetitions and
copy / objective: the fraction of copy bandwidth the preset reaches (1 = at the machine's limit).
With one thread the same fraction from CPU time is printed too (the calling thread's CPU time
leaves out the time a shared machine takes the core away; with more threads it counts only the
calling thread, so it is left blank).

    python3 summarize_copy.py --before before.json after.json

compares two builds measured back to back on the same thread count: each one's objective time
and fraction of its own copy row, after / before, and the "no diagnostics" row of the second.
"""
import json
import sys


def medians(path):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b.get("run_name", b["name"]).replace("/real_time", "")
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        out[name] = (b["real_time"] * scale, b.get("bytes", 0.0), int(b.get("threads", 1)), b["cpu_time"] * scale)
    return out


def main(paths):
    print("| preset | N tokens | threads | compulsory bytes | objective | copy | copy / objective | same, CPU time | objective GB/s | copy GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        m = medians(path)
        order = ["grpo", "reco", "dapo", "rule_80_20"]
        rows = [n.split("/") for n in m if n.startswith("objective_cpu/") and n.split("/")[2] == "packed"]
        rows.sort(key=lambda p: (order.index(p[1]) if p[1] in order else len(order), p[1], int(p[3])))
        for parts in rows:
            t_obj, nbytes, threads, c_obj = m["/".join(parts)]
            copy = m.get(f"copy_cpu/{parts[1]}/{parts[3]}")
            if copy is None:
                continue
            t_copy = copy[0]
            cpu = f"{copy[3] / c_obj:.3f}" if threads == 1 else "—"
            print(f"| {parts[1]} | {int(parts[3]):,} | {threads} | {nbytes / 1e6:.1f} MB | {t_obj:.1f} ms | "
                  f"{t_copy:.2f} ms | {t_copy / t_obj:.3f} | {cpu} | {nbytes / t_obj / 1e6:.2f} | {copy[1] / t_copy / 1e6:.1f} |")


def compare(before_path, after_path):
    b, a = medians(before_path), medians(after_path)
    print("| preset | N tokens | threads | copy | before | after | fraction before | **fraction after** | speed-up | "
          "no diagnostics, after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = ["grpo", "reco", "dapo", "rule_80_20", "clip_cov", "kl_cov"]
    rows = [n.split("/") for n in a if n.startswith("objective_cpu/") and n.split("/")[2] == "packed"]
    rows.sort(key=lambda p: (order.index(p[1]) if p[1] in order else len(order), p[1], int(p[3])))
    for parts in rows:
        name, preset, n = "/".join(parts), parts[1], parts[3]
        if name not in b:
            continue
        t_a, t_b, threads = a[name][0], b[name][0], a[name][2]
        c_a, c_b = a.get(f"copy_cpu/{preset}/{n}"), b.get(f"copy_cpu/{preset}/{n}")
        if c_a is None or c_b is None:
            continue

        def opt(m, kind):
            x = m.get(f"objective_cpu/{preset}/{kind}/{n}")
            return f"{x[0]:.1f} ms" if x else "—"

        print(f"| {preset} | {int(n):,} | {threads} | {c_a[0]:.2f} ms | {t_b:.1f} ms | {t_a:.1f} ms | "
              f"{c_b[0] / t_b:.3f} | **{c_a[0] / t_a:.3f}** | {t_b / t_a:.2f}× | {opt(a, 'packed_no_diagnostics')} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--before":
        compare(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1:])
