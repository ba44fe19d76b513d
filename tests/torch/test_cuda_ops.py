"""torch.ops.reco.* on CUDA tensors against the same ops on CPU tensors: every preset (rewards and
given advantages, padded and packed, float32 and float64; loss, gradient and stats), and
token_logp_entropy (float32, bfloat16; values and gradient against float64 log_softmax), and
linear_logp_entropy (float64, float32, bfloat16; values and gradients against the CPU call).

Skips (exit 0, with a message) when torch sees no CUDA device or the op library was built
without the CUDA path.

Usage: python3 test_cuda_ops.py <path to libreco_torch_ops.so>
"""
import os
import sys
import unittest

import torch

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
torch.ops.load_library(LIB)
reco = torch.ops.reco


def policy_loss(preset, logp, **kw):
    names = ("old_logp", "ref_logp", "entropy", "mask", "offsets", "rewards", "advantages",
             "group_offsets", "prompt_ids", "token_weights", "response_weights")
    args = [kw.get(n) for n in names]
    return reco.policy_loss(preset, logp, *args, None, 0, 0, 0, 0, True, kw.get("group_size", 0))


def make_batch(seed, packed, dtype, groups=12, group_size=6, max_len=20):
    """A batch with empty and one-token responses, an all-equal group, unlikely responses (weight
    cap) and ratios past both clip ranges."""
    g = torch.Generator().manual_seed(seed)
    R = groups * group_size
    lengths = torch.randint(0, max_len + 1, (R,), generator=g)
    lengths[1], lengths[2] = 0, 1
    rewards = (torch.rand(R, generator=g) < 0.5).double()
    rewards[group_size:2 * group_size] = 1.0
    if packed:
        N = int(lengths.sum())
        offsets = torch.zeros(R + 1, dtype=torch.long)
        offsets[1:] = torch.cumsum(lengths, 0)
        shape, mask = (N,), None
    else:
        shape = (R, max_len)
        mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
        mask &= ~((torch.rand(shape, generator=g) < 0.1) & (torch.arange(max_len) > 0))
        offsets = None
    logp = -(torch.rand(shape, generator=g, dtype=torch.double) * 3).clamp(min=1e-6)
    logp[torch.rand(shape, generator=g) < 0.2] -= 4.0
    old = logp + 0.3 * torch.randn(shape, generator=g, dtype=torch.double)
    jump = torch.rand(shape, generator=g)
    old = torch.where(jump < 0.05, old - 1.5, torch.where(jump < 0.08, old + 1.5, old)).clamp(max=-1e-9)
    ref = (logp + 0.2 * torch.randn(shape, generator=g, dtype=torch.double)).clamp(max=-1e-9)
    entropy = 3 * torch.rand(shape, generator=g, dtype=torch.double)
    group_offsets = torch.arange(0, R + 1, group_size, dtype=torch.long)
    advantages = torch.randn(R, generator=g, dtype=torch.double)
    cast = lambda t: t.to(dtype)
    return dict(logp=cast(logp), old_logp=cast(old), ref_logp=cast(ref), entropy=cast(entropy), mask=mask,
                offsets=offsets, rewards=cast(rewards), advantages=cast(advantages),
                group_offsets=group_offsets, group_size=group_size)


def run(preset, batch, device, given):
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    logp = kw.pop("logp").detach().requires_grad_(True)
    if given:
        kw.pop("rewards")
        kw.pop("group_offsets")
    else:
        kw.pop("advantages")
        kw.pop("group_size")
    try:
        loss, stats = policy_loss(preset, logp, **kw)
    except ValueError as e:
        # A preset whose response weight does not use the group size refuses group_size (named).
        if not given or "group_size" not in str(e) or "does not read this input" not in str(e):
            raise
        kw.pop("group_size")
        loss, stats = policy_loss(preset, logp, **kw)
    loss.backward()
    return loss.detach().cpu().double(), logp.grad.cpu().double(), stats.cpu()


class CudaOps(unittest.TestCase):
    def test_every_preset_matches_cpu(self):
        checked = 0
        for preset in list(reco.presets()):
            if preset in ("clip_cov", "kl_cov"):  # CPU only (test_covariance_is_refused)
                continue
            for given in (False, True):
                for packed in (False, True):
                    for dtype, tol in ((torch.float64, 1e-11), (torch.float32, 2e-5)):
                        with self.subTest(preset=preset, given=given, packed=packed, dtype=dtype):
                            b = make_batch(7 + checked, packed, dtype)
                            lc, gc, sc = run(preset, b, "cpu", given)
                            lg, gg, sg = run(preset, b, "cuda", given)
                            self.assertTrue(torch.isfinite(lg).all())
                            scale = max(1.0, lc.abs().item())
                            self.assertLessEqual(abs(lg.item() - lc.item()), tol * scale)
                            gscale = max(1e-30, gc.abs().max().item())
                            self.assertLessEqual((gg - gc).abs().max().item(), tol * max(1.0, gscale))
                            self.assertEqual(sg.shape, sc.shape)
                            self.assertLessEqual((sg - sc).abs().max().item(), 1e-4 * max(1.0, sc.abs().max().item()))
                            checked += 1
        self.assertGreaterEqual(checked, 16 * 8)

    def test_rollout_weight_switch_is_refused_on_cuda(self):
        # The CUDA objectives do not read rollout log-probs yet: weight.sampling = rollout is an
        # error naming them there, not a weight silently computed from old_logp.
        b = make_batch(3, False, torch.float64)
        kw = {k: (v.to("cuda") if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
        logp = kw.pop("logp")
        kw.pop("advantages")
        kw.pop("group_size")
        names = ("old_logp", "ref_logp", "entropy", "mask", "offsets", "rewards", "advantages",
                 "group_offsets", "prompt_ids", "token_weights", "response_weights")
        args = [kw.get(n) for n in names]
        with self.assertRaisesRegex(ValueError, "batch.rollout_logp"):
            reco.policy_loss("reco", logp, *args, {"weight.sampling": 1.0}, 0, 0, 0, 0, True, 0,
                             kw["old_logp"] - 0.1)

    def test_covariance_is_refused(self):
        # Clip-Cov / KL-Cov select on the host: CUDA tensors are an error naming the preset.
        for preset in ("clip_cov", "kl_cov"):
            with self.assertRaisesRegex((ValueError, RuntimeError), f"'{preset}' \\(covariance_selection\\)"):
                run(preset, make_batch(3, False, torch.float64), "cuda", False)

    def test_token_logp_entropy_against_float64_log_softmax(self):
        g = torch.Generator().manual_seed(3)
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
            for rows, vocab in ((70000, 64), (257, 151936)):
                with self.subTest(dtype=dtype, rows=rows, vocab=vocab):
                    logits = (3 * torch.randn(rows, vocab, generator=g)).to(dtype)
                    tokens = torch.randint(0, vocab, (rows,), generator=g)
                    x = logits.cuda().requires_grad_(True)
                    logp, ent = reco.token_logp_entropy(x, tokens.cuda(), 0.7, None)
                    up = torch.randn(rows, generator=g).cuda()
                    ue = torch.randn(rows, generator=g).cuda()
                    ((logp.float() * up).sum() + (ent.float() * ue).sum()).backward()
                    z = (logits.double() / 0.7).requires_grad_(True)
                    ls = torch.log_softmax(z, -1)
                    rl = ls.gather(1, tokens.unsqueeze(1)).squeeze(1)
                    re = -(ls.exp() * ls).sum(-1)
                    ((rl * up.cpu().double()).sum() + (re * ue.cpu().double()).sum()).backward()
                    dz = z.grad / 0.7  # d/dlogits
                    self.assertLessEqual((logp.double().cpu() - rl.detach()).abs().max().item(), tol * 10)
                    self.assertLessEqual((ent.double().cpu() - re.detach()).abs().max().item(), tol * 10)
                    err = (x.grad.double().cpu() - dz).norm() / dz.norm()
                    self.assertLessEqual(err.item(), tol)

    def test_linear_logp_entropy_matches_cpu(self):
        # Hidden states on the device (cuBLAS GEMMs, the logits kernels) against the CPU call in
        # float64: values and the gradients of hidden, weight and bias; a masked row, a bias,
        # chunks of 5 rows, V not a multiple of any block; bf16 within its rounding.
        g = torch.Generator().manual_seed(4)
        N, H, V = 37, 24, 1001
        hidden = torch.randn(N, H, generator=g, dtype=torch.float64)
        weight = torch.randn(V, H, generator=g, dtype=torch.float64) / 3
        bias = torch.randn(V, generator=g, dtype=torch.float64)
        tokens = torch.randint(0, V, (N,), generator=g)
        mask = torch.rand(N, generator=g) > 0.2
        up, ue = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)

        def call(device, dtype, chunk):
            h, w, b = (t.to(device, dtype).requires_grad_(True) for t in (hidden, weight, bias))
            lp, en = reco.linear_logp_entropy(h, w, tokens.to(device), b, 0.7, mask.to(device), 0, chunk, None)
            ((lp.double() * up.to(device)).sum() + (en.double() * ue.to(device)).sum()).backward()
            return [x.detach().double().cpu() for x in (lp, en, h.grad, w.grad, b.grad)]

        want = call("cpu", torch.float64, 0)
        for dtype, chunk, tol in ((torch.float64, 0, 1e-10), (torch.float64, 5, 1e-10), (torch.float32, 0, 1e-4),
                                  (torch.bfloat16, 5, 5e-2)):
            with self.subTest(dtype=dtype, chunk=chunk):
                got = call("cuda", dtype, chunk)
                for name, a, b in zip(("logp", "entropy", "dhidden", "dweight", "dbias"), got, want):
                    err = (a - b).norm() / max(b.norm(), 1e-30)
                    self.assertLessEqual(err.item(), tol, name)
        with self.assertRaisesRegex((ValueError, RuntimeError), "tokens"):
            reco.linear_logp_entropy(hidden.cuda(), weight.cuda(), (tokens + V).cuda(), None, 1.0, None, 0, 0, None)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("test_cuda_ops.py: skipped (torch sees no CUDA device)")
        sys.exit(0)
    unittest.main(argv=sys.argv[:1], verbosity=2)
