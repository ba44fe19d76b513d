"""Split steps from Python that fail safely: torch.distributed (gloo, 2 processes, file
rendezvous) with torch.ops.reco.plan_summary / planned_policy_loss in the loop of
docs/distributed.md. A bad value in each kind of input on one rank, a rank whose copy of the sums
is altered after the all-reduce, ranks with different step ids, and inputs one rank cannot
summarise (a shape, a missing input, a dtype): every rank raises the same error (the same argument
and message; the refusing rank adds its own error) from the same call, and none waits for the
group's timeout. Uses only torch.distributed's basic API (any torch of 1.13 or later).

Usage: python3 test_plan_faults.py <path to libreco_torch_ops.so>
"""
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_plan_ops as plan_ops  # noqa: E402  (its step and micro-batches; it reads the same argv)

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
WORLD = 2


def half(s, rank):
    """This rank's half of the step (whole groups): its tensors, first response and first group."""
    cut = s["R"] // 2
    while s["prompt_ids"][cut] == s["prompt_ids"][cut - 1]:
        cut += 1
    mb = plan_ops.micro_batch(s, *((0, cut) if rank == 0 else (cut, s["R"])))
    t = {k: mb[k].detach().clone() for k in plan_ops.TENSORS}
    return t, mb["first_response"], mb["first_group"]


def plan_and_loss(reco, preset, tensors, part, overrides=None, alter=None, scale=float(WORLD)):
    """The loop of docs/distributed.md for one micro-batch: the plan's stages, then the loss."""
    summaries = []
    while True:
        s = reco.plan_summary(preset, part, scale, summaries, overrides=overrides, **tensors)
        if s.numel() == 0:
            break
        dist.all_reduce(s)
        if alter is not None:
            alter(len(summaries), s)
        summaries.append(s)
    loss, _ = reco.planned_policy_loss(preset, part, scale, summaries, overrides=overrides, **tensors)
    return loss


def rank_main(rank, path, result_dir):
    torch.ops.load_library(LIB)
    reco = torch.ops.reco
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))
    s = plan_ops.make_step()
    nan = float("nan")

    def at_first(key, value):
        def spoil(t):
            t[key][int(t["mask"].nonzero()[0])] = value  # the half's first valid token
        return spoil

    def rewards(t):
        t["rewards"][0] = nan

    def token_advantages(t):
        t["token_advantages"][int(t["mask"].nonzero()[0])] = nan

    def given(t):  # advantages per token on every rank, no rewards
        t["token_advantages"] = torch.zeros_like(t["logp"])
        del t["rewards"]

    cases = [("grpo", None, "batch.rewards", rewards, None),
             ("rule_80_20", None, "batch.entropy", at_first("entropy", nan), None),
             ("reco", None, "batch.old_logp", at_first("old_logp", 0.5), None),
             ("kl_cov", None, "batch.logp", at_first("logp", nan), None),
             ("kl_cov", None, "batch.token_advantages", token_advantages, given)]
    lines = []
    for step, (preset, overrides, argument, spoil, prepare) in enumerate(cases):
        t, first, group = half(s, rank)
        if prepare:
            prepare(t)
        if rank == 1:
            spoil(t)
        start = time.time()
        try:
            plan_and_loss(reco, preset, t, [step + 1, s["R"], first, group], overrides)
            lines.append(f"{argument}: no error")
        except (RuntimeError, ValueError) as e:  # reco::error arrives as either
            lines.append(f"{argument}: {e}".split("\n")[0])
        lines.append(f"seconds {time.time() - start:.2f}")
    # Inputs rank 1 cannot summarise at all (a shape, a missing input, a dtype): its plan_summary
    # sends a refusal of the step's size instead of raising before the all-reduce; every rank
    # raises it from the sums, and rank 1 adds its own error.
    def drop_last(key):
        def spoil(t):
            t[key] = t[key][:-1]
        return spoil

    def missing(key):
        def spoil(t):
            del t[key]
        return spoil

    def as_float(key):
        def spoil(t):
            t[key] = t[key].float()
        return spoil

    refusals = [("grpo", "rewards", drop_last("rewards")), ("rule_80_20", "entropy", missing("entropy")),
                ("reco", "offsets", as_float("offsets")), ("kl_cov", "mask", drop_last("mask"))]
    for step, (preset, argument, spoil) in enumerate(refusals):
        t, first, group = half(s, rank)
        if rank == 1:
            spoil(t)
        start = time.time()
        try:
            plan_and_loss(reco, preset, t, [20 + step, s["R"], first, group])
            lines.append(f"refused {argument}: no error")
        except (RuntimeError, ValueError) as e:  # reco::error arrives as either
            lines.append(f"refused {argument}: {e}".split("\n")[0])
        lines.append(f"seconds {time.time() - start:.2f}")
    # A part field or the scale out of bounds on rank 1 (the step's size, part[1], still known).
    for step, (argument, field, bad) in enumerate((("part[2]", 2, s["R"] + 1), ("scale", None, float("nan")))):
        t, first, group = half(s, rank)
        part = [30 + step, s["R"], first, group]
        scale = float(WORLD)
        if rank == 1:
            if field is None:
                scale = bad
            else:
                part[field] = bad
        try:
            plan_and_loss(reco, "grpo", t, part, scale=scale)
            lines.append(f"refused {argument}: no error")
        except (RuntimeError, ValueError) as e:  # reco::error arrives as either
            lines.append(f"refused {argument}: {e}".split("\n")[0])
    # The sums altered after the all-reduce on rank 1 (grpo: its only stage before the confirmation).
    t, first, group = half(s, rank)

    def alter(stage, summed):
        if rank == 1 and stage == 0:
            summed[-1] += 1
    try:
        plan_and_loss(reco, "grpo", t, [50, s["R"], first, group], alter=alter)
        lines.append("altered: no error")
    except (RuntimeError, ValueError) as e:  # reco::error arrives as either
        lines.append(f"altered: {e}".split("\n")[0])
    # Ranks with different step ids.
    try:
        plan_and_loss(reco, "grpo", t, [60 + rank, s["R"], first, group])
        lines.append("step ids: no error")
    except (RuntimeError, ValueError) as e:  # reco::error arrives as either
        lines.append(f"step ids: {e}".split("\n")[0])
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines))
    dist.destroy_process_group()


def main():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(rank_main, args=(os.path.join(d, "store"), d), nprocs=WORLD, join=True)
        ranks = []
        for r in range(WORLD):
            with open(os.path.join(d, f"rank{r}.txt")) as f:
                ranks.append(f.read().split("\n"))
    bad = []
    worst = 0.0
    for k, line in enumerate(ranks[0]):
        if line.startswith("seconds"):
            worst = max(worst, *(float(r[k].split()[1]) for r in ranks))
            continue
        if "no error" in line:
            bad.append(line)
        case = line.split(":")[0]
        for r in range(1, WORLD):
            other = ranks[r][k]
            if case.startswith("refused "):  # rank 1 appends its own error to the common one
                own = other.find("; on this rank: ")
                if own < 0:
                    bad.append(f"{case}: rank {r} did not add its own error: {other!r}")
                other = other[:max(own, 0)]
            if other != line:
                bad.append(f"rank 0 raised {line!r}, rank {r} {ranks[r][k]!r}")
        want = {"altered": "summaries", "step ids": "plan"}.get(case, case.replace("refused ", ""))
        if f"reco: {want}:" not in line:
            bad.append(f"{case}: expected an error naming {want}: {line}")
    if worst > 10:
        bad.append(f"a case took {worst:.1f} s (a rank waited for the timeout)")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    print(f"plan faults from Python (gloo, {WORLD} ranks, torch {torch.__version__}): {len(ranks[0])} checks, every "
          f"rank raised the same error, the slowest bad-value case in {worst:.2f} s")


if __name__ == "__main__":
    main()
