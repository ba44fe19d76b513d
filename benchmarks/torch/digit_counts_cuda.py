"""Ways to count the 2^16 first digits of N entropy keys (the step plan's first-digit histogram,
docs/distributed.md) with tensor operations on a GPU, each checked against private bincounts of
runs of 2^18 tokens (the adapter's method until 2026-11-27) and timed with CUDA events (median of
20). "sort+search" is what reco::torch::detail::digit_counts does now.

Usage (a machine with a CUDA GPU and PyTorch): python3 benchmarks/torch/digit_counts_cuda.py"""
import torch

dev = "cuda"
D = 1 << 16


def first_digits(x, long=True):
    v = x + 0
    u = v.view(torch.int32)
    key = u ^ ((u >> 31) | torch.iinfo(torch.int32).min)
    d = (key >> 16) & 0xFFFF
    return d.long() if long else d


def private_bincounts(x, valid):
    d = first_digits(x).masked_fill(~valid, 0).flatten()
    n = d.numel()
    blocks = min(64, max(1, n >> 18))
    if blocks <= 1 or n < blocks:
        return torch.bincount(d, minlength=D)
    per = (n + blocks - 1) // blocks
    runs = torch.nn.functional.pad(d, (0, per * blocks - n)).view(blocks, per)
    shifted = runs + torch.arange(blocks, device=d.device).mul_(D).unsqueeze(1)
    return torch.bincount(shifted.flatten(), minlength=blocks * D).view(blocks, D).sum(0)


def plain(x, valid):
    return torch.bincount(first_digits(x).masked_fill(~valid, 0).flatten(), minlength=D)


def plain32(x, valid):
    return torch.bincount(first_digits(x, False).masked_fill(~valid, 0).flatten(), minlength=D)


def sorted_search(x, valid):
    d = first_digits(x, False).masked_fill(~valid, 0).flatten()
    s, _ = torch.sort(d)
    edges = torch.searchsorted(s, torch.arange(D + 1, device=d.device, dtype=torch.int32))
    return (edges[1:] - edges[:-1]).long()


def sorted_values(x, valid):  # sort the float values themselves (keys order = value order)
    v = torch.where(valid, x + 0, torch.tensor(float("-inf"), device=x.device)).flatten()
    s, _ = torch.sort(v)
    d = first_digits(s, False)
    edges = torch.searchsorted(d, torch.arange(D + 1, device=d.device, dtype=torch.int32))
    h = (edges[1:] - edges[:-1]).long()
    h[int(first_digits(torch.tensor([float("-inf")], device=x.device), False))] -= (~valid).sum()
    return h


def histc(x, valid):
    d = first_digits(x, False).masked_fill(~valid, 0).flatten().float()
    return torch.histc(d, bins=D, min=0, max=D).long()


def time(f, *a):
    for _ in range(3):
        f(*a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        e[0].record()
        f(*a)
        e[1].record()
        torch.cuda.synchronize()
        ts.append(e[0].elapsed_time(e[1]))
    return sorted(ts)[len(ts) // 2]


torch.manual_seed(0)
for N in (1 << 20, 1 << 24):
    R, T = N // 1024, 1024
    lengths = torch.randint(256, T + 1, (R,), device=dev)
    valid = torch.arange(T, device=dev)[None, :] < lengths[:, None]
    for dist, x in (("uniform(0,3)", torch.rand(R, T, device=dev) * 3),
                    ("exponential(1)", torch.empty(R, T, device=dev).exponential_())):
        ref = private_bincounts(x, valid)
        line = []
        for name, f in (("private bincounts", private_bincounts), ("plain", plain), ("plain32", plain32), ("sort+search", sorted_search),
                        ("sort values", sorted_values), ("histc", histc)):
            try:
                ok = torch.equal(f(x, valid).cpu()[1:], ref.cpu()[1:])
                line.append(f"{name} {time(f, x, valid):.3f} ms{'' if ok else ' WRONG'}")
            except Exception as e:  # noqa: BLE001
                line.append(f"{name} failed: {type(e).__name__}: {str(e)[:80]}")
        print(f"N={N} {dist}: " + "; ".join(line), flush=True)
        # the digits alone, and a copy of the entropies
        print(f"   digits int64 {time(lambda: first_digits(x)):.3f} ms, int32 {time(lambda: first_digits(x, False)):.3f} ms,"
              f" copy {time(lambda: x.clone()):.3f} ms", flush=True)
