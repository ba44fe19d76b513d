"""Split steps from Python that fail safely: torch.distributed (gloo, 2 processes, file
rendezvous) with torch.ops.reco.plan_summary / planned_policy_loss in the loop of
docs/distributed.md. A bad value in each kind of input on one rank, a rank whose copy of the sums
is altered after the all-reduce, and ranks with different step ids: every rank raises the same
error (the same argument and message) from the same call, and none waits for the group's
timeout. Runs on Debian's torch 1.13 and PyPI's torch 2.x alike (only torch.distributed's basic
API).

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

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
WORLD = 2


def make_step(seed=3):
    """A packed step of 6 prompts of 2..4 responses, lengths 1..6, every first token valid."""
    g = torch.Generator().manual_seed(seed)
    sizes = [2 + int(torch.randint(0, 3, (1,), generator=g)) for _ in range(6)]
    prompt_ids = torch.tensor([p for p, n in enumerate(sizes) for _ in range(n)], dtype=torch.int64)
    R = len(prompt_ids)
    lengths = torch.randint(1, 7, (R,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    N = int(offsets[-1])
    logp = -torch.rand(N, generator=g, dtype=torch.float64) * 3 - 1e-4
    old = (logp + 0.3 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)).clamp(max=-1e-6)
    ref = (logp + 0.2 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)).clamp(max=0)
    entropy = torch.round(torch.rand(N, generator=g, dtype=torch.float64) * 12) / 4
    mask = torch.rand(N, generator=g) > 0.15
    mask[offsets[:-1]] = True
    rewards = (torch.rand(R, generator=g) < 0.5).to(torch.float64)
    return dict(R=R, offsets=offsets, prompt_ids=prompt_ids, logp=logp, old_logp=old, ref_logp=ref, entropy=entropy, mask=mask,
                rewards=rewards)


def half(s, rank):
    """This rank's half of the step: its tensors and [first response, first group]."""
    cut = s["R"] // 2
    while s["prompt_ids"][cut] == s["prompt_ids"][cut - 1]:  # whole groups on each rank
        cut += 1
    a, b = (0, cut) if rank == 0 else (cut, s["R"])
    t0, t1 = int(s["offsets"][a]), int(s["offsets"][b])
    ids = s["prompt_ids"][a:b]
    bounds = [0] + [i for i in range(1, b - a) if ids[i] != ids[i - 1]] + [b - a]
    t = dict(logp=s["logp"][t0:t1].clone(), old_logp=s["old_logp"][t0:t1].clone(),
             ref_logp=s["ref_logp"][t0:t1].clone(),
             entropy=s["entropy"][t0:t1].clone(), mask=s["mask"][t0:t1].clone(),
             offsets=s["offsets"][a:b + 1] - t0, rewards=s["rewards"][a:b].clone(),
             group_offsets=torch.tensor(bounds, dtype=torch.int64))
    return t, a, int(s["prompt_ids"][a])


def plan_and_loss(reco, preset, tensors, part, overrides=None, alter=None):
    """The loop of docs/distributed.md for one micro-batch: the plan's stages, then the loss."""
    summaries = []
    while True:
        s = reco.plan_summary(preset, part, float(WORLD), summaries, overrides=overrides, **tensors)
        if s.numel() == 0:
            break
        dist.all_reduce(s)
        if alter is not None:
            alter(len(summaries), s)
        summaries.append(s)
    loss, _ = reco.planned_policy_loss(preset, part, float(WORLD), summaries, overrides=overrides, **tensors)
    return loss


def rank_main(rank, path, result_dir):
    torch.ops.load_library(LIB)
    reco = torch.ops.reco
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))
    s = make_step()
    nan = float("nan")

    def at_first(key, value):
        def spoil(t):
            t[key][0] = value  # the first token of the half: valid
        return spoil

    def rewards(t):
        t["rewards"][0] = nan

    def token_advantages(t):
        t["token_advantages"][0] = nan

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
        for r in range(1, WORLD):
            if ranks[r][k] != line:
                bad.append(f"rank 0 raised {line!r}, rank {r} {ranks[r][k]!r}")
        case = line.split(":")[0]
        want = {"altered": "summaries", "step ids": "plan"}.get(case, case)
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
