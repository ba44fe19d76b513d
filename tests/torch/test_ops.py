"""torch.ops.reco.* from Python: reco, grpo and dapo against plain-torch formulas (forward and
gradient), overrides, token_logp_entropy against log_softmax + gather + entropy, and errors.

Usage: python3 test_ops.py <path to libreco_torch_ops.so>   (ctest passes it)
"""
import math
import os
import sys
import unittest

import torch

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
torch.ops.load_library(LIB)
reco = torch.ops.reco


# ---- plain-torch formulas, written the way TRL / verl write them ----------------------------

def group_advantages(rewards, group_size, eps=1e-6):
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).reshape(-1)


def masked_seq_mean_token_mean(x, mask):
    per_seq = (x * mask).sum(1) / mask.sum(1).clamp(min=1)
    nonempty = (mask.sum(1) > 0).to(x.dtype)
    return (per_seq * nonempty).sum() / nonempty.sum()


def masked_token_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def ppo_surrogate(ratio, adv, eps_low, eps_high, dual_c):
    a = adv.unsqueeze(1)
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high))
    if dual_c is not None:
        pg = torch.where(a < 0, torch.minimum(pg, -a * dual_c), pg)
    return pg


def k3(logp, ref_logp):
    e = (ref_logp - logp).clamp(-20, 20)
    return (e.exp() - e - 1).clamp(-10, 10)


def token_ratio(logp, old_logp):
    return (logp - old_logp).clamp(-20, 20).exp()


def variance_ratio(logp, old_logp):
    # ReCo: p (1 - sg p) / (p_old (1 - p_old)), in log space with a 1e-12 floor on each variance.
    def log_var(q):
        return (q + torch.log(-torch.expm1(q))).clamp(min=math.log(1e-12))
    lv = (log_var(logp.detach()) - log_var(old_logp)).detach()
    inside = (lv.abs() <= 20).to(logp.dtype)
    return lv.clamp(-20, 20).exp() * (inside * torch.exp(logp - logp.detach()) + (1 - inside))


def grpo_loss(b, logp, eps_high=0.2):
    adv = group_advantages(b["rewards"], b["G"])
    pg = ppo_surrogate(token_ratio(logp, b["old"]), adv, 0.2, eps_high, 3.0)
    return masked_seq_mean_token_mean(pg, b["maskf"]) + 1e-3 * masked_seq_mean_token_mean(k3(logp, b["ref"]), b["maskf"])


def reco_loss(b, logp):
    adv = group_advantages(b["rewards"], b["G"])
    pg = ppo_surrogate(variance_ratio(logp, b["old"]), adv, 0.2, 0.2, 3.0)
    m = b["maskf"]
    mean_old = (b["old"] * m).sum(1) / m.sum(1).clamp(min=1)
    w = torch.exp(-math.log(b["G"]) - mean_old).clamp(max=10.0).unsqueeze(1)
    return masked_seq_mean_token_mean(w * pg, m) + 1e-3 * masked_seq_mean_token_mean(k3(logp, b["ref"]), m)


def dapo_loss(b, logp):
    adv = group_advantages(b["rewards"], b["G"])
    pg = ppo_surrogate(token_ratio(logp, b["old"]), adv, 0.2, 0.28, 10.0)
    return masked_token_mean(pg, b["maskf"])


def make_batch(seed, dtype=torch.float64, prompts=5, G=4, T=12):
    g = torch.Generator().manual_seed(seed)
    R = prompts * G
    logp = -torch.rand(R, T, generator=g, dtype=torch.float64) * 3 - 1e-4
    off = torch.randn(R, T, generator=g, dtype=torch.float64) * 0.3
    off[torch.rand(R, T, generator=g) < 0.05] -= 1.5
    old = (logp + off).clamp(max=-1e-9)
    ref = (logp + 0.2 * torch.randn(R, T, generator=g, dtype=torch.float64)).clamp(max=0)
    lengths = torch.randint(1, T + 1, (R,), generator=g)
    lengths[3] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = (torch.rand(R, generator=g) < 0.5).to(torch.float64)
    rewards[:G] = 1.0  # one group with equal rewards
    cast = lambda t: t.to(dtype).to(torch.float64)  # the values the library sees
    return {"logp": cast(logp), "old": cast(old), "ref": cast(ref), "mask": mask, "maskf": mask.to(torch.float64),
            "rewards": rewards, "G": G, "dtype": dtype,
            "group_offsets": torch.arange(0, R + 1, G, dtype=torch.int64)}


def run_op(name, b, **kw):
    logp = b["logp"].to(b["dtype"]).detach().clone().requires_grad_(True)
    loss, stats = reco.policy_loss(name, logp, old_logp=b["old"].to(b["dtype"]), ref_logp=b["ref"].to(b["dtype"]),
                                   mask=b["mask"], rewards=b["rewards"].to(b["dtype"]),
                                   group_offsets=b["group_offsets"], **kw)
    loss.backward()
    return loss, stats, logp.grad


def run_formula(fn, b, **kw):
    logp = b["logp"].detach().clone().requires_grad_(True)
    loss = fn(b, logp, **kw)
    loss.backward()
    return loss, logp.grad


class PolicyLoss(unittest.TestCase):
    def check(self, name, fn, dtype, tol, **kw):
        for seed in (1, 2, 3):
            b = make_batch(seed, dtype)
            loss, stats, grad = run_op(name, b)
            want, want_grad = run_formula(fn, b, **kw)
            self.assertEqual(loss.dim(), 0)
            self.assertEqual(loss.dtype, torch.float64 if dtype == torch.float64 else torch.float32)
            self.assertLessEqual(abs(loss.item() - want.item()), tol, f"{name} seed {seed}")
            self.assertLessEqual((grad.double() - want_grad).abs().max().item(), tol, f"{name} grad seed {seed}")
            self.assertEqual(grad[~b["mask"]].abs().sum().item(), 0.0)
            # stats[0] is the loss in float64; the loss tensor is it rounded to the output dtype.
            self.assertLessEqual(abs(stats[0].item() - loss.item()), 0 if dtype == torch.float64 else 1e-6)

    def test_grpo(self):
        self.check("grpo", grpo_loss, torch.float64, 1e-10)
        self.check("grpo", grpo_loss, torch.float32, 1e-5)

    def test_reco(self):
        self.check("reco", reco_loss, torch.float64, 1e-10)
        self.check("reco", reco_loss, torch.float32, 1e-5)

    def test_dapo(self):
        self.check("dapo", dapo_loss, torch.float64, 1e-10)
        self.check("dapo", dapo_loss, torch.float32, 1e-5)

    def test_clipping_happens(self):
        b = make_batch(1)
        _, stats, _ = run_op("grpo", b)
        names = reco.stat_names()
        s = dict(zip(names, stats.tolist()))
        self.assertGreater(s["clip_frac"], 0.0)
        self.assertGreater(s["dual_clip_frac"], 0.0)
        self.assertEqual(s["valid_tokens"], b["mask"].sum().item())

    def test_overrides(self):
        b = make_batch(4)
        loss, _, grad = run_op("grpo", b, overrides={"clip.eps_high": 0.28})
        want, want_grad = run_formula(grpo_loss, b, eps_high=0.28)
        self.assertLessEqual(abs(loss.item() - want.item()), 1e-10)
        self.assertLessEqual((grad - want_grad).abs().max().item(), 1e-10)
        default, _, _ = run_op("grpo", b)
        self.assertNotEqual(loss.item(), default.item())
        self.assertIn("clip.eps_high", reco.override_keys("grpo"))
        self.assertEqual(len(reco.presets()), 13)

    def test_packed_equals_padded(self):
        b = make_batch(5)
        _, _, grad = run_op("dapo", b)
        lengths = b["mask"].sum(1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        logp = b["logp"][b["mask"]].clone().requires_grad_(True)
        loss, _ = reco.policy_loss("dapo", logp, old_logp=b["old"][b["mask"]], offsets=offsets,
                                   rewards=b["rewards"], group_offsets=b["group_offsets"])
        loss.backward()
        want, _ = run_formula(dapo_loss, b)
        self.assertLessEqual(abs(loss.item() - want.item()), 1e-12)
        self.assertLessEqual((logp.grad - grad[b["mask"]]).abs().max().item(), 1e-12)

    def test_bfloat16_logp(self):
        b = make_batch(6, torch.bfloat16)
        loss, _, grad = run_op("reco", b)
        self.assertEqual(loss.dtype, torch.float32)
        self.assertEqual(grad.dtype, torch.bfloat16)
        want, _ = run_formula(reco_loss, b)
        self.assertLessEqual(abs(loss.item() - want.item()), 1e-5)

    def test_errors(self):
        b = make_batch(7)
        with self.assertRaisesRegex(Exception, "preset"):
            run_op("not_a_preset", b)
        with self.assertRaisesRegex(Exception, "overrides.clip.eps_lo"):
            run_op("grpo", b, overrides={"clip.eps_lo": 0.1})
        with self.assertRaisesRegex(Exception, "ref_logp"):
            reco.policy_loss("grpo", b["logp"], old_logp=b["old"], mask=b["mask"], rewards=b["rewards"],
                             group_offsets=b["group_offsets"])
        with self.assertRaisesRegex(Exception, "rewards"):
            reco.policy_loss("dapo", b["logp"], old_logp=b["old"], mask=b["mask"], rewards=b["rewards"][1:],
                             group_offsets=b["group_offsets"])


class TokenLogpEntropy(unittest.TestCase):
    @staticmethod
    def eager(logits, tokens, temperature):
        ls = torch.log_softmax(logits.double() / temperature, -1)
        logp = ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(ls.exp() * torch.where(torch.isinf(ls), torch.zeros_like(ls), ls)).sum(-1)
        return logp, entropy

    def test_matches_eager(self):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(3, 7, 50, generator=g, dtype=torch.float64) * 2
        logits[0, 1, 5] = -math.inf
        tokens = torch.randint(0, 50, (3, 7), generator=g)
        tokens[0, 1] = 4
        row_mask = torch.ones(3, 7, dtype=torch.bool)
        row_mask[2, 6] = False
        gl, gh = torch.randn(3, 7, generator=g, dtype=torch.float64), torch.randn(3, 7, generator=g, dtype=torch.float64)
        x = logits.clone().requires_grad_(True)
        logp, entropy = reco.token_logp_entropy(x, tokens, 0.7, row_mask)
        ((logp * gl + entropy * gh)).sum().backward()
        xr = logits.clone().requires_grad_(True)
        rl, re = self.eager(xr, tokens, 0.7)
        m = row_mask.double()
        ((rl * gl + re * gh) * m).sum().backward()
        self.assertLessEqual(((logp - rl) * m).abs().max().item(), 1e-12)
        self.assertLessEqual(((entropy - re) * m).abs().max().item(), 1e-12)
        self.assertLessEqual((x.grad - xr.grad).abs().max().item(), 1e-12)
        self.assertEqual(x.grad[2, 6].abs().sum().item(), 0.0)
        self.assertEqual(x.grad[0, 1, 5].item(), 0.0)
        self.assertEqual(logp[2, 6].item(), 0.0)

    def test_bfloat16(self):
        g = torch.Generator().manual_seed(1)
        logits = (torch.randn(16, 1000, generator=g) * 2).bfloat16().requires_grad_(True)
        tokens = torch.randint(0, 1000, (16,), generator=g)
        logp, entropy = reco.token_logp_entropy(logits, tokens)
        self.assertEqual(logp.dtype, torch.float32)
        rl, re = self.eager(logits.detach(), tokens, 1.0)
        self.assertLessEqual((logp.double() - rl).abs().max().item(), 1e-4)
        self.assertLessEqual((entropy.double() - re).abs().max().item(), 1e-4)
        logp.sum().backward()
        self.assertEqual(logits.grad.dtype, torch.bfloat16)

    def test_errors(self):
        with self.assertRaisesRegex(Exception, "tokens"):
            reco.token_logp_entropy(torch.randn(4, 10), torch.full((4,), 10))
        with self.assertRaisesRegex(Exception, "temperature"):
            reco.token_logp_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.int64), 0.0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
