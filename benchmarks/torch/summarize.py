"""Markdown tables of eager/reco ratios from reco_bench_torch_cpu's JSON output.

    reco_bench_torch_cpu --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out=run.json --benchmark_out_format=json
    python3 summarize.py run.json [cpu|real]

Each row pairs ".../reco/..." with ".../eager/..." of the same shape and reports the medians
over the repetitions and eager / reco (higher is better for reco). "cpu" (default) uses CPU time,
which is what a single-threaded run on a shared machine measures reliably; "real" uses wall time.
"""
import json
import sys


def medians(path, clock):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b.get("run_name", b["name"]).replace("/min_time:0.500", "").replace("/min_time:1.000", "")
        name = name.replace("/real_time", "")
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        out[name] = b[clock + "_time"] * scale  # milliseconds
    return out


def fmt_ms(ms):
    return f"{ms * 1e3:.0f} µs" if ms < 1 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def main():
    path = sys.argv[1]
    clock = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    t = medians(path, clock)
    print("| benchmark | shape | reco | eager | eager / reco |")
    print("|---|---|---|---|---|")
    def order(name):
        parts = name.split("/")
        return [int(p) if p.isdigit() else p for p in parts]

    for name in sorted(t, key=order):
        parts = name.split("/")
        k = 2 if parts[0] == "objective" else 3  # objective/<preset>/<impl>/N, logits/<dt>/<pass>/<impl>/N/V
        if len(parts) <= k or parts[k] != "reco":
            continue
        other = "/".join(parts[:k] + ["eager"] + parts[k + 1:])
        if other not in t:
            continue
        label = "/".join(parts[:k])
        shape = f"N = {int(parts[k + 1]):,}" + (f", V = {int(parts[k + 2]):,}" if len(parts) > k + 2 else "")
        print(f"| {label} | {shape} | {fmt_ms(t[name])} | {fmt_ms(t[other])} | {t[other] / t[name]:.1f}x |")


if __name__ == "__main__":
    main()
