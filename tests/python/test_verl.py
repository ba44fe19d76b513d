"""reco.integrations.verl against verl's own code (verl from PyPI, installed with --no-deps).

verl's policy losses live in verl.trainer.ppo.core_algos, whose imports reach ray, tensordict,
transformers and codetiming (its distributed runtime, never called by the loss functions). Those
four are replaced by inert stand-in modules before verl is imported; the loss code itself is
verl's. Run with a python that has reco, torch, numpy, omegaconf, orjson and verl; the test is
skipped (exit code 0, with a message) only when verl itself is not installed and RECO_REQUIRE_VERL
is unset.
"""
import math
import re
import unittest

import torch

from standins import StandIns, import_peer_or_skip


def _rollout_corr_helper():
    from verl.trainer.ppo import rollout_corr_helper  # noqa: E402
    return rollout_corr_helper


(core_algos,) = import_peer_or_skip("verl", ["verl.trainer.ppo.core_algos"],
                                    StandIns({"ray", "tensordict", "transformers", "codetiming"}),
                                    "test_verl", "RECO_REQUIRE_VERL")

from omegaconf import OmegaConf  # noqa: E402

import reco  # noqa: E402
import reco.integrations.verl as reco_verl  # noqa: E402


def verl_config(**kw):
    base = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, rollout_n=4,
                global_batch_info={}, policy_loss={"loss_mode": "vanilla"})
    base.update(kw)
    return OmegaConf.create(base)


def ragged_batch(gen, groups=3, G=4, T=7):
    """verl's layout: [B, T] padded on the right; outcome advantages broadcast over each response."""
    B = groups * G
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths[1] = T
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    new = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3).clamp(max=-1e-3)  # log-probabilities
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    adv = torch.zeros(B, dtype=torch.float64)
    for g in range(groups):
        r = rewards[g * G:(g + 1) * G]
        adv[g * G:(g + 1) * G] = (r - r.mean()) / (r.std() + 1e-6)
    return old, new, adv.unsqueeze(1).expand(B, T).clone() * mask, mask


def loss_and_grad(fn, old, new, adv, mask, **kw):
    x = new.clone().requires_grad_(True)
    loss, metrics = fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask, **kw)
    loss.backward()
    return loss.detach(), x.grad, metrics


class VerlRegistry(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.registered = reco_verl.register()
        reco_verl.register(["dapo", "grpo"], prefix="reco_")

    def test_verl_lookup_returns_reco_losses(self):
        for name in ("reco", "reco_response_only", "reco_token_only", "aspo", "rule_80_20_reco", "reco_dapo"):
            fn = core_algos.get_policy_loss_fn(name)
            self.assertIs(fn.__module__, reco_verl.__name__, name)
        self.assertIn("vanilla", core_algos.POLICY_LOSS_REGISTRY)  # verl's own stay

    def test_names_verl_already_has_are_refused(self):
        with self.assertRaisesRegex(ValueError, "already has a policy loss 'gspo'"):
            reco_verl.register(["gspo"])
        with self.assertRaisesRegex(ValueError, "unknown preset 'nope'"):
            reco_verl.register(["nope"])

    def test_vanilla_through_verl_equals_dapo_through_reco(self):
        # verl's vanilla with DAPO's caps (0.2 / 0.28, dual clip 10) and token-mean is reco's dapo.
        gen = torch.Generator().manual_seed(11)
        vanilla = core_algos.get_policy_loss_fn("vanilla")
        ours = core_algos.get_policy_loss_fn("reco_dapo")
        worst = 0.0
        for _ in range(24):
            old, new, adv, mask = ragged_batch(gen)
            cfg = verl_config()
            lv, gv, mv = loss_and_grad(vanilla, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            lr, gr, mr = loss_and_grad(ours, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            worst = max(worst, abs(lv - lr).item() / max(1e-300, abs(lv).item()))
            self.assertLessEqual(abs(lv - lr).item(), 1e-12 * max(1.0, abs(lv).item()))
            self.assertLessEqual((gv - gr).abs().max().item(), 1e-12 * max(1.0, gv.abs().max().item()))
            self.assertEqual((gr[~mask] != 0).sum().item(), 0)  # masked tokens: exactly zero gradient
            # verl averages the clip indicator in float32
            self.assertAlmostEqual(mv["actor/pg_clipfrac"], mr["actor/pg_clipfrac"], places=6)

    def test_token_sum(self):
        # verl's token-sum (PR 7197: the masked token sum times dp_size) with a token-mean preset:
        # verl's vanilla against reco's dapo through the integration, one rank and dp_size 2.
        gen = torch.Generator().manual_seed(12)
        vanilla = core_algos.get_policy_loss_fn("vanilla")
        ours = core_algos.get_policy_loss_fn("reco_dapo")
        for dp in (1, 2):
            for _ in range(12):
                old, new, adv, mask = ragged_batch(gen)
                cfg = verl_config(global_batch_info={"dp_size": dp, "batch_num_tokens": 999, "global_batch_size": 99})
                lv, gv, _ = loss_and_grad(vanilla, old, new, adv, mask, loss_agg_mode="token-sum", config=cfg)
                lr, gr, _ = loss_and_grad(ours, old, new, adv, mask, loss_agg_mode="token-sum", config=cfg)
                self.assertLessEqual(abs(lv - lr).item(), 1e-12 * max(1.0, abs(lv).item()))
                self.assertLessEqual((gv - gr).abs().max().item(), 1e-12 * max(1.0, gv.abs().max().item()))
                self.assertEqual((gr[~mask] != 0).sum().item(), 0)
                lm, _, _ = loss_and_grad(ours, old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())
                self.assertLessEqual(abs(lr - lm * dp * int(mask.sum())).item(), 1e-12 * max(1.0, abs(lr).item()))
        # The 80/20 presets' kept-token normaliser is summed too.
        old, new, adv, mask = ragged_batch(gen)
        reco_verl.provide_entropy(torch.rand(old.shape, generator=gen, dtype=torch.float64))
        try:
            fn = reco_verl.register(["rule_80_20"], prefix="sum_")["sum_rule_80_20"]
            ls, _, _ = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="token-sum", config=verl_config())
            lm, _, _ = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())
        finally:
            reco_verl.provide_entropy(None)
        self.assertGreater(abs(ls).item(), 0.0)
        self.assertGreater(abs(ls).item(), abs(lm).item())
        with self.assertRaisesRegex(ValueError, "loss_agg_mode 'token-sum' is not the aggregation of 'reco'"):
            loss_and_grad(core_algos.get_policy_loss_fn("reco"), old, new, adv, mask, loss_agg_mode="token-sum",
                          config=verl_config())

    def test_gdpo_advantages_equal_verl(self):
        # verl's compute_gdpo_outcome_advantage (per-reward GRPO normalisation within each uid
        # group, weighted sum, masked_whiten over the batch's tokens) against reco.gdpo_advantages
        # with the token weighting: 3 rewards, with and without weights.
        import numpy as np
        gen = torch.Generator().manual_seed(31)
        for weights in (None, [1.0, 0.5, 2.0]):
            for _ in range(6):
                B, T, P, G = 12, 6, 3, 4
                lengths = torch.randint(1, T + 1, (B,), generator=gen)
                response_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
                scores = {k: torch.randint(0, 3, (B,), generator=gen).float().tolist() for k in ("fmt", "acc", "len")}
                prompts = torch.zeros(B, 2, dtype=torch.long)
                attention = torch.cat([torch.ones(B, 2), response_mask], dim=1).long()
                cfg = OmegaConf.create({"gdpo_reward_keys": ["fmt", "acc", "len"], "gdpo_reward_weights": weights,
                                        "norm_adv_by_std_in_grpo": True})
                index = np.array([str(i // G) for i in range(B)], dtype=object)
                adv, _ = core_algos.compute_gdpo_outcome_advantage(
                    token_level_rewards=torch.zeros(B, T), response_mask=response_mask, index=index, config=cfg,
                    non_tensor_batch={k: np.array(v) for k, v in scores.items()},
                    batch={"prompts": prompts, "attention_mask": attention})
                rewards = torch.tensor([scores["fmt"], scores["acc"], scores["len"]], dtype=torch.float64).T
                mine = reco.gdpo_advantages(rewards, group_size=G, weights=weights, eps=1e-6,
                                            batch_normalise="token", batch_eps=1e-8, lengths=lengths)
                want = adv[:, 0].double()  # constant along each response
                self.assertLessEqual((mine - want).abs().max().item(), 1e-5 * max(1.0, want.abs().max().item()))
                self.assertTrue(torch.equal(adv, adv[:, :1] * response_mask))
        with self.assertRaisesRegex(ValueError, "two responses"):
            reco.gdpo_advantages(torch.zeros(3, 2), group_offsets=torch.tensor([0, 1, 3]))
        with self.assertRaisesRegex(ValueError, "weights"):
            reco.gdpo_advantages(torch.zeros(4, 2), group_size=2, weights=[1.0])
        with self.assertRaisesRegex(ValueError, "lengths"):
            reco.gdpo_advantages(torch.zeros(4, 2), group_size=2, batch_normalise="token")

    def test_caps_come_from_verl_config(self):
        gen = torch.Generator().manual_seed(5)
        old, new, adv, mask = ragged_batch(gen)
        new = (old + 3 * (new - old)).clamp(max=-1e-3)  # ratios far from 1: the caps bite
        vanilla = core_algos.get_policy_loss_fn("vanilla")
        ours = core_algos.get_policy_loss_fn("reco_dapo")
        for low, high, c in ((0.1, 0.1, 3.0), (0.3, 0.5, 5.0)):
            cfg = verl_config(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c)
            lv, gv, _ = loss_and_grad(vanilla, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            lr, gr, _ = loss_and_grad(ours, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            self.assertLessEqual(abs(lv - lr).item(), 1e-12 * max(1.0, abs(lv).item()))
            self.assertLessEqual((gv - gr).abs().max().item(), 1e-12)

    def test_split_step_with_global_batch_info(self):
        # Two micro-batches with verl's global token count: the parts add up to the whole step,
        # in verl's vanilla and in reco alike.
        gen = torch.Generator().manual_seed(3)
        old, new, adv, mask = ragged_batch(gen, groups=4)
        total = int(mask.sum())
        for name in ("vanilla", "reco_dapo"):
            fn = core_algos.get_policy_loss_fn(name)
            whole, gw, _ = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())
            parts, grads = 0.0, []
            for s in (slice(0, 5), slice(5, None)):
                cfg = verl_config(global_batch_info={"dp_size": 1, "batch_num_tokens": total})
                lp, gp, _ = loss_and_grad(fn, old[s], new[s], adv[s], mask[s], loss_agg_mode="token-mean", config=cfg)
                parts = parts + lp
                grads.append(gp)
            self.assertLessEqual(abs(parts - whole).item(), 1e-12 * max(1.0, abs(whole).item()), name)
            self.assertLessEqual((torch.cat(grads) - gw).abs().max().item(), 1e-12, name)

    def test_reco_reads_g_from_rollout_n(self):
        gen = torch.Generator().manual_seed(9)
        old, new, adv, mask = ragged_batch(gen, groups=4, G=4)  # 16 responses: whole groups of 4 and of 8
        fn = core_algos.get_policy_loss_fn("reco")
        l4, _, m4 = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="seq-mean-token-mean",
                                  config=verl_config(rollout_n=4))
        l8, _, m8 = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="seq-mean-token-mean",
                                  config=verl_config(rollout_n=8))
        # w = min(cap, 1 / (G pbar)): doubling G halves every uncapped weight.
        self.assertNotEqual(l4.item(), l8.item())
        self.assertIn("actor/reco_weight_mean", m4)
        # The same loss directly through reco, per-response advantages and G = 4.
        first = adv[torch.arange(adv.shape[0]), torch.argmax(mask.to(torch.int8), dim=1)] * mask.any(1)
        direct = reco.policy_loss("reco", new, old_logp=old, ref_logp=old, mask=mask, advantages=first, group_size=4,
                                  overrides={"clip.eps_low": 0.2, "clip.eps_high": 0.28, "clip.dual_clip_c": 10.0,
                                             "kl.beta": 0.0})
        self.assertLessEqual(abs(direct.loss - l4).item(), 1e-12 * max(1.0, abs(l4).item()))

    def test_errors_name_what_is_wrong(self):
        gen = torch.Generator().manual_seed(1)
        old, new, adv, mask = ragged_batch(gen)
        fn = core_algos.get_policy_loss_fn("reco")
        with self.assertRaisesRegex(ValueError, "loss_agg_mode 'token-mean'"):
            fn(old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())
        with self.assertRaisesRegex(ValueError, "config.rollout_n"):
            fn(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean", config=verl_config(rollout_n=0))
        with self.assertRaisesRegex(ValueError, "config=None"):
            fn(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean", config=None)
        rule = core_algos.get_policy_loss_fn("rule_80_20_reco")
        reco_verl.provide_entropy(None)
        with self.assertRaisesRegex(ValueError, "provide_entropy"):
            rule(old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())

    def test_80_20_with_entropies(self):
        gen = torch.Generator().manual_seed(2)
        old, new, adv, mask = ragged_batch(gen)
        entropy = torch.rand(old.shape, generator=gen, dtype=torch.float64)
        rule = core_algos.get_policy_loss_fn("rule_80_20")
        reco_verl.provide_entropy(entropy)
        try:
            lr, gr, _ = loss_and_grad(rule, old, new, adv, mask, loss_agg_mode="token-mean", config=verl_config())
        finally:
            reco_verl.provide_entropy(None)
        # Only the selected top-20 % tokens (by entropy, over the call) carry a gradient.
        kept = int((gr != 0).sum())
        self.assertGreater(kept, 0)
        self.assertLessEqual(kept, int(torch.ceil(torch.tensor(0.2 * float(mask.sum())))))


class VerlPeerPresets(unittest.TestCase):
    """reco's verl_* peer presets against verl's own losses at verl's own ActorConfig defaults
    (clip_ratio_low/high 0.2, clip_ratio_c 3 in verl 0.9.1)."""

    def check(self, verl_name, preset, seed):
        from verl.workers.config import ActorConfig

        gen = torch.Generator().manual_seed(seed)
        fn = core_algos.get_policy_loss_fn(verl_name)
        # verl's own defaults: an ActorConfig with only the fields it requires
        cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, rollout_n=4)
        worst = 0.0
        for _ in range(24):
            old, new, adv, mask = ragged_batch(gen)
            new = (old + 2 * (new - old)).clamp(max=-1e-3)  # ratios beyond the caps
            lv, gv, _ = loss_and_grad(fn, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            first = adv[torch.arange(adv.shape[0]), torch.argmax(mask.to(torch.int8), dim=1)] * mask.any(1)
            x = new.clone().requires_grad_(True)
            out = reco.policy_loss(preset, x, old_logp=old, mask=mask, advantages=first)
            out.loss.backward()
            rel = abs(lv - out.loss.detach()).item() / max(1e-300, abs(lv).item())
            worst = max(worst, rel)
            self.assertLessEqual(abs(lv - out.loss.detach()).item(), 1e-12 * max(1.0, abs(lv).item()), preset)
            self.assertLessEqual((gv - x.grad).abs().max().item(), 1e-12 * max(1.0, gv.abs().max().item()), preset)
            self.assertEqual((x.grad[~mask] != 0).sum().item(), 0)
        print(f"test_verl: {preset} vs verl '{verl_name}' at verl's defaults, 24 batches: "
              f"max relative loss difference {worst:.1e}")

    def test_verl_vanilla(self):
        self.check("vanilla", "verl_vanilla", 21)

    def test_verl_cispo(self):
        self.check("cispo", "verl_cispo", 22)

    def test_verl_dppo_tv(self):
        self.check("dppo_tv", "verl_dppo_tv", 23)

    def test_verl_dppo_kl(self):
        self.check("dppo_kl", "verl_dppo_kl", 24)

    def test_listed_with_their_bases(self):
        peers = reco.peer_presets()
        self.assertEqual(peers["verl_vanilla"], "dapo")
        self.assertEqual(peers["verl_cispo"], "cispo")
        self.assertEqual(peers["verl_dppo_tv"], "dppo")
        self.assertEqual(peers["verl_dppo_kl"], "dppo")
        self.assertNotIn("verl_vanilla", reco.presets())  # presets() is the typed table


def gae_batch(gen, groups=3, G=4, T=7):
    """A ragged batch whose advantages are verl's own GAE (compute_gae_advantage_return, whitened
    over the batch) from random values and a reward at each response's last token: one advantage
    per token."""
    old, new, _, mask = ragged_batch(gen, groups, G, T)
    B = mask.shape[0]
    lengths = mask.sum(1)
    rewards = torch.zeros(B, T, dtype=torch.float64)
    last = (lengths - 1).clamp(min=0)
    rewards[torch.arange(B), last] = torch.randint(0, 2, (B,), generator=gen).double() * (lengths > 0)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.5
    adv, _ = core_algos.compute_gae_advantage_return(rewards, values, mask.double(), gamma=torch.tensor(1.0),
                                                     lam=torch.tensor(0.95))
    return old, new, adv * mask, mask


class VerlTokenAdvantages(unittest.TestCase):
    """Per-token advantages (verl's GAE) through reco's token_advantages against verl's own losses,
    which read advantages per token: vanilla (verl_vanilla, and the registered reco_dapo through
    verl's registry), cispo (verl_cispo), dppo_tv / dppo_kl (verl_dppo_tv / verl_dppo_kl), and
    compute_policy_loss_reinforce (gpg)."""

    @classmethod
    def setUpClass(cls):
        reco_verl.register(["dapo"], prefix="tokadv_")

    def run_case(self, name, seed):
        from verl.workers.config import ActorConfig

        gen = torch.Generator().manual_seed(seed)
        worst = 0.0
        for _ in range(24):
            old, new, adv, mask = gae_batch(gen)
            new = (old + 2 * (new - old)).clamp(max=-1e-3)  # ratios beyond the caps
            self.assertFalse(bool(((adv == adv[:, :1]) | ~mask).all()))  # not constant along responses
            if name == "integration":
                cfg = verl_config()
                lv, gv, _ = loss_and_grad(core_algos.get_policy_loss_fn("vanilla"), old, new, adv, mask,
                                          loss_agg_mode="token-mean", config=cfg)
                lr, gr, _ = loss_and_grad(core_algos.get_policy_loss_fn("tokadv_dapo"), old, new, adv, mask,
                                          loss_agg_mode="token-mean", config=cfg)
            else:
                cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, rollout_n=4)
                if name == "reinforce":
                    x = new.clone().requires_grad_(True)
                    lv, _ = core_algos.compute_policy_loss_reinforce(old, x, adv, mask, loss_agg_mode="token-mean",
                                                                     config=cfg)
                    lv.backward()
                    lv, gv = lv.detach(), x.grad
                else:
                    lv, gv, _ = loss_and_grad(core_algos.get_policy_loss_fn(name), old, new, adv, mask,
                                              loss_agg_mode="token-mean", config=cfg)
                preset = {"vanilla": "verl_vanilla", "cispo": "verl_cispo", "reinforce": "gpg",
                          "dppo_tv": "verl_dppo_tv", "dppo_kl": "verl_dppo_kl"}[name]
                x = new.clone().requires_grad_(True)
                out = reco.policy_loss(preset, x, old_logp=old, mask=mask, token_advantages=adv)
                out.loss.backward()
                lr, gr = out.loss.detach(), x.grad
            worst = max(worst, abs(lv - lr).item() / max(1e-300, abs(lv).item()))
            self.assertLessEqual(abs(lv - lr).item(), 1e-12 * max(1.0, abs(lv).item()), name)
            self.assertLessEqual((gv - gr).abs().max().item(), 1e-12 * max(1.0, gv.abs().max().item()), name)
            self.assertEqual((gr[~mask] != 0).sum().item(), 0)
        print(f"test_verl: per-token (GAE) advantages, {name}, 24 batches: max relative loss difference {worst:.1e}")

    def test_vanilla(self):
        self.run_case("vanilla", 41)

    def test_cispo(self):
        self.run_case("cispo", 42)

    def test_reinforce(self):
        self.run_case("reinforce", 43)

    def test_dppo(self):
        self.run_case("dppo_tv", 45)
        self.run_case("dppo_kl", 46)

    def test_through_the_registered_loss(self):
        self.run_case("integration", 44)


class VerlBypassMode(unittest.TestCase):
    """verl's loss_mode "bypass_mode" (old_log_prob = the rollout engine's log-probs) against its
    reco spelling. verl's bypass function wraps its pieces in a DataProto (tensordict, stood in
    here), so the test runs the pieces it dispatches to, as it does: loss_type "ppo_clip" is
    verl's vanilla loss with old_log_prob = the rollout log-probs and no IS weights, and
    "reinforce" is verl's compute_policy_loss_reinforce with the weights of verl's
    compute_rollout_correction_weights(log_prob - rollout_log_prob). reco: verl_vanilla with
    old_logp = the rollout log-probs; the gpg preset on given advantages with the truncated IS
    weights min(exp(logp - rollout_logp), 2) (written here, detached) as token weights."""

    def run_case(self, loss_type, rollout_is, seed):
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

        gen = torch.Generator().manual_seed(seed)
        cfg = verl_config(clip_ratio_high=0.2, clip_ratio_c=3.0)
        worst = 0.0
        for _ in range(24):
            rollout, new, adv, mask = ragged_batch(gen)
            if loss_type == "ppo_clip":
                fn = core_algos.get_policy_loss_fn("vanilla")
                lv, gv, _ = loss_and_grad(fn, rollout, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            else:
                verl_w = None
                if rollout_is is not None:
                    verl_w, _ = compute_rollout_correction_weights(new - rollout, mask, rollout_is=rollout_is,
                                                                   rollout_is_threshold=2.0)
                x = new.clone().requires_grad_(True)
                lv, _ = core_algos.compute_policy_loss_reinforce(rollout, x, adv, mask, loss_agg_mode="token-mean",
                                                                 config=cfg, rollout_is_weights=verl_w)
                lv.backward()
                lv, gv = lv.detach(), x.grad
            first = adv[torch.arange(adv.shape[0]), torch.argmax(mask.to(torch.int8), dim=1)] * mask.any(1)
            x = new.clone().requires_grad_(True)
            if loss_type == "ppo_clip":
                out = reco.policy_loss("verl_vanilla", x, old_logp=rollout, mask=mask, advantages=first)
            else:
                kw = {}
                if rollout_is == "token":
                    kw["token_weights"] = torch.exp((new - rollout).clamp(-20, 20)).clamp(max=2.0) * mask
                out = reco.policy_loss("gpg", x, old_logp=rollout, mask=mask, advantages=first, **kw)
            out.loss.backward()
            worst = max(worst, abs(lv - out.loss.detach()).item() / max(1e-300, abs(lv).item()))
            self.assertLessEqual(abs(lv - out.loss.detach()).item(), 1e-12 * max(1.0, abs(lv).item()))
            self.assertLessEqual((gv - x.grad).abs().max().item(), 1e-12 * max(1.0, gv.abs().max().item()))
            self.assertEqual((x.grad[~mask] != 0).sum().item(), 0)
        print(f"test_verl: bypass_mode {loss_type} rollout_is={rollout_is}, 24 batches: "
              f"max relative loss difference {worst:.1e}")

    def test_ppo_clip(self):
        self.run_case("ppo_clip", None, 31)

    def test_reinforce(self):
        self.run_case("reinforce", None, 33)
        self.run_case("reinforce", "token", 34)


class VerlRolloutCorrection(unittest.TestCase):
    """reco.rollout_correction against verl's compute_rollout_correction_weights and
    compute_rollout_rejection_mask on random ragged float64 batches. Conventions aligned: verl's
    masked means add 1e-8 to the token counts in the count's dtype: with a float64 mask that is
    count_eps=1e-8, with a bool mask the count becomes float32 and the 1e-8 vanishes (count_eps=0);
    both masks are used. Its log ratios are clamped to
    +-20 (log_ratio_bound=20, the default), a k1 option's "lower_upper" ratio bounds are
    log(lower), log(upper) on k1, and a single IS threshold is TIS (bound="truncate", lower=0)
    while "lower_upper" is IcePop (bound="mask")."""

    OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
               "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")

    def batch(self, gen, B, T, spread, extreme):
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
        lengths[0] = T
        mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
        mask[1, 0] = False  # a hole (multi-turn observation token)
        old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
        rollout = (old - torch.randn(B, T, generator=gen, dtype=torch.float64) * spread).clamp(max=-1e-4)
        rollout[2] = old[2]  # one response inside every bound: verl's metrics fail when all weights are 0
        if extreme:  # log ratios beyond verl's clamp at +-20
            old[0, 0], rollout[0, 0] = -1.0, -26.0
            old[0, -1], rollout[0, -1] = -31.0, -1.0
        return old, rollout, mask

    def test_against_verl_on_random_ragged_batches(self):
        h = _rollout_corr_helper()
        gen = torch.Generator().manual_seed(1234)
        worst_w, flipped, dropped, kept, batches = 0.0, 0, 0, 0, 0
        for trial in range(24):
            B, T = 3 + trial % 5, 2 + (trial * 7) % 11
            spread = 0.05 + 0.1 * (trial % 4)
            old, rollout, mask = self.batch(gen, B, T, spread, extreme=trial % 6 == 5)
            log_ratio = old - rollout
            level = "token" if trial % 2 == 0 else "sequence"
            icepop = trial % 3 == 1
            normalize = trial % 4 >= 2
            upper = 1.5 + 0.5 * (trial % 3)
            lower = 0.6 if icepop else 0.0
            spec = f"{lower}_{upper}" if icepop else upper
            verl_mask = mask.double() if trial % 5 < 2 else mask  # float64: verl's 1e-8 counts
            count_eps = 1e-8 if verl_mask.dtype == torch.float64 else 0.0
            w_verl, _ = h.compute_rollout_correction_weights(log_ratio, verl_mask, rollout_is=level,
                                                             rollout_is_threshold=spec,
                                                             rollout_is_batch_normalize=normalize)
            # Two rejection options per batch, thresholds on each statistic's scale.
            opts = [self.OPTIONS[trial % 11], self.OPTIONS[(trial * 5 + 3) % 11]]
            if opts[0] == opts[1]:
                opts = opts[:1]
            specs, filters = [], []
            for o in opts:
                scale = spread if o.endswith("k1") else spread * spread
                scale *= 3 if o.startswith("seq_sum") else 1
                if o.endswith("k1"):
                    lo, hi = math.exp(-0.7 * scale), math.exp(0.6 * scale)
                    specs.append(f"{lo!r}_{hi!r}")
                    filters.append(reco.RolloutFilter(o, math.log(lo), math.log(hi)))
                else:
                    hi = 0.4 * scale
                    specs.append(repr(hi))
                    filters.append(reco.RolloutFilter(o, -math.inf, hi))
            mask_verl, _ = h.compute_rollout_rejection_mask(log_ratio, verl_mask, rollout_rs=",".join(opts),
                                                            rollout_rs_threshold=",".join(specs))
            out = reco.rollout_correction(old, rollout, mask=mask, level=level, bound="mask" if icepop else "truncate",
                                          lower=lower, upper=upper, normalise=normalize, count_eps=count_eps,
                                          filters=filters)
            self.assertEqual(out.weights.dtype, torch.float64)
            err = ((out.weights - w_verl).abs() / w_verl.abs().clamp(min=1.0)).max().item()
            worst_w = max(worst_w, err)
            self.assertLessEqual(err, 1e-12, f"trial {trial}: weights")
            self.assertTrue(torch.equal(out.keep_mask, mask_verl.bool()), f"trial {trial}: rejection mask {opts}")
            self.assertEqual((out.weights[~mask] != 0).sum().item(), 0)
            flipped += int((out.weights[mask] != torch.exp(log_ratio.clamp(-20, 20))[mask]).sum())
            dropped += int((mask & ~out.keep_mask).sum())
            kept += int(out.keep_mask.sum())
            batches += 1
        self.assertGreaterEqual(batches, 20)
        # The data exercise the bounds and both verdicts of the filters.
        self.assertGreater(flipped, 0)
        self.assertGreater(dropped, 0)
        self.assertGreater(kept, 0)
        print(f"test_verl: rollout correction, {batches} batches, worst weight relative error {worst_w:.2e}")

    def test_bad_arguments_name_the_argument(self):
        old = -torch.rand(2, 3, dtype=torch.float64) - 0.1
        roll = old - 0.1
        cases = [
            (dict(level="tokens"), "level"), (dict(bound="clip"), "bound"), (dict(upper=0.0), "upper"),
            (dict(lower=-1.0), "lower"), (dict(lower=3.0, upper=2.0), "lower"), (dict(log_ratio_bound=0.0), "log_ratio_bound"),
            (dict(count_eps=-1.0), "count_eps"), (dict(filters=[("seq_min_k1", 0.0, 1.0)]), "filters[0].statistic"),
            (dict(filters=[("token_k2", 1.0, 0.5)]), "filters[0].lower"),
            (dict(filters=[("token_k2", 0.0, float("nan"))]), "filters[0].upper"),
            (dict(filters=[("seq_mean_k1", -1.0, 0.1, True)]), "advantages"),
            (dict(advantages=torch.ones(2, dtype=torch.float64)), "advantages"),
            (dict(filters=[("seq_mean_k1", -1.0, 0.1, True)], advantages=torch.ones(3)), "advantages"),
            (dict(mask=torch.ones(2, 2, dtype=torch.bool)), "mask"),
        ]
        for kw, name in cases:
            with self.assertRaisesRegex(ValueError, "reco: " + re.escape(name) + ":", msg=str(kw)):
                reco.rollout_correction(old, roll, **kw)
        with self.assertRaisesRegex(ValueError, "reco: rollout_logp:"):
            reco.rollout_correction(old, roll[:, :2])
        bad = roll.clone()
        bad[0, 1] = float("nan")
        with self.assertRaisesRegex(ValueError, "reco: rollout_logp:"):
            reco.rollout_correction(old, bad)
        with self.assertRaisesRegex(ValueError, "reco: old_logp:"):
            reco.rollout_correction(-old, roll)


def per_response(adv, mask):
    """verl's broadcast outcome advantages back to one value per response (0 for empty ones)."""
    first = adv[torch.arange(adv.shape[0]), torch.argmax(mask.to(torch.int8), dim=1)]
    return torch.where(mask.any(1), first, torch.zeros_like(first))


class VerlCovariance(unittest.TestCase):
    """reco's clip_cov / kl_cov presets against verl's own compute_policy_loss_clip_cov /
    compute_policy_loss_kl_cov (float64, ragged batches, token-mean). Conventions aligned:
    verl's advantages are per response (broadcast); clip_cov's random subset is compared where it
    covers every candidate (k >= candidates), where verl's choice is exact."""

    def cov_config(self, **policy_loss):
        pl = dict(loss_mode="kl_cov", clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
                  ppo_kl_coef=0.1)
        pl.update(policy_loss)
        return verl_config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, policy_loss=pl)

    def reco_loss(self, preset, old, new, adv, mask, overrides):
        x = new.clone().requires_grad_(True)
        out = reco.policy_loss(preset, x, old_logp=old, mask=mask, advantages=per_response(adv, mask),
                               overrides=overrides)
        out.loss.backward()
        return out.loss.detach(), x.grad, out

    def compare(self, name, lv, gv, lr, gr, mask):
        self.assertLessEqual(abs(lv - lr).item(), 1e-12 * max(1e-300, abs(lv).item()) + 1e-300, name)
        gscale = gv.abs().max().item()
        self.assertLessEqual((gv - gr).abs().max().item(), 1e-12 * gscale, name)
        self.assertEqual((gr[~mask] != 0).sum().item(), 0, name)  # masked tokens: exactly zero gradient
        return abs(lv - lr).item() / max(1e-300, abs(lv).item()), (gv - gr).abs().max().item() / max(1e-300, gscale)

    def test_kl_cov_matches_verl(self):
        gen = torch.Generator().manual_seed(21)
        verl_fn = core_algos.compute_policy_loss_kl_cov
        worst = [0.0, 0.0]
        selected_seen = compared = trial = 0
        while compared < 24:
            trial += 1
            self.assertLess(trial, 200)
            ratio = (0.0002, 0.05, 0.2, 0.6)[trial % 4]
            coef = (0.1, 1.0, 0.37)[trial % 3]
            old, new, adv, mask = ragged_batch(gen, groups=2 + trial % 3, T=5 + trial % 6)
            # A tie at the cut (all advantages equal: every cov is 0) is broken by position in reco
            # (the earlier token) and arbitrarily by torch.topk: compared only without one.
            a, lp = adv[mask], new[mask]
            cov = ((a - a.mean()) * (lp - lp.mean())).sort(descending=True).values
            k = max(1, int(cov.numel() * ratio))
            if k < cov.numel() and cov[k - 1] == cov[k]:
                continue
            compared += 1
            cfg = self.cov_config(kl_cov_ratio=ratio, ppo_kl_coef=coef)
            lv, gv, _ = loss_and_grad(verl_fn, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            lr, gr, _ = self.reco_loss("kl_cov", old, new, adv, mask, {"select.ratio": ratio, "select.coef": coef})
            # The penalty is in play: without it the losses differ.
            l0, _, _ = self.reco_loss("kl_cov", old, new, adv, mask, {"select.ratio": ratio, "select.coef": 0.0})
            selected_seen += int(abs(l0 - lr).item() > 0)
            e = self.compare(f"kl_cov trial {trial}", lv, gv, lr, gr, mask)
            worst = [max(worst[0], e[0]), max(worst[1], e[1])]
        self.assertEqual(selected_seen, 24)
        print(f"kl_cov vs verl: 24 batches ({trial - compared} with a tie at the cut skipped), worst relative loss {worst[0]:.2e}, gradient {worst[1]:.2e}")

    def test_clip_cov_matches_verl_when_every_candidate_is_taken(self):
        gen = torch.Generator().manual_seed(22)
        verl_fn = core_algos.compute_policy_loss_clip_cov
        worst = [0.0, 0.0]
        compared = dropped_seen = 0
        trial = 0
        while compared < 24:
            trial += 1
            self.assertLess(trial, 400)
            old, new, adv, mask = ragged_batch(gen, groups=2 + trial % 3, T=5 + trial % 6)
            new = (old + (1 + trial % 3) * (new - old)).clamp(max=-1e-3)  # some ratios beyond the clip
            ratio, lb, ub = ((1.0, 1.0, 5.0), (0.0002, 1.0, 5.0), (0.5, -0.5, 0.8), (1.0, 0.2, 2.0))[trial % 4]
            over = {"select.ratio": ratio, "select.lb": lb, "select.ub": ub, "select.seed": float(trial)}
            lr, gr, out = self.reco_loss("clip_cov", old, new, adv, mask, over)
            candidates = int(out.stats_dict()["valid_tokens"] - out.stats_dict()["policy_tokens"])
            # Every candidate removed is verl's choice too when k covers them (k = max(1, int(ratio N))).
            k = max(1, int(ratio * float(mask.sum())))
            if candidates >= k and ratio < 1.0:
                continue  # a proper random subset: verl's torch.randperm draw is not reproducible
            cfg = self.cov_config(loss_mode="clip_cov", clip_cov_ratio=ratio, clip_cov_lb=lb, clip_cov_ub=ub)
            lv, gv, mv = loss_and_grad(verl_fn, old, new, adv, mask, loss_agg_mode="token-mean", config=cfg)
            e = self.compare(f"clip_cov trial {trial}", lv, gv, lr, gr, mask)
            worst = [max(worst[0], e[0]), max(worst[1], e[1])]
            # verl's pg_clipfrac is the fraction of valid tokens it removed.
            self.assertAlmostEqual(mv["actor/pg_clipfrac"], candidates / float(mask.sum()), places=6)
            dropped_seen += int(candidates > 0)
            compared += 1
        self.assertGreater(dropped_seen, 12)
        print(f"clip_cov vs verl: {compared} batches, worst relative loss {worst[0]:.2e}, gradient {worst[1]:.2e}")

    def test_bad_parameters_are_named(self):
        gen = torch.Generator().manual_seed(23)
        old, new, adv, mask = ragged_batch(gen)
        for key, value in (("select.ratio", 0.0), ("select.ratio", 2.0), ("select.coef", -1.0),
                           ("select.ub", 0.5), ("select.seed", float("inf"))):
            with self.assertRaisesRegex(ValueError, key.replace("select.", "select.params.") + "|" + key):
                reco.policy_loss("clip_cov" if key != "select.coef" else "kl_cov", new, old_logp=old, mask=mask,
                                 advantages=per_response(adv, mask), overrides={key: value})


if __name__ == "__main__":
    unittest.main()
