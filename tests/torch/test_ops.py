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


def reco_loss(b, logp, cap=10.0, sampling="old"):
    adv = group_advantages(b["rewards"], b["G"])
    pg = ppo_surrogate(variance_ratio(logp, b["old"]), adv, 0.2, 0.2, 3.0)
    m = b["maskf"]
    # The weight's pbar under the sampling policy: the trainer's old_logp or the rollout engine's.
    mean_old = (b[sampling] * m).sum(1) / m.sum(1).clamp(min=1)
    w = torch.exp(-math.log(b["G"]) - mean_old)
    w = (w.clamp(max=cap) if cap > 0 else w).unsqueeze(1)
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

    def test_reco_weight_from_rollout_policy(self):
        # weight.sampling = 1 (rollout): the weight averages rollout_logp; ratio and KL keep old_logp.
        for seed in (5, 6):
            b = make_batch(seed)
            g = torch.Generator().manual_seed(seed)
            b["rollout"] = (b["old"] + 0.3 * torch.randn(b["old"].shape, generator=g, dtype=torch.float64)
                            - 0.5).clamp(max=-1e-6)
            loss, _, grad = run_op("reco", b, rollout_logp=b["rollout"], overrides={"weight.sampling": 1})
            want, want_grad = run_formula(reco_loss, b, sampling="rollout")
            self.assertLessEqual(abs(loss.item() - want.item()), 1e-10)
            self.assertLessEqual((grad - want_grad).abs().max().item(), 1e-10)
            default, _, _ = run_op("reco", b)
            self.assertGreater(abs(default.item() - loss.item()), 1e-8)
        with self.assertRaisesRegex(Exception, "rollout_logp"):  # given, switch off
            run_op("reco", b, rollout_logp=b["rollout"])
        with self.assertRaisesRegex(Exception, "rollout_logp"):  # switch on, none given
            run_op("reco", b, overrides={"weight.sampling": 1})
        with self.assertRaisesRegex(Exception, "rollout_logp"):  # a preset whose weight never reads it
            run_op("grpo", b, rollout_logp=b["rollout"])
        with self.assertRaisesRegex(Exception, "rollout_logp"):
            run_op("reco", b, rollout_logp=b["rollout"][:, :3], overrides={"weight.sampling": 1})
        with self.assertRaisesRegex(Exception, "weight.sampling"):
            run_op("reco", b, rollout_logp=b["rollout"], overrides={"weight.sampling": 2})

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
        self.assertEqual(len(reco.presets()), 21)

    def test_peer_presets(self):
        # A peer preset is its base with the peer's constants; overrides apply on top.
        def verl_vanilla(b, logp):
            adv = group_advantages(b["rewards"], b["G"])
            return masked_token_mean(ppo_surrogate(token_ratio(logp, b["old"]), adv, 0.2, 0.2, 3.0), b["maskf"])

        def openrlhf_ppo(b, logp, eps_high=0.2):
            adv = group_advantages(b["rewards"], b["G"], eps=1e-9)
            ratio = (logp - b["old"]).clamp(-20, 20).exp()  # OpenRLHF 0.11 clamps the log-ratio at +-20
            return masked_token_mean(ppo_surrogate(ratio, adv, 0.2, eps_high, None), b["maskf"])

        peers = dict(zip(list(reco.peer_presets())[0::2], list(reco.peer_presets())[1::2]))
        self.assertEqual(peers["verl_vanilla"], "dapo")
        self.assertEqual(peers["openrlhf_ppo"], "dapo")
        for seed in (8, 9):
            b = make_batch(seed)
            for name, fn, kw in (("verl_vanilla", verl_vanilla, {}), ("openrlhf_ppo", openrlhf_ppo, {}),
                                 ("openrlhf_ppo", openrlhf_ppo, {"eps_high": 0.3})):
                overrides = {"clip.eps_high": kw["eps_high"]} if kw else None
                loss, _, grad = run_op(name, b, overrides=overrides) if overrides else run_op(name, b)
                want, want_grad = run_formula(fn, b, **kw)
                self.assertLessEqual(abs(loss.item() - want.item()), 1e-12, name)
                self.assertLessEqual((grad - want_grad).abs().max().item(), 1e-12, name)
            # the same call as its base with the peer's settings as overrides
            a, _, ga = run_op("verl_vanilla", b)
            c, _, gc = run_op("dapo", b, overrides={"clip.eps_high": 0.2, "clip.dual_clip_c": 3.0})
            self.assertEqual(a.item(), c.item())
            self.assertTrue(torch.equal(ga, gc))
        self.assertEqual(list(reco.override_keys("verl_vanilla")), list(reco.override_keys("dapo")))
        with self.assertRaisesRegex(Exception, "verl_vanilla"):
            run_op("verl_vanila", make_batch(1))  # the known names listed include the peers

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


class PolicyLossInputs(unittest.TestCase):
    def call(self, preset, b, dtype=torch.float64, **kw):
        args = dict(old_logp=b["old"].to(dtype), mask=b["mask"], rewards=b["rewards"].to(dtype),
                    group_offsets=b["group_offsets"])
        args.update(kw)
        logp = b["logp"].to(dtype).detach().clone().requires_grad_(True)
        loss, stats = reco.policy_loss(preset, logp, **args)
        return loss, stats, logp

    def test_unread_inputs_are_errors(self):
        b = make_batch(8)
        R = b["rewards"].numel()
        with self.assertRaisesRegex(Exception, "advantages: preset 'dapo' computes advantages from rewards"):
            self.call("dapo", b, advantages=torch.full((R,), float("nan"), dtype=torch.float64))
        with self.assertRaisesRegex(Exception, "advantages"):
            self.call("grpo", b, ref_logp=b["ref"], advantages=torch.ones(R, dtype=torch.float64))
        with self.assertRaisesRegex(Exception, "response_weights"):
            self.call("dapo", b, response_weights=torch.full((R,), float("nan"), dtype=torch.float64))
        with self.assertRaisesRegex(Exception, "response_weights"):
            self.call("reco", b, ref_logp=b["ref"], response_weights=torch.ones(R, dtype=torch.float64))

    def test_entropy_is_diagnostics_only_and_checked(self):
        b = make_batch(9)
        m = b["maskf"]
        entropy = torch.rand(b["logp"].shape, dtype=torch.float64) * 3
        loss, stats, _ = self.call("dapo", b, entropy=entropy)
        s = dict(zip(reco.stat_names(), stats.tolist()))
        self.assertAlmostEqual(s["entropy_mean"], ((entropy * m).sum() / m.sum()).item(), places=12)
        plain, _, _ = self.call("dapo", b)
        self.assertEqual(loss.item(), plain.item())  # no entropy term: the loss does not change
        valid = b["mask"].nonzero()[0].tolist()
        masked = (~b["mask"]).nonzero()[0].tolist()
        bad = entropy.clone()
        bad[valid[0], valid[1]] = float("nan")
        with self.assertRaisesRegex(Exception, "entropy"):
            self.call("dapo", b, entropy=bad)
        bad = entropy.clone()
        bad[valid[0], valid[1]] = float("inf")
        with self.assertRaisesRegex(Exception, "entropy"):
            self.call("grpo", b, ref_logp=b["ref"], entropy=bad)
        bad = entropy.clone()
        bad[masked[0], masked[1]] = float("nan")  # a masked token is never read
        self.call("dapo", b, entropy=bad)
        ref = b["ref"].clone()
        ref[valid[0], valid[1]] = float("nan")
        with self.assertRaisesRegex(Exception, "ref_logp"):
            self.call("dapo", b, ref_logp=ref)

    def test_sparse_inputs(self):
        b = make_batch(10)
        with self.assertRaisesRegex(Exception, "logp: must be a dense"):
            reco.policy_loss("dapo", b["logp"].to_sparse(), mask=b["mask"], rewards=b["rewards"],
                             group_offsets=b["group_offsets"])
        with self.assertRaisesRegex(Exception, "rewards: must be a dense"):
            self.call("dapo", b, rewards=b["rewards"].to_sparse())
        with self.assertRaisesRegex(Exception, "old_logp: must be a dense"):
            self.call("dapo", b, old_logp=b["old"].to_sparse())
        with self.assertRaisesRegex(Exception, "mask: must be a dense"):
            self.call("dapo", b, mask=b["mask"].to_sparse())
        with self.assertRaisesRegex(Exception, "logits: must be a dense"):
            reco.token_logp_entropy(torch.randn(4, 10).to_sparse(), torch.zeros(4, dtype=torch.int64))

    def test_weight_cap_off_far_off_policy(self):
        b = make_batch(11)
        rows = [i for i in range(b["G"], b["rewards"].numel()) if b["mask"][i].any()]
        groups = b["rewards"].view(-1, b["G"])
        far = next(i for i in rows if groups[i // b["G"]].max() != groups[i // b["G"]].min())
        b["old"][far] = -100.0
        for cap in (0.0, float("inf")):
            with self.assertRaisesRegex(Exception, "logp: the loss .* overflows float32"):
                self.call("reco", b, torch.float32, ref_logp=b["ref"].float(), overrides={"weight.cap": cap})
            loss, _, logp = self.call("reco", b, ref_logp=b["ref"], overrides={"weight.cap": cap})
            loss.backward()
            want, want_grad = run_formula(reco_loss, b, cap=0.0)
            self.assertTrue(math.isfinite(want.item()) and abs(want.item()) > 1e38)
            self.assertLessEqual(abs(loss.item() - want.item()), 1e-10 * abs(want.item()))
            self.assertLessEqual((logp.grad - want_grad).abs().max().item(), 1e-10 * want_grad.abs().max().item())


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

    def test_positive_inf_and_tiny_temperature(self):
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(3, 10, dtype=dtype)
            x[1, 3] = math.inf
            with self.assertRaisesRegex(Exception, "logits: row 1: a logit is \\+inf"):
                reco.token_logp_entropy(x.requires_grad_(True), torch.zeros(3, dtype=torch.int64))
        with self.assertRaisesRegex(Exception, "temperature: .*float32"):
            reco.token_logp_entropy(torch.randn(3, 10), torch.zeros(3, dtype=torch.int64), 1e-300)
        with self.assertRaisesRegex(Exception, "temperature"):
            reco.token_logp_entropy(torch.randn(3, 10) * 100, torch.zeros(3, dtype=torch.int64), 1e-37)
        x = torch.randn(3, 10, dtype=torch.float64)
        tokens = torch.randint(0, 10, (3,))
        logp, entropy = reco.token_logp_entropy(x, tokens, 1e-300)
        rl, re = self.eager(x, tokens, 1e-300)
        self.assertLessEqual((logp - rl).abs().max().item(), 1e-12 * rl.abs().max().item())
        self.assertLessEqual((entropy - re).abs().max().item(), 1e-12)

    def test_sequence_first_logits_backward(self):
        # [T, R, V].transpose(0, 1): the gradient is one tensor of the logits' size.
        T, R, V = 5, 32, 40
        g = torch.Generator().manual_seed(3)
        base = torch.randn(T, R, V, generator=g, dtype=torch.float64)
        tokens = torch.randint(0, V, (R, T), generator=g)
        gl, gh = torch.randn(R, T, generator=g, dtype=torch.float64), torch.randn(R, T, generator=g, dtype=torch.float64)
        x = base.transpose(0, 1).detach().requires_grad_(True)
        logp, entropy = reco.token_logp_entropy(x, tokens, 0.9)
        grad, = torch.autograd.grad((logp * gl + entropy * gh).sum(), x)
        self.assertEqual(grad.storage().nbytes(), grad.numel() * grad.element_size())
        xr = base.transpose(0, 1).detach().requires_grad_(True)
        rl, re = self.eager(xr, tokens, 0.9)
        (rl * gl + re * gh).sum().backward()
        self.assertLessEqual((grad - xr.grad).abs().max().item(), 1e-12)

    def test_errors(self):
        with self.assertRaisesRegex(Exception, "tokens"):
            reco.token_logp_entropy(torch.randn(4, 10), torch.full((4,), 10))
        with self.assertRaisesRegex(Exception, "temperature"):
            reco.token_logp_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.int64), 0.0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
