#!/usr/bin/env python3
"""Liger-Kernel's Triton grpo_loss against reco's pipeline at the same shapes, in one process.

Both compute a GRPO step from the logits: log-probabilities of the sampled tokens, the clipped
surrogate with a k3 KL term, and the gradient written back into the logits.

  liger  liger_kernel's triton_grpo_loss(logits [B, L+1, V], old_logp, ref_logp, completion_ids,
         advantages, completion_mask, temperature, beta, eps_low, eps_high, inplace=True), the
         masked token mean of its per-token loss, and backward (dlogits written in place).
  reco   through libreco_cuda.so's C interface (ctypes): reco_cuda_logits_forward on the
         [B*L, V] logits (logp, entropy, lse), reco_cuda_objective("grpo") on the padded [B, L]
         batch (gradient per token, every diagnostic, no synchronisation), then
         reco_cuda_logits_backward into the logits in place.

The formulas are equivalent, not identical: Liger takes the advantages, reco's grpo preset forms
them from rewards (8 per prompt) and adds verl's dual clip; both costs are per response or a few
flops per token, next to the logits traffic. Liger reads the [B, L+1, V] tensor it is given;
reco gets the [B*L, V] rows as one contiguous tensor (made outside the timed region).

Each case: 3 warm-up steps, then 50 steps timed one by one with torch.cuda.Event; the logits are
restored from a saved copy before every step, outside the timed region. Reports median, min and
max milliseconds and liger/reco. Usage:

  python3 benchmarks/cuda/bench_liger.py --lib build/adapters/cuda/libreco_cuda.so --out liger.json
"""
import argparse
import ctypes
import inspect
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reco_cuda_ctypes as rc  # noqa: E402

REPETITIONS = 50
WARMUP = 3
GROUP = 8

# Shapes (B, L, V): B*L tokens; B a multiple of GROUP.
SHAPES = [(8, 512, 32000), (8, 1024, 151936), (16, 512, 151936), (16, 1024, 128256), (32, 256, 262144)]


def load_liger():
    try:
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss
    except ImportError:
        try:
            from liger_kernel.ops.grpo_loss import GrpoLossFunction  # older layout

            def triton_grpo_loss(logits, old_logp, ref_logp, completion_ids, advantages, completion_mask,
                                 temperature, beta, eps_low, eps_high, inplace):
                return GrpoLossFunction.apply(logits, old_logp, ref_logp, completion_ids, advantages,
                                              completion_mask, temperature, beta, eps_low, eps_high, inplace)
        except ImportError:
            return None
    return triton_grpo_loss


def timed(step, restore):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(WARMUP):
        restore()
        step()
    torch.cuda.synchronize()
    ms = []
    for _ in range(REPETITIONS):
        restore()
        start.record()
        step()
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}


def run_shape(B, L, V, lib, ctx, liger, temperature=1.0, beta=0.001):
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(B * L + V)
    logits_full = (torch.randn(B, L + 1, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
    saved_full = logits_full.clone()
    ids = torch.randint(0, V, (B, L), device=dev, generator=gen)
    lengths = torch.randint(L // 4, L + 1, (B, 1), device=dev, generator=gen)
    mask = (torch.arange(L, device=dev).unsqueeze(0) < lengths)
    rewards = (torch.rand(B, device=dev, generator=gen) < 0.5).float()
    grouped = rewards.view(-1, GROUP)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    with torch.no_grad():  # realistic old/ref log-probs near the current ones
        lp0 = torch.log_softmax(logits_full[:, :-1].float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    old_logp = (lp0 + 0.05 * torch.randn(B, L, device=dev, generator=gen)).clamp_max(0).contiguous()
    ref_logp = (lp0 + 0.1 * torch.randn(B, L, device=dev, generator=gen)).clamp_max(0).contiguous()
    del lp0
    result = {"B": B, "L": L, "V": V, "tokens": B * L}

    if liger is not None:
        params = inspect.signature(liger).parameters
        kwargs = {}
        if "loss_type" in params:
            kwargs["loss_type"] = "grpo"
        logits_liger = logits_full.clone().requires_grad_(True)
        saved = saved_full

        def liger_step():
            out = liger(logits_liger, old_logp, ref_logp, ids, advantages, mask.int(), temperature, beta, 0.2, 0.2,
                        True, **kwargs)
            per_token = out[0] if isinstance(out, (tuple, list)) else out
            if per_token.dim() == 0:
                loss = per_token
            else:
                loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
            loss.backward()

        def liger_restore():
            with torch.no_grad():
                logits_liger.copy_(saved)
            logits_liger.grad = None

        result["liger"] = timed(liger_step, liger_restore)
        del logits_liger

    # reco: contiguous [B*L, V] logits, per-token buffers, one context.
    rows = B * L
    logits = saved_full[:, :-1].contiguous().view(rows, V)
    saved_rows = logits.clone()
    tokens = ids.reshape(-1).contiguous()
    row_mask = mask.reshape(-1).to(torch.uint8).contiguous()
    logp = torch.empty(rows, device=dev)
    entropy = torch.empty(rows, device=dev)
    lse = torch.empty(rows, device=dev)
    grad = torch.empty(rows, device=dev)
    group_offsets = (torch.arange(B // GROUP + 1, device=dev) * GROUP).to(torch.int64)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    fwd = rc.LogitsArgs(dtype=rc.RECO_BFLOAT16, logits=logits.data_ptr(), rows=rows, vocab=V, row_stride=V,
                     tokens=tokens.data_ptr(), temperature=temperature, row_mask=row_mask.data_ptr(),
                     logp=logp.data_ptr(), entropy=entropy.data_ptr(), lse=lse.data_ptr())
    bwd = rc.LogitsArgs(dtype=rc.RECO_BFLOAT16, logits=logits.data_ptr(), rows=rows, vocab=V, row_stride=V,
                     tokens=tokens.data_ptr(), temperature=temperature, row_mask=row_mask.data_ptr(),
                     grad_logp=grad.data_ptr(), saved_lse=lse.data_ptr(), dlogits=logits.data_ptr())
    obj = rc.ObjectiveArgs(dtype=rc.RECO_FLOAT32, responses=B, tokens=rows, max_length=L, groups=B // GROUP,
                        group_offsets=group_offsets.data_ptr(), logp=logp.data_ptr(), old_logp=old_logp.data_ptr(),
                        ref_logp=ref_logp.data_ptr(), mask=row_mask.data_ptr(), rewards=rewards.data_ptr(),
                        grad_logp=grad.data_ptr())
    in_workspace = ctypes.c_void_p()

    def check(code):
        if code != 0:
            raise RuntimeError(lib.reco_cuda_last_error().decode())

    def reco_step():
        check(lib.reco_cuda_logits_forward(ctypes.byref(fwd), stream))
        check(lib.reco_cuda_objective(ctx, b"grpo", ctypes.byref(obj), stream, rc.RECO_RESULT_WORKSPACE, None,
                                      ctypes.byref(in_workspace)))
        check(lib.reco_cuda_logits_backward(ctypes.byref(bwd), stream))

    def reco_restore():
        logits.copy_(saved_rows)

    result["reco"] = timed(reco_step, reco_restore)
    if "liger" in result:
        result["liger_over_reco"] = result["liger"]["median_ms"] / result["reco"]["median_ms"]
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path to libreco_cuda.so")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_liger.py: no CUDA device", file=sys.stderr)
        return 0
    lib = rc.load(args.lib)
    ctx = lib.reco_cuda_context_create()
    liger = load_liger()
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "liger": None, "shapes": []}
    if liger is None:
        print("bench_liger.py: liger_kernel is not importable; timing reco only", file=sys.stderr)
    else:
        import liger_kernel
        results["liger"] = getattr(liger_kernel, "__version__", "unknown")
    free, _ = torch.cuda.mem_get_info()
    for B, L, V in SHAPES:
        need = 6 * B * (L + 1) * V * 2  # logits, saved copies, Liger's and reco's working copies
        if need > free:
            print(f"skip B={B} L={L} V={V}: needs {need >> 20} MiB", file=sys.stderr)
            continue
        r = run_shape(B, L, V, lib, ctx, liger)
        print(json.dumps(r), flush=True)
        results["shapes"].append(r)
        torch.cuda.empty_cache()
    lib.reco_cuda_context_destroy(ctx)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
