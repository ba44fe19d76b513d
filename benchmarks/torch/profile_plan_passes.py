"""Where the plan's device token passes spend their time: torch.profiler over plan_summary's
stages (stage 0: sums and the first-digit histogram; stage 1: the candidates' round read from the
data; stage 2: the cut counts), rule_80_20 / reco / grpo, N = 1M and 16M tokens, float32, CUDA tensors.

Usage (a machine with a CUDA GPU and PyTorch):
  python3 benchmarks/torch/profile_plan_passes.py path/to/libreco_torch_ops.so"""
import sys
import torch
from torch.profiler import ProfilerActivity, profile

torch.ops.load_library(sys.argv[1])
ops = torch.ops.reco
dev = "cuda"
torch.manual_seed(1)


def step(R, T=1024):
    lengths = torch.randint(256, T + 1, (R,), device=dev)
    mask = torch.arange(T, device=dev)[None, :] < lengths[:, None]
    logp = -torch.rand(R, T, device=dev) * 3 - 1e-4
    old = (logp + 0.05 * torch.randn(R, T, device=dev)).clamp(max=-1e-6)
    ent = torch.rand(R, T, device=dev) * 3
    ref = (logp + 0.05 * torch.randn(R, T, device=dev)).clamp(max=0)
    rewards = (torch.rand(R, device=dev) < 0.5).float()
    go = torch.arange(0, R + 1, 8, device=dev)
    return dict(logp=logp, old_logp=old, ref_logp=ref, entropy=ent, mask=mask, rewards=rewards, group_offsets=go)


def stages(preset, t, R):
    summaries = []
    while True:
        s = ops.plan_summary(preset, [1, R, 0, 0], 1.0, summaries, **t)
        if s.numel() == 0:
            return len(summaries)
        summaries.append(s)


for R in (1024, 16384):
    t = step(R)
    for preset in ("rule_80_20", "reco", "grpo"):
        for _ in range(3):
            stages(preset, t, R)
        torch.cuda.synchronize()
        n = 5
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(n):
            k = stages(preset, t, R)
        ev[1].record()
        torch.cuda.synchronize()
        print(f"== {preset} N={R * 1024}: {k} stages, {ev[0].elapsed_time(ev[1]) / n:.3f} ms per plan (all stages, stateless)")
        if preset == "rule_80_20" or R == 16384:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                stages(preset, t, R)
                torch.cuda.synchronize()
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=38))
            print(p.key_averages().table(sort_by="cpu_time_total", row_limit=10, max_name_column_width=38))
