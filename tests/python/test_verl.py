"""reco.integrations.verl against verl's own code (verl from PyPI, installed with --no-deps).

verl's policy losses live in verl.trainer.ppo.core_algos, whose imports reach ray, tensordict,
transformers and codetiming (its distributed runtime, never called by the loss functions). Those
four are replaced by inert stand-in modules before verl is imported; the loss code itself is
verl's. Run with a python that has reco, torch, numpy, omegaconf, orjson and verl; the test is
skipped (exit code 0, with a message) only when verl itself is not installed and RECO_REQUIRE_VERL
is unset.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import unittest

import torch


class _Inert(type):
    """A stand-in class: any attribute is another stand-in; calling it with one callable
    returns that callable (decorators such as ray.remote), otherwise the class itself."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return cls


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = {"ray", "tensordict", "transformers", "codetiming"}

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _InertModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def _import_verl():
    if importlib.util.find_spec("verl") is None:
        return None
    sys.meta_path.insert(0, _StandIns())
    from verl.trainer.ppo import core_algos  # noqa: E402
    return core_algos


core_algos = _import_verl()
if core_algos is None:
    if os.environ.get("RECO_REQUIRE_VERL"):
        raise SystemExit("test_verl: verl is not installed (RECO_REQUIRE_VERL is set)")
    print("test_verl: verl is not installed; skipped")
    sys.exit(0)

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
