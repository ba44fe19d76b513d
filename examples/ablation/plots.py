#!/usr/bin/env python3
"""Draws the ablation study's figures from the CSV files reco_ablation wrote.

    python3 plots.py RESULTS_DIR

Reads pass_at_k.csv, pass_at_k_runs.csv, delta_vs_grpo.csv, training_dynamics.csv,
token_variance.csv and base_likelihood_kde.csv; writes PNG files under RESULTS_DIR/plots/. Needs matplotlib only (no numpy code of its own).
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "base": ("Base", "#555555", "--"),
    "grpo": ("GRPO", "#d62728", "-"),
    "reco": ("ReCo", "#1f77b4", "-"),
}
OTHERS = ["aspo", "response_only", "token_only", "reco_no_cap", "dapo", "dapo_reco", "rule_80_20", "rule_80_20_reco"]
SUBSET_TITLE = {
    "all": "all held-out problems",
    "common_only": "common_only (+,* suffice)",
    "both": "both (+,* or -,/)",
    "rare_only": "rare_only (need - or /)",
}


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fnum(x):
    return float(x) if x not in ("", "nan") else float("nan")


def label_of(rows, config):
    for r in rows:
        if r["config"] == config and r.get("label"):
            return r["label"]
    return STYLE.get(config, (config,))[0]


def k_axis(ax, ks):
    """A log2 k axis labelled with the k values themselves (1, 2, 4, ..., 256)."""
    ax.set_xscale("log", base=2)
    ks = sorted(set(ks))
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("k")


def pass_at_k(out, plots):
    rows = read(os.path.join(out, "pass_at_k.csv"))
    subsets = [s for s in ["all", "common_only", "both", "rare_only"] if any(r["subset"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(subsets), figsize=(4.2 * len(subsets), 3.8), squeeze=False)
    for ax, sub in zip(axes[0], subsets):
        for config in ["base", "grpo", "reco"]:
            pts = [r for r in rows if r["config"] == config and r["subset"] == sub]
            if not pts:
                continue
            ks = [int(r["k"]) for r in pts]
            m = [100 * fnum(r["mean"]) for r in pts]
            s = [100 * fnum(r["std"]) for r in pts]
            name, color, ls = STYLE[config]
            ax.plot(ks, m, ls, color=color, marker="o", ms=3, label=name)
            if config != "base":
                ax.fill_between(ks, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=color, alpha=0.15)
        k_axis(ax, [int(r["k"]) for r in rows if r["subset"] == sub])
        ax.set_ylabel("Pass@k (%)")
        ax.set_title(SUBSET_TITLE.get(sub, sub), fontsize=10)
        ax.grid(alpha=0.3)
    legend(axes[0][0], loc="lower right")
    fig.suptitle("Pass@k on held-out problems (mean ± std over runs: base policies × seeds)")
    save(fig, plots, "pass_at_k.png")

    # Every configuration, all problems.
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    # Colours distinct from Base/GRPO/ReCo; "+ ReCo" variants dashed next to their base method.
    palette = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#000000"]
    configs = ["base", "grpo", "reco"] + OTHERS
    for i, config in enumerate(configs):
        pts = [r for r in rows if r["config"] == config and r["subset"] == "all"]
        if not pts:
            continue
        name = label_of(rows, config)
        if config in STYLE:
            color, ls, marker = STYLE[config][1], STYLE[config][2], "o"
        else:
            j = OTHERS.index(config)
            color, ls, marker = palette[j % len(palette)], ("--" if config.endswith("reco") else ":"), "s^vD<>px"[j]
        ax.plot([int(r["k"]) for r in pts], [100 * fnum(r["mean"]) for r in pts], ls, color=color, marker=marker,
                ms=4, label=name)
    k_axis(ax, [int(r["k"]) for r in rows if r["subset"] == "all"])
    ax.set_ylabel("Pass@k (%), all held-out problems")
    ax.set_title("Pass@k of every configuration (mean over seeds)")
    ax.grid(alpha=0.3)
    legend(ax, fontsize=8, ncol=2, loc="lower right")
    save(fig, plots, "pass_at_k_all_configs.png")


def delta_vs_grpo(out, plots):
    """Δ Pass@k against GRPO by k, with the hierarchical-bootstrap 95 % intervals."""
    rows = read_optional(out, "delta_vs_grpo.csv")
    if rows is None:
        return
    subsets = [s for s in ["all", "rare_only"] if any(r["subset"] == s for r in rows)]
    if not subsets:
        return
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#555555",
               "#000000"]
    configs = []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
    fig, axes = plt.subplots(1, len(subsets), figsize=(6.5 * len(subsets), 4.4), squeeze=False)
    for ax, sub in zip(axes[0], subsets):
        for i, config in enumerate(configs):
            pts = [r for r in rows if r["config"] == config and r["subset"] == sub]
            if not pts:
                continue
            ks = [int(r["k"]) for r in pts]
            color = STYLE[config][1] if config in STYLE else palette[i % len(palette)]
            ls = "--" if config == "base" else "-"
            ax.plot(ks, [100 * fnum(r["delta"]) for r in pts], ls, color=color, marker="o", ms=3,
                    label=STYLE.get(config, (config,))[0] if config in STYLE else config)
            if config in ("reco", "base"):
                ax.fill_between(ks, [100 * fnum(r["ci_low"]) for r in pts], [100 * fnum(r["ci_high"]) for r in pts],
                                color=color, alpha=0.15)
        ax.axhline(0, color="#d62728", lw=1)
        k_axis(ax, [int(r["k"]) for r in rows if r["subset"] == sub])
        ax.set_ylabel("Δ Pass@k vs GRPO (points)")
        ax.set_title(SUBSET_TITLE.get(sub, sub) + " (bands: 95 % CI, ReCo and Base)", fontsize=10)
        ax.grid(alpha=0.3)
    legend(axes[0][0], fontsize=7, ncol=2)
    save(fig, plots, "delta_vs_grpo.png")


def per_run_curves(out, plots):
    """Every run's Pass@k (all problems): the seed and base-policy spread behind the means."""
    rows = read_optional(out, "pass_at_k_runs.csv")
    if rows is None:
        return
    rows = [r for r in rows if r["subset"] == "all"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for config in ["base", "grpo", "reco"]:
        runs = sorted({(r["base"], r["seed"]) for r in rows if r["config"] == config})
        name, color, ls = STYLE[config]
        for j, (b, seed) in enumerate(runs):
            pts = [r for r in rows if r["config"] == config and r["base"] == b and r["seed"] == seed]
            ax.plot([int(r["k"]) for r in pts], [100 * fnum(r["pass_at_k"]) for r in pts], ls, color=color,
                    lw=1.6 if config == "base" else 0.8, alpha=0.9 if config == "base" else 0.5,
                    label=name if j == 0 else None)
    k_axis(ax, [int(r["k"]) for r in rows])
    ax.set_ylabel("Pass@k (%), all held-out problems")
    ax.set_title("Every run (thin: one RL seed; dashed: each base policy)", fontsize=10)
    ax.grid(alpha=0.3)
    legend(ax, loc="lower right")
    save(fig, plots, "pass_at_k_runs.png")


def by_class(out, plots):
    """Pass@64 (or the largest k below it) of every configuration, per problem class."""
    rows = read(os.path.join(out, "pass_at_k.csv"))
    ks = sorted({int(r["k"]) for r in rows})
    k = max([x for x in ks if x <= 64] or ks)
    classes = [c for c in ["common_only", "both", "rare_only", "all"] if any(r["subset"] == c for r in rows)]
    configs = []
    for r in rows:
        if r["config"] not in configs:
            configs.append(r["config"])
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(configs) + 3), 4.4))
    width = 0.8 / max(1, len(classes))
    colors = {"common_only": "#2ca02c", "both": "#9467bd", "rare_only": "#ff7f0e", "all": "#555555"}
    for i, cls in enumerate(classes):
        vals, errs = [], []
        for config in configs:
            r = next((r for r in rows if r["config"] == config and r["subset"] == cls and int(r["k"]) == k), None)
            vals.append(100 * fnum(r["mean"]) if r else float("nan"))
            errs.append(100 * fnum(r["std"]) if r else 0)
        xs = [j + (i - (len(classes) - 1) / 2) * width for j in range(len(configs))]
        ax.bar(xs, vals, width, yerr=errs, capsize=2, color=colors[cls], alpha=0.85, label=cls)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([label_of(rows, c) for c in configs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("Pass@%d (%%)" % k)
    ax.set_title("Pass@%d by problem class (error bars: std over runs)" % k, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    legend(ax, fontsize=8)
    save(fig, plots, "pass_at_k_by_class.png")


def smooth(values, window):
    """Trailing moving average (the first points average what is available)."""
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1): i + 1] if v == v]
        out.append(sum(part) / len(part) if part else float("nan"))
    return out


def training_dynamics(out, plots):
    rows = read(os.path.join(out, "training_dynamics.csv"))
    window = 5
    panels = [("reward", "training reward"), ("distinct2", "Distinct-2 (higher = more diverse)"),
              ("self_bleu", "Self-BLEU (lower = more diverse)"), ("entropy", "token entropy"),
              ("path_uniqueness", "path uniqueness (first step)"), ("abs_kl", "|KL| to base (k1)")]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (metric, title) in zip(axes.flat, panels):
        for config in ["grpo", "reco"]:
            pts = [r for r in rows if r["config"] == config]
            if not pts:
                continue
            steps = [int(r["step"]) for r in pts]
            m = smooth([fnum(r[metric + "_mean"]) for r in pts], window)
            s = smooth([fnum(r[metric + "_std"]) for r in pts], window)
            name, color, _ = STYLE[config]
            ax.plot(steps, m, color=color, label=name)
            ax.fill_between(steps, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], color=color, alpha=0.15)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    legend(axes[0][0])
    fig.suptitle("Training dynamics on the RL prompts (rollouts at temperature 1.0; mean ± std over seeds,\n"
                 "%d-step moving average)" % window)
    save(fig, plots, "training_dynamics.png")


def kde(out, plots):
    rows = read_optional(out, "base_likelihood_kde.csv")
    if rows is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for config in ["base", "grpo", "reco"]:
        pts = [r for r in rows if r["config"] == config]
        if not pts:
            continue
        name, color, ls = STYLE[config]
        ax.plot([fnum(r["x"]) for r in pts], [fnum(r["density"]) for r in pts], ls, color=color,
                label="%s (n=%s)" % (name, pts[0]["samples"]))
        ax.fill_between([fnum(r["x"]) for r in pts], [fnum(r["density"]) for r in pts], color=color, alpha=0.08)
    ax.set_xlabel("mean log-probability per token under the base policy")
    ax.set_ylabel("density (Gaussian KDE, Scott)")
    ax.set_title("Base-policy likelihood of correct responses on held-out problems")
    ax.grid(alpha=0.3)
    legend(ax, loc="upper left")
    save(fig, plots, "base_likelihood_kde.png")


def token_variance(out, plots):
    rows = read(os.path.join(out, "token_variance.csv"))
    segments = ["early", "middle", "late"]
    configs = [c for c in ["base", "grpo", "reco"] if any(r["config"] == c for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(1, len(configs))
    for i, config in enumerate(configs):
        vals, errs = [], []
        for seg in segments:
            r = next(r for r in rows if r["config"] == config and r["segment"] == seg)
            vals.append(fnum(r["mean"]))
            errs.append(fnum(r["standard_error"]))
        name, color, _ = STYLE[config]
        xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(segments))]
        ax.bar(xs, vals, width, yerr=errs, capsize=3, color=color, alpha=0.85, label=name)
    ax.set_xticks(range(len(segments)))
    ax.set_xticklabels(["early (0-33%)", "middle (33-66%)", "late (66-100%)"])
    ax.set_ylabel("mean p(1 - p) of sampled tokens")
    ax.set_title("Token variance by relative position\n(error bars: standard error across responses)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    legend(ax)
    save(fig, plots, "token_variance.png")


def save(fig, plots, name):
    fig.tight_layout()
    fig.savefig(os.path.join(plots, name), dpi=110)
    plt.close(fig)


def read_optional(out, name):
    """The rows of out/name, or None when the file is not there."""
    path = os.path.join(out, name)
    return read(path) if os.path.exists(path) else None


def legend(ax, **kw):
    """A legend only when something was drawn (tiny smoke runs may have no correct samples)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = sys.argv[1]
    plots = os.path.join(out, "plots")
    os.makedirs(plots, exist_ok=True)
    pass_at_k(out, plots)
    delta_vs_grpo(out, plots)
    per_run_curves(out, plots)
    by_class(out, plots)
    training_dynamics(out, plots)
    kde(out, plots)
    token_variance(out, plots)
    print("plots written to", plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
