"""Figures of the strategy-tree study from its CSV files (docs/ablation.md).

    python3 plots.py RESULTS_DIR      # writes RESULTS_DIR/plots/tree_*.png
"""
import csv
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "base": "Base", "grpo": "GRPO", "reco": "ReCo", "response_only": "Response only", "token_only": "Token only",
    "dapo": "DAPO", "dapo_reco": "DAPO + ReCo", "rule_80_20": "80/20", "rule_80_20_reco": "80/20 + ReCo",
    "weight_a05": "w ∝ π^-0.5", "weight_a1": "w ∝ π^-1", "grpo_lr2": "GRPO lr/2", "grpo_lr4": "GRPO lr/4",
}
MAIN = ["base", "grpo", "reco", "response_only", "weight_a1"]


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    return float(x) if x not in ("", None) else math.nan


def mean(v):
    v = [x for x in v if not math.isnan(x)]
    return sum(v) / len(v) if v else math.nan


def main(out):
    plots = os.path.join(out, "plots")
    os.makedirs(plots, exist_ok=True)
    runs = rows(os.path.join(out, "tree_runs.csv"))
    ks = [int(c[4:]) for c in runs[0] if c.startswith("pass") and c[4:].isdigit()]
    by = defaultdict(list)
    for r in runs:
        by[r["arm"]].append(r)

    # Pass@k by k, every arm (the main ones bold).
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, rs in by.items():
        y = [100 * mean([num(r["pass%d" % k]) for r in rs]) for k in ks]
        ax.plot(ks, y, marker="o" if arm in MAIN else None, lw=2 if arm in MAIN else 0.8,
                alpha=1 if arm in MAIN else 0.6, label=LABELS.get(arm, arm))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("k")
    ax.set_ylabel("exact Pass@k (%), held-out")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "tree_pass_at_k.png"), dpi=120)
    plt.close(fig)

    # Figure 1, exact: density of the base log-likelihood per token of the correct answers.
    f1 = rows(os.path.join(out, "tree_fig1.csv"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in MAIN + ["token_only"]:
        pts = [(num(r["base_logp_per_token"]), num(r["density"])) for r in f1 if r["arm"] == arm]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=LABELS.get(arm, arm))
    ax.set_xlabel("base log-likelihood per token of a correct answer")
    ax.set_ylabel("density (weighted by π)")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, None)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "tree_fig1.png"), dpi=120)
    plt.close(fig)

    # Trajectories: Pass@1 against Pass@1024 and entropy by step (means over seeds).
    tr = rows(os.path.join(out, "tree_trajectory.csv"))
    curves = defaultdict(lambda: defaultdict(list))
    for r in tr:
        curves[r["arm"]][int(r["step"])].append(r)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in ["grpo", "grpo_lr2", "grpo_lr4", "reco", "response_only", "weight_a1", "token_only"]:
        if arm not in curves:
            continue
        steps = sorted(curves[arm])
        p1 = [100 * mean([num(r["pass1"]) for r in curves[arm][s]]) for s in steps]
        p1024 = [100 * mean([num(r["pass1024"]) for r in curves[arm][s]]) for s in steps]
        ent = [mean([num(r["token_entropy"]) for r in curves[arm][s]]) for s in steps]
        axes[0].plot(p1, p1024, marker=".", label=LABELS.get(arm, arm))
        axes[1].plot(steps, ent, label=LABELS.get(arm, arm))
    axes[0].set_xlabel("Pass@1 (%)")
    axes[0].set_ylabel("Pass@1024 (%)")
    axes[0].set_title("along training (step 0 at the left)")
    axes[1].set_xlabel("RL step")
    axes[1].set_ylabel("token entropy (nats)")
    axes[1].set_yscale("log")
    for a in axes:
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "tree_trajectories.png"), dpi=120)
    plt.close(fig)

    # Update scale and clip fraction by p_old.
    bins = rows(os.path.join(out, "tree_update_bins.csv"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm in ["grpo", "reco", "response_only", "token_only", "weight_a1"]:
        b = [r for r in bins if r["arm"] == arm]
        if not b:
            continue
        x = list(range(len(b)))
        axes[0].plot(x, [num(r["mean_abs_grad"]) for r in b], marker="o", label=LABELS.get(arm, arm))
        axes[1].plot(x, [100 * num(r["clip_frac"]) for r in b], marker="o", label=LABELS.get(arm, arm))
        names = ["[%s, %s)" % (r["p_old_low"], r["p_old_high"]) for r in b]
    for a in axes:
        a.set_xticks(range(len(names)))
        a.set_xticklabels(names, rotation=30, fontsize=7)
        a.set_xlabel("p_old of the token")
        a.legend(fontsize=7)
    axes[0].set_ylabel("mean |∂ℓ/∂logp| × tokens")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("clipped tokens (%)")
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "tree_update_bins.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1])
