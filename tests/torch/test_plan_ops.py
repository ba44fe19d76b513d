"""Split steps from Python: torch.ops.reco.plan_summary / planned_policy_loss with
torch.distributed (gloo, 2 processes, file rendezvous), micro-batches with a group across them and
an 80/20 cut with ties, presets and a composition. The DDP-averaged gradient and the average of the ranks' losses must equal
one call on the whole step (float64: 1e-12 relative). Also the loop of docs/distributed.md.

On a GPU machine the same steps run on CUDA tensors (the plan made on the host, each call on the
device): --device cuda with --backend nccl (1 process: NCCL takes one rank per GPU) or gloo (2
processes on one GPU).

Usage: python3 test_plan_ops.py <path to libreco_torch_ops.so> [--device cuda --backend nccl|gloo --world N]
(ctest passes the library; CPU and gloo with 2 processes by default)
"""
import argparse
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_args = argparse.ArgumentParser()
_args.add_argument("lib", nargs="?", default=os.environ.get("RECO_TORCH_OPS", ""))
_args.add_argument("--device", default="cpu")
_args.add_argument("--backend", default="gloo")
_args.add_argument("--world", type=int, default=2)
ARGS = _args.parse_args()
LIB = ARGS.lib


def make_step(seed=5):
    """A packed step: 7 prompts of 1..5 responses, lengths 0..8, masked holes, tied entropies."""
    g = torch.Generator().manual_seed(seed)
    sizes = [1 + int(torch.randint(0, 5, (1,), generator=g)) for _ in range(7)]
    prompt_ids = torch.tensor([p for p, n in enumerate(sizes) for _ in range(n)], dtype=torch.int64)
    R = len(prompt_ids)
    lengths = torch.randint(0, 9, (R,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    N = int(offsets[-1])
    logp = -torch.rand(N, generator=g, dtype=torch.float64) * 3 - 1e-4
    old = (logp + 0.3 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)).clamp(max=-1e-6)
    ref = (logp + 0.2 * (torch.rand(N, generator=g, dtype=torch.float64) - 0.5)).clamp(max=0)
    entropy = torch.round(torch.rand(N, generator=g, dtype=torch.float64) * 12) / 4
    mask = torch.rand(N, generator=g) > 0.15
    rewards = (torch.rand(R, generator=g) < 0.5).to(torch.float64)
    return dict(R=R, N=N, offsets=offsets, prompt_ids=prompt_ids, logp=logp, old=old, ref=ref, entropy=entropy,
                mask=mask, rewards=rewards)


def micro_batch(s, a, b, device="cpu"):
    """Responses [a, b) of the step: tensors, local group offsets, and (first_response, first_group)."""
    t0, t1 = int(s["offsets"][a]), int(s["offsets"][b])
    ids = s["prompt_ids"][a:b]
    bounds = [0] + [i for i in range(1, b - a) if ids[i] != ids[i - 1]] + ([b - a] if b > a else [])
    first_group = int(s["prompt_ids"][a]) if a < s["R"] else 0
    on = lambda t: t.to(device)  # noqa: E731
    return dict(logp=on(s["logp"][t0:t1]).clone().requires_grad_(True), old_logp=on(s["old"][t0:t1]),
                ref_logp=on(s["ref"][t0:t1]), entropy=on(s["entropy"][t0:t1]), mask=on(s["mask"][t0:t1]),
                offsets=on(s["offsets"][a:b + 1] - t0), rewards=on(s["rewards"][a:b]),
                group_offsets=on(torch.tensor(bounds, dtype=torch.int64)),
                first_response=a, first_group=first_group, t0=t0)


TENSORS = ("logp", "old_logp", "ref_logp", "entropy", "mask", "offsets", "rewards", "group_offsets")


# ---- the Python loop of docs/distributed.md (verbatim) --------------------------------------
def planned_step(reco, preset, micro_batches, step, R_step):
    """This rank's share of one optimizer step; every mb has first_response / first_group."""
    W = dist.get_world_size()
    parts = [[step, R_step, mb["first_response"], mb["first_group"]] for mb in micro_batches]
    tensors = [{k: mb[k] for k in TENSORS} for mb in micro_batches]
    summaries = []                                   # the summed summaries of the stages so far
    while True:
        s = sum(reco.plan_summary(preset, p, float(W), summaries, **t) for p, t in zip(parts, tensors))
        if s.numel() == 0:                           # the plan is complete
            break
        dist.all_reduce(s)                           # element-wise sum over ranks
        summaries.append(s)
    total = 0.0
    for p, t in zip(parts, tensors):
        loss, stats = reco.planned_policy_loss(preset, p, float(W), summaries, **t)
        loss.backward()                              # DDP would average the gradients over ranks
        total += float(loss.detach())
    return total
# ---- end of the loop ------------------------------------------------------------------------


def rank_main(rank, world, path, result_dir, device, backend):
    torch.ops.load_library(LIB)
    reco = torch.ops.reco
    if device == "cuda":
        torch.cuda.set_device(0)  # every rank on the one GPU (gloo); NCCL runs one rank
    dist.init_process_group(backend, init_method="file://" + path, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    s = make_step()
    cuts = [0, 3, 3, s["R"] // 2 + 1, s["R"] - 2, s["R"]]  # 5 parts: an empty one, groups across parts
    failures = []
    composed = ("advantage=rloo ratio=variance clip=ppo weight=expected_count aggregate=seq_mean_token_sum_norm "
                "select=top_entropy kl=kl_penalty")  # a composition (docs/composition.md): CPU tensors only
    presets = ["grpo", "dr_grpo", "reco", "rule_80_20", "rule_80_20_reco", "dapo_reco", "gspo"]
    if device == "cpu":
        presets += [composed, "clip_cov", "kl_cov"]  # the covariance selections run on CPU tensors only
    for step, preset in enumerate(presets):
        mine = [micro_batch(s, cuts[p], cuts[p + 1], device) for p in range(len(cuts) - 1) if p % world == rank]
        loss = planned_step(reco, preset, mine, step + 1, s["R"])
        grad = torch.zeros(s["N"] + 1, dtype=torch.float64, device=device)
        for mb in mine:
            if mb["logp"].grad is not None:
                grad[mb["t0"]:mb["t0"] + mb["logp"].numel()] += mb["logp"].grad
        grad[s["N"]] = loss
        dist.all_reduce(grad)
        grad /= world
        whole = micro_batch(s, 0, s["R"], device)
        wl, _ = reco.policy_loss(preset, whole["logp"], **{k: whole[k] for k in TENSORS if k != "logp"})
        wl.backward()
        wg = whole["logp"].grad
        gerr = float((grad[:s["N"]] - wg).abs().max() / wg.abs().max())
        lerr = abs(float(grad[s["N"]]) - float(wl)) / max(abs(float(wl)), 1e-3)
        if not (gerr <= 1e-12 and lerr <= 1e-12):
            failures.append(f"{preset}: gradient {gerr:.3g}, loss {lerr:.3g}")
    # Ranks disagreeing on the preset fail naming the plan.
    mine = [micro_batch(s, cuts[p], cuts[p + 1], device) for p in range(len(cuts) - 1) if p % world == rank]
    try:
        planned_step(reco, "grpo" if rank == 0 else "dapo", mine, 99, s["R"])
        if world > 1:
            failures.append("no error for ranks with different presets")
    except Exception as e:  # noqa: BLE001 (reco::error arrives as RuntimeError or ValueError)
        if "plan" not in str(e):
            failures.append("unexpected error: " + str(e))
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(failures))
    dist.destroy_process_group()


def main():
    with tempfile.TemporaryDirectory() as d:
        world = ARGS.world
        mp.spawn(rank_main, args=(world, os.path.join(d, "store"), d, ARGS.device, ARGS.backend), nprocs=world,
                 join=True)
        bad = []
        for r in range(world):
            with open(os.path.join(d, f"rank{r}.txt")) as f:
                text = f.read().strip()
            if text:
                bad.append(f"rank {r}: {text}")
        if bad:
            print("\n".join(bad))
            sys.exit(1)
        print(f"planned steps from Python ({ARGS.device}, {ARGS.backend}, {ARGS.world} ranks): all presets match "
              "the whole-step call")


if __name__ == "__main__":
    main()
