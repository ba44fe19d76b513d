"""Given advantages through torch.ops.reco.policy_loss (verl / TRL style): for every preset, the
estimator's own advantages given reproduce the rewards-based loss and gradient; arbitrary given
advantages against plain-torch formulas; G from group offsets, prompt ids or group_size; a split
step with given advantages; and the errors, each naming its argument. Also the aggregation of
every preset selected by key ("aggregate.kind") against plain-torch formulas.

Usage: python3 test_given_ops.py <path to libreco_torch_ops.so>   (ctest passes it)
"""
import math
import os
import sys
import unittest

import torch

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
torch.ops.load_library(LIB)
reco = torch.ops.reco

KL_PRESETS = {"grpo", "aspo", "reco", "reco_no_cap", "reco_response_only", "reco_token_only"}
ENTROPY_PRESETS = {"rule_80_20", "rule_80_20_reco"}
G_PRESETS = {"reco", "reco_no_cap", "reco_response_only", "dapo_reco", "rule_80_20_reco"}  # weight 1/(G pbar_old)


def make_batch(seed, prompts=5, G=4, T=10):
    g = torch.Generator().manual_seed(seed)
    R = prompts * G
    logp = -torch.rand(R, T, generator=g, dtype=torch.float64) * 3 - 1e-4
    old = (logp + 0.3 * torch.randn(R, T, generator=g, dtype=torch.float64)).clamp(max=-1e-9)
    ref = (logp + 0.2 * torch.randn(R, T, generator=g, dtype=torch.float64)).clamp(max=0)
    entropy = torch.rand(R, T, generator=g, dtype=torch.float64) * 3
    lengths = torch.randint(1, T + 1, (R,), generator=g)
    lengths[2] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = (torch.rand(R, generator=g) < 0.5).to(torch.float64)
    rewards[:G] = 1.0  # a group with equal rewards
    adv = torch.randn(R, generator=g, dtype=torch.float64)
    return dict(R=R, G=G, logp=logp, old=old, ref=ref, entropy=entropy, mask=mask, maskf=mask.to(torch.float64),
                rewards=rewards, adv=adv, group_offsets=torch.arange(0, R + 1, G, dtype=torch.int64),
                prompt_ids=torch.arange(R, dtype=torch.int64) // G)


def estimator_advantages(preset, b):
    """The presets' estimators as plain formulas: GRPO (unbiased std, eps 1e-6; TRL's presets
    eps 1e-4), Dr.GRPO (centred), GPG (centred and scaled)."""
    r = b["rewards"].view(-1, b["G"])
    centred = r - r.mean(1, keepdim=True)
    if preset == "dr_grpo":
        return centred.reshape(-1)
    if preset == "gpg":  # GPG: centred, times R / max(1, number of non-zero rewards in the batch)
        alpha = r.numel() / max(1, int((r != 0).sum()))
        return (alpha * centred).reshape(-1)
    eps = 1e-4 if preset.startswith("trl_") else 1e-6
    return (centred / (r.std(1, keepdim=True) + eps)).reshape(-1)


def call(preset, b, **kw):
    """Loss, stats and d loss / d logp of one op call on batch b (float64, padded)."""
    args = dict(old_logp=b["old"], mask=b["mask"])
    if preset in KL_PRESETS:
        args["ref_logp"] = b["ref"]
    if preset in ENTROPY_PRESETS:
        args["entropy"] = b["entropy"]
    args.update(kw)
    logp = b["logp"].detach().clone().requires_grad_(True)
    loss, stats = reco.policy_loss(preset, logp, **args)
    loss.backward()
    return loss.item(), stats, logp.grad


def assert_same(test, got, want, rel=1e-12, what=""):
    loss, _, grad = got
    want_loss, _, want_grad = want
    test.assertLessEqual(abs(loss - want_loss), rel * max(abs(want_loss), 1e-3), what + " loss")
    scale = max(want_grad.abs().max().item(), 1e-30)
    test.assertLessEqual((grad - want_grad).abs().max().item(), rel * scale, what + " grad")


# ---- plain-torch formulas of two presets with given advantages --------------------------------

def ppo_surrogate(ratio, adv, eps_low, eps_high, dual_c):
    a = adv if adv.dim() == 2 else adv.unsqueeze(1)  # per token, or per response broadcast
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high))
    return torch.where(a < 0, torch.minimum(pg, -a * dual_c), pg)


def dapo_given(b, logp, adv):
    pg = ppo_surrogate((logp - b["old"]).clamp(-20, 20).exp(), adv, 0.2, 0.28, 10.0)
    return (pg * b["maskf"]).sum() / b["maskf"].sum()


def dapo_reco_given(b, logp, adv, G):
    # variance ratio p (1 - sg p) / (p_old (1 - p_old)) and ReCo's weight min(10, 1 / (G pbar_old)).
    def log_var(q):
        return (q + torch.log(-torch.expm1(q))).clamp(min=math.log(1e-12))
    lv = (log_var(logp.detach()) - log_var(b["old"])).detach()
    ratio = lv.exp() * torch.exp(logp - logp.detach())
    pg = ppo_surrogate(ratio, adv, 0.2, 0.28, 10.0)
    m = b["maskf"]
    mean_old = (b["old"] * m).sum(1) / m.sum(1).clamp(min=1)
    w = torch.exp(-math.log(G) - mean_old).clamp(max=10.0) * (m.sum(1) > 0)
    return (w.unsqueeze(1) * pg * m).sum() / m.sum()


class GivenAdvantages(unittest.TestCase):
    def test_every_preset_reproduces_its_estimator(self):
        for preset in reco.presets():
            for seed in (1, 2):
                b = make_batch(seed)
                want = call(preset, b, rewards=b["rewards"], group_offsets=b["group_offsets"])
                adv = estimator_advantages(preset, b)
                groups = {"group_offsets": b["group_offsets"]} if preset in G_PRESETS else {}
                got = call(preset, b, advantages=adv, **groups)
                assert_same(self, got, want, what=f"{preset} seed {seed}")
                self.assertEqual(got[2][~b["mask"]].abs().sum().item(), 0.0)

    def test_groups_of_presets_that_read_none(self):
        # Accepted and checked (as for any objective around given advantages), without effect.
        b = make_batch(8)
        alone = call("dapo", b, advantages=b["adv"])
        assert_same(self, call("dapo", b, advantages=b["adv"], group_offsets=b["group_offsets"]), alone, 0, "offsets")
        assert_same(self, call("dapo", b, advantages=b["adv"], prompt_ids=b["prompt_ids"]), alone, 0, "prompt ids")

    def test_group_size_equals_offsets_and_prompt_ids(self):
        b = make_batch(3)
        for preset in sorted(G_PRESETS):
            by_offsets = call(preset, b, advantages=b["adv"], group_offsets=b["group_offsets"])
            assert_same(self, call(preset, b, advantages=b["adv"], group_size=b["G"]), by_offsets, 0, preset)
            assert_same(self, call(preset, b, advantages=b["adv"], prompt_ids=b["prompt_ids"]), by_offsets, 0, preset)
            # G matters: groups of 2 weigh each response twice as much (below the cap).
            self.assertNotEqual(call(preset, b, advantages=b["adv"], group_size=2)[0], by_offsets[0])
        # With rewards, group_size defines the groups too.
        assert_same(self, call("grpo", b, rewards=b["rewards"], group_size=b["G"]),
                    call("grpo", b, rewards=b["rewards"], group_offsets=b["group_offsets"]), 0, "grpo rewards")

    def test_against_formulas(self):
        for seed in (4, 5):
            b = make_batch(seed)
            for preset, fn in (("dapo", lambda lp: dapo_given(b, lp, b["adv"])),
                               ("dapo_reco", lambda lp: dapo_reco_given(b, lp, b["adv"], b["G"]))):
                logp = b["logp"].detach().clone().requires_grad_(True)
                want = fn(logp)
                want.backward()
                groups = {"group_size": b["G"]} if preset in G_PRESETS else {}
                got = call(preset, b, advantages=b["adv"], **groups)
                assert_same(self, got, (want.item(), None, logp.grad), 1e-10, f"{preset} seed {seed}")

    def test_float32_advantages(self):
        b = make_batch(6)
        logp = b["logp"].float().detach().clone().requires_grad_(True)
        loss, _ = reco.policy_loss("dapo", logp, old_logp=b["old"].float(), mask=b["mask"], advantages=b["adv"].float())
        loss.backward()
        want_logp = b["logp"].float().double().detach().clone().requires_grad_(True)
        bb = dict(b, old=b["old"].float().double())
        want = dapo_given(bb, want_logp, b["adv"].float().double())
        want.backward()
        self.assertLessEqual(abs(loss.item() - want.item()), 1e-5)
        self.assertLessEqual((logp.grad.double() - want_logp.grad).abs().max().item(), 1e-5)

    def test_split_step(self):
        """plan_summary / planned_policy_loss with given advantages and group_size: the
        micro-batches' shares add up to one call on the whole step."""
        b = make_batch(7)
        whole = call("reco", b, advantages=b["adv"], group_size=b["G"])
        R, G = b["R"], b["G"]
        cuts = [(0, 8), (8, R)]  # at a group boundary
        total_loss, grads = 0.0, []
        parts = [[11, R, a, a // G] for a, _ in cuts]
        tensors = [dict(logp=b["logp"][a:e].detach().clone().requires_grad_(True), old_logp=b["old"][a:e],
                        ref_logp=b["ref"][a:e], mask=b["mask"][a:e], advantages=b["adv"][a:e]) for a, e in cuts]
        summaries = []
        while True:
            s = sum(reco.plan_summary("reco", p, 1.0, summaries, t["logp"], old_logp=t["old_logp"],
                                      ref_logp=t["ref_logp"], mask=t["mask"], advantages=t["advantages"],
                                      group_size=G) for p, t in zip(parts, tensors))
            if s.numel() == 0:
                break
            summaries.append(s)
        for p, t in zip(parts, tensors):
            loss, _ = reco.planned_policy_loss("reco", p, 1.0, summaries, t["logp"], old_logp=t["old_logp"],
                                               ref_logp=t["ref_logp"], mask=t["mask"], advantages=t["advantages"],
                                               group_size=G)
            loss.backward()
            total_loss += loss.item()
            grads.append(t["logp"].grad)
        assert_same(self, (total_loss, None, torch.cat(grads)), whole, 1e-12, "split step")


def token_advantages_of(b, seed):
    """Per-token advantages (GAE-like: around the response's value, some exact zeros); 0 outside
    the mask, where they are not read."""
    g = torch.Generator().manual_seed(seed)
    a = b["adv"].unsqueeze(1) + 0.7 * torch.randn(b["logp"].shape, generator=g, dtype=torch.float64)
    a = torch.where(torch.rand(b["logp"].shape, generator=g) < 0.1, torch.zeros_like(a), a)
    return a * b["maskf"]


class TokenAdvantages(unittest.TestCase):
    """token_advantages= (one per token, like logp) in place of advantages=."""

    def test_against_formulas(self):
        for seed in (14, 15):
            b = make_batch(seed)
            ta = token_advantages_of(b, seed)
            for preset, fn in (("dapo", lambda lp: dapo_given(b, lp, ta)),
                               ("dapo_reco", lambda lp: dapo_reco_given(b, lp, ta, b["G"]))):
                logp = b["logp"].detach().clone().requires_grad_(True)
                want = fn(logp)
                want.backward()
                groups = {"group_size": b["G"]} if preset in G_PRESETS else {}
                got = call(preset, b, token_advantages=ta, **groups)
                assert_same(self, got, (want.item(), None, logp.grad), 1e-10, f"{preset} seed {seed}")
                self.assertEqual(got[2][~b["mask"]].abs().sum().item(), 0.0)

    def test_constant_along_each_response_is_the_per_response_call(self):
        for preset in reco.presets():
            b = make_batch(16)
            groups = {"group_offsets": b["group_offsets"]} if preset in G_PRESETS else {}
            per_response = call(preset, b, advantages=b["adv"], **groups)
            broadcast = b["adv"].unsqueeze(1).expand_as(b["logp"]).contiguous()
            assert_same(self, call(preset, b, token_advantages=broadcast, **groups), per_response, 1e-12, preset)

    def test_split_step(self):
        b = make_batch(17)
        ta = token_advantages_of(b, 17)
        whole = call("reco", b, token_advantages=ta, group_size=b["G"])
        R, G = b["R"], b["G"]
        cuts = [(0, 8), (8, 12), (12, R)]
        parts = [[12, R, a, a // G] for a, _ in cuts]
        tensors = [dict(logp=b["logp"][a:e].detach().clone().requires_grad_(True), old_logp=b["old"][a:e],
                        ref_logp=b["ref"][a:e], mask=b["mask"][a:e], token_advantages=ta[a:e]) for a, e in cuts]
        summaries = []
        while True:
            s = sum(reco_py_plan_summary(p, t, G, summaries) for p, t in zip(parts, tensors))
            if s.numel() == 0:
                break
            summaries.append(s)
        total_loss, grads = 0.0, []
        for p, t in zip(parts, tensors):
            loss, _ = reco.planned_policy_loss("reco", p, 1.0, summaries, t["logp"], old_logp=t["old_logp"],
                                               ref_logp=t["ref_logp"], mask=t["mask"], group_size=G,
                                               token_advantages=t["token_advantages"])
            loss.backward()
            total_loss += loss.item()
            grads.append(t["logp"].grad)
        assert_same(self, (total_loss, None, torch.cat(grads)), whole, 1e-12, "split step, token advantages")

    def test_errors_name_the_argument(self):
        b = make_batch(18)
        ta = token_advantages_of(b, 18)
        bad = ta.clone()
        bad[3, 0] = float("nan")  # response 3 has a valid first token
        cases = [
            ("token_advantages: give the advantages per response .*or per token",
             dict(preset="dapo", advantages=b["adv"], token_advantages=ta)),
            ("token_advantages: preset 'grpo' computes advantages from rewards",
             dict(preset="grpo", rewards=b["rewards"], token_advantages=ta, group_offsets=b["group_offsets"],
                  ref_logp=b["ref"])),
            ("token_advantages: has shape \\[20\\]",
             dict(preset="dapo", token_advantages=b["adv"])),
            ("token_advantages: token 30 \\(response 3, position 0\\) is -?nan",
             dict(preset="dapo", token_advantages=bad)),
            ("advantages: has shape \\[20, 10\\] \\(the shape of logp\\).*token_advantages",
             dict(preset="dapo", advantages=ta)),
        ]
        self.assertTrue(bool(b["mask"][3, 0]))
        for pattern, kw in cases:
            preset = kw.pop("preset")
            with self.assertRaisesRegex(Exception, pattern, msg=pattern):
                call(preset, b, **kw)
        # NaN at a masked token is not read.
        masked = ta.clone()
        masked[2, 0] = float("nan")  # response 2 is empty
        assert_same(self, call("dapo", b, token_advantages=masked), call("dapo", b, token_advantages=ta), 0, "masked")


def reco_py_plan_summary(part, t, G, summaries):
    return reco.plan_summary("reco", part, 1.0, summaries, t["logp"], old_logp=t["old_logp"], ref_logp=t["ref_logp"],
                             mask=t["mask"], group_size=G, token_advantages=t["token_advantages"])


def k3(logp, ref_logp):
    e = (ref_logp - logp).clamp(-20, 20)
    return (e.exp() - e - 1).clamp(-10, 10)


def aggregate(x, m, kind, R, T):
    """The four aggregations of a masked [R, T] tensor."""
    per_seq_sum = (x * m).sum(1)
    n = m.sum(1)
    nonempty = (n > 0).to(x.dtype)
    if kind == 0:
        return per_seq_sum.sum() / m.sum()
    if kind == 1:
        return (per_seq_sum / n.clamp(min=1) * nonempty).sum() / nonempty.sum()
    if kind == 2:
        return per_seq_sum.sum() / nonempty.sum()
    return per_seq_sum.sum() / (R * T)


def grpo_given(b, logp, adv, kind):
    ratio = (logp - b["old"]).clamp(-20, 20).exp()
    pg = ppo_surrogate(ratio, adv, 0.2, 0.2, 3.0)
    m = b["maskf"]
    R, T = m.shape
    return aggregate(pg, m, kind, R, T) + 1e-3 * aggregate(k3(logp, b["ref"]), m, kind, R, T)


class AggregationByKey(unittest.TestCase):
    def test_every_kind_against_formulas(self):
        b = make_batch(12)
        for kind in range(4):
            logp = b["logp"].detach().clone().requires_grad_(True)
            want = grpo_given(b, logp, b["adv"], kind)
            want.backward()
            got = call("grpo", b, advantages=b["adv"], overrides={"aggregate.kind": float(kind)})
            assert_same(self, got, (want.item(), None, logp.grad), 1e-10, f"grpo kind {kind}")
            # With rewards too, and dapo's token_mean switched to the others.
            want_r = call("grpo", b, rewards=b["rewards"], group_offsets=b["group_offsets"],
                          overrides={"aggregate.kind": float(kind)})
            given_r = call("grpo", b, advantages=estimator_advantages("grpo", b),
                           overrides={"aggregate.kind": float(kind)})
            assert_same(self, given_r, want_r, 1e-12, f"grpo rewards kind {kind}")

    def test_default_kind_is_the_presets(self):
        b = make_batch(13)
        for preset, kind in (("grpo", 1), ("dapo", 0), ("dr_grpo", 3), ("reco", 1)):
            groups = {"group_offsets": b["group_offsets"]}
            assert_same(self, call(preset, b, rewards=b["rewards"], overrides={"aggregate.kind": float(kind)}, **groups),
                        call(preset, b, rewards=b["rewards"], **groups), 0, preset)
        for preset in reco.presets():
            self.assertIn("aggregate.kind", reco.override_keys(preset), preset)

    def test_split_step_any_kind(self):
        b = make_batch(14)
        R, G = b["R"], b["G"]
        for kind in range(4):
            ov = {"aggregate.kind": float(kind)}
            whole = call("reco", b, advantages=b["adv"], group_size=G, overrides=ov)
            cuts = [(0, 12), (12, R)]
            parts = [[20 + kind, R, a, a // G] for a, _ in cuts]
            tensors = [dict(old_logp=b["old"][a:e], ref_logp=b["ref"][a:e], mask=b["mask"][a:e],
                            advantages=b["adv"][a:e]) for a, e in cuts]
            logps = [b["logp"][a:e].detach().clone().requires_grad_(True) for a, e in cuts]
            summaries = []
            while True:
                s = sum(reco.plan_summary("reco", p, 1.0, summaries, lp, overrides=ov, group_size=G, **t)
                        for p, t, lp in zip(parts, tensors, logps))
                if s.numel() == 0:
                    break
                summaries.append(s)
            total = 0.0
            for p, t, lp in zip(parts, tensors, logps):
                loss, _ = reco.planned_policy_loss("reco", p, 1.0, summaries, lp, overrides=ov, group_size=G, **t)
                loss.backward()
                total += loss.item()
            assert_same(self, (total, None, torch.cat([lp.grad for lp in logps])), whole, 1e-12, f"kind {kind}")

    def test_errors(self):
        b = make_batch(15)
        with self.assertRaisesRegex(Exception, "overrides.aggregate.kind: is a choice"):
            call("dapo", b, advantages=b["adv"], overrides={"aggregate.kind": 5.0})  # kinds are 0..4
        with self.assertRaisesRegex(Exception, "aggregate.params.constant: is read only by kind"):
            call("dapo", b, advantages=b["adv"], overrides={"aggregate.constant": 10.0})
        with self.assertRaisesRegex(Exception, "overrides.kl.beta"):
            call("dapo", b, advantages=b["adv"], overrides={"kl.beta": 0.1})


class GivenAdvantageErrors(unittest.TestCase):
    def test_errors_name_the_argument(self):
        b = make_batch(9)
        R = b["R"]
        cases = [
            ("advantages: preset 'grpo' computes advantages from rewards.*not both rewards and advantages",
             dict(preset="grpo", rewards=b["rewards"], advantages=b["adv"], group_offsets=b["group_offsets"])),
            ("group_size: preset 'dapo' reads no groups",
             dict(preset="dapo", advantages=b["adv"], group_size=b["G"])),
            ("group_size: preset 'grpo' reads no groups",
             dict(preset="grpo", advantages=b["adv"], ref_logp=b["ref"], group_size=b["G"])),
            ("group_offsets: the last offset",
             dict(preset="dapo", advantages=b["adv"], group_offsets=b["group_offsets"][:-1])),
            ("group_size: is required .*preset 'reco'",
             dict(preset="reco", advantages=b["adv"])),
            ("group_size: is 3 but the 20 responses",
             dict(preset="dapo_reco", advantages=b["adv"], group_size=3)),
            ("group_size: must be >= 0",
             dict(preset="dapo_reco", advantages=b["adv"], group_size=-4)),
            ("group_size: give one of group_offsets, prompt_ids and group_size",
             dict(preset="reco", advantages=b["adv"], group_size=4, group_offsets=b["group_offsets"])),
            ("advantages: has shape \\[21\\]",
             dict(preset="dapo", advantages=torch.zeros(R + 1, dtype=torch.float64))),
            ("advantages: has shape \\[20, 10\\]",
             dict(preset="dapo", advantages=torch.zeros(R, 10, dtype=torch.float64))),
            ("advantages.*NaN",
             dict(preset="dapo", advantages=torch.where(torch.arange(R) == 5, float("nan"), b["adv"]))),
            ("overrides.advantage.eps: sets a parameter of preset 'grpo'",
             dict(preset="grpo", advantages=b["adv"], overrides={"advantage.eps": 1e-4})),
            ("rewards: is required",
             dict(preset="grpo", group_offsets=b["group_offsets"])),
        ]
        for pattern, kw in cases:
            preset = kw.pop("preset")
            with self.assertRaisesRegex(Exception, pattern, msg=pattern):
                call(preset, b, **kw)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
