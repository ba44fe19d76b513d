"""reco.linear_logp_entropy and reco.LinearLogpEntropy (python/reco/linear.py) against eager
torch (F.linear, log_softmax, gather, entropy, autograd) in float64 and float32, a padded batch with
a mask, a transposed weight, the last chunk's logits kept for the backward, argument errors, and the lm_head sharded by rows over a Gloo group of
two processes (vocab_group) against the whole lm_head.

Usage: python3 test_linear_ops.py <path to libreco_torch_ops.so>   (ctest passes it): the package
sources of this checkout are staged in a temporary folder beside a link to that library.
"""
import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from staged_package import stage_package  # noqa: E402

sys.argv = stage_package(sys.argv)

import reco  # noqa: E402


def eager(hidden, weight, bias, tokens, tau):
    lp = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / tau, -1)
    return lp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(lp.exp() * lp).sum(-1)


class LinearLogpEntropyTest(unittest.TestCase):
    def check(self, dtype, tol):
        torch.manual_seed(0)
        head = torch.nn.Linear(7, 23, bias=True).to(dtype)
        hidden = torch.randn(3, 5, 7, dtype=dtype, requires_grad=True)
        tokens = torch.randint(23, (3, 5))
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1, 3:] = False
        g, gh = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)

        module = reco.LinearLogpEntropy(head, temperature=0.7)
        logp, ent = module(hidden, tokens, row_mask=mask)
        ((logp.double() * g).sum() + (ent.double() * gh).sum()).backward()
        got = (logp.detach(), ent.detach(), hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())

        hidden.grad = None
        head.zero_grad()
        e_lp, e_ent = eager(hidden, head.weight, head.bias, tokens, 0.7)
        m = mask.to(torch.float64)
        ((e_lp.double() * g * m).sum() + (e_ent.double() * gh * m).sum()).backward()
        want = (e_lp.detach() * mask, e_ent.detach() * mask, hidden.grad, head.weight.grad, head.bias.grad)
        for name, a, b in zip(("logp", "entropy", "dhidden", "dweight", "dbias"), got, want):
            self.assertTrue(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol), (name, (a.double() - b.double()).abs().max()))
        self.assertEqual(float(logp[1, 4]), 0.0)  # masked: zero

    def test_float64(self):
        self.check(torch.float64, 1e-11)

    def test_float32(self):
        self.check(torch.float32, 2e-5)

    def test_transposed_weight_and_chunks(self):
        torch.manual_seed(1)
        wt = torch.randn(6, 40, dtype=torch.float64)  # weight = wt.T, column-major
        hidden = torch.randn(9, 6, dtype=torch.float64)
        tokens = torch.randint(40, (9,))
        lp0, en0 = reco.linear_logp_entropy(hidden, wt.t().contiguous(), tokens)
        for chunk in (1, 4, 9):
            lp, en = reco.linear_logp_entropy(hidden, wt.t(), tokens, chunk_rows=chunk)
            self.assertTrue(torch.allclose(lp, lp0, rtol=1e-13, atol=1e-13))
            self.assertTrue(torch.allclose(en, en0, rtol=1e-13, atol=1e-13))
        e_lp, e_en = eager(hidden, wt.t(), None, tokens, 1.0)
        self.assertTrue(torch.allclose(lp0, e_lp, rtol=1e-12, atol=1e-12))

    def test_kept_last_chunk(self):
        # The forward keeps its last chunk's logits for the backward by default: the same gradients as
        # without (keep_last_chunk=False), and a second backward (retain_graph) recomputes them.
        torch.manual_seed(2)
        head = torch.nn.Linear(6, 31, bias=True).double()
        base = torch.randn(10, 6, dtype=torch.float64)
        tokens = torch.randint(31, (10,))

        def grads(keep, backwards, chunk):
            hidden = base.clone().requires_grad_(True)
            head.zero_grad()
            lp, en = reco.linear_logp_entropy(hidden, head.weight, tokens, head.bias, temperature=0.8,
                                              chunk_rows=chunk, keep_last_chunk=keep)
            loss = (lp * torch.linspace(-1, 1, 10, dtype=torch.float64)).sum() + 0.3 * en.sum()
            for _ in range(backwards):
                loss.backward(retain_graph=True)
            return hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()

        for chunk in (0, 3):
            plain, kept, twice = grads(False, 1, chunk), grads(True, 1, chunk), grads(True, 2, chunk)
            for a, b, c in zip(plain, kept, twice):
                self.assertTrue(torch.allclose(a, b, rtol=1e-12, atol=1e-13), (chunk, (a - b).abs().max()))
                self.assertTrue(torch.allclose(2 * a, c, rtol=1e-12, atol=1e-13), (chunk, (2 * a - c).abs().max()))
        with torch.no_grad():  # no backward can run: nothing kept, the same values
            lp, _ = reco.linear_logp_entropy(base, head.weight, tokens, head.bias, temperature=0.8)
        self.assertFalse(lp.requires_grad)

    def test_errors(self):
        h, w, t = torch.randn(4, 3), torch.randn(5, 3), torch.randint(5, (4,))
        cases = {
            "weight": lambda: reco.linear_logp_entropy(h, w.double(), t),
            "tokens": lambda: reco.linear_logp_entropy(h, w, t + 5),
            "bias": lambda: reco.linear_logp_entropy(h, w, t, torch.randn(4)),
            "memory_budget": lambda: reco.linear_logp_entropy(h, w, t, memory_budget=8),
        }
        for arg, f in cases.items():
            with self.assertRaisesRegex(ValueError, "reco: " + arg + ":"):
                f()
        with self.assertRaises(TypeError):
            reco.LinearLogpEntropy(torch.nn.Conv1d(1, 1, 1))


def _vocab_rank(rank, world, store, out_dir):
    """One rank of the vocabulary-parallel check: its rows of the lm_head over a Gloo group, against
    the whole lm_head on this rank; the largest differences go to out_dir/rank<r>.txt."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    torch.manual_seed(3)
    V, H = 23, 6
    hidden = torch.randn(4, 5, H, dtype=torch.float64)
    weight, bias = torch.randn(V, H, dtype=torch.float64), torch.randn(V, dtype=torch.float64)
    tokens = torch.randint(V, (4, 5))
    mask = torch.rand(4, 5) > 0.2
    g, gh = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    rows = [V * r // world for r in range(world + 1)]  # uneven shards
    lo, hi = rows[rank], rows[rank + 1]

    def run(w, b, group, chunk):
        h = hidden.clone().requires_grad_(True)
        w = w.clone().requires_grad_(True)
        b = b.clone().requires_grad_(True)
        lp, en = reco.linear_logp_entropy(h, w, tokens, b, temperature=0.8, row_mask=mask, chunk_rows=chunk,
                                          vocab_group=group)
        ((lp * g).sum() + (en * gh).sum()).backward()
        return lp.detach(), en.detach(), h.grad, w.grad, b.grad

    whole = run(weight, bias, None, 0)
    worst = 0.0
    for group, chunk in ((dist.group.WORLD, 0), (dist.group.WORLD.group_name, 3)):
        part = run(weight[lo:hi], bias[lo:hi], group, chunk)
        want = whole[:3] + (whole[3][lo:hi], whole[4][lo:hi])
        worst = max(worst, *(float((a - b).abs().max()) for a, b in zip(part, want)))
    try:
        reco.linear_logp_entropy(hidden, weight[lo:hi], tokens, vocab_group="no such group")
        named = "no error"
    except ValueError as e:
        named = str(e).split(":")[1].strip()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{worst} {named}")
    dist.destroy_process_group()


class VocabGroupTest(unittest.TestCase):
    def test_sharded_lm_head_equals_the_whole(self):
        import tempfile

        import torch.multiprocessing as mp

        world = 2
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(_vocab_rank, args=(world, os.path.join(d, "store"), d), nprocs=world, join=True)
            for r in range(world):
                with open(os.path.join(d, f"rank{r}.txt")) as f:
                    worst, named = f.read().split()
                self.assertLess(float(worst), 1e-12, f"rank {r}")
                self.assertEqual(named, "vocab_group", f"rank {r}")


if __name__ == "__main__":
    unittest.main()
