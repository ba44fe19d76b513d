"""reco's spellings of OpenRLHF's policy loss against OpenRLHF's own ``PolicyLoss`` (openrlhf from
PyPI, installed with --no-deps).

``openrlhf.models.loss`` imports ``openrlhf.models.utils``, which imports deepspeed (its training
runtime, never called by the loss). Only those two modules are loaded (the package ``__init__``
files, which pull in the trainers, are not run), deepspeed is stood in for, and on torch 1.x
``torch.compile`` (a decorator there) is the identity. OpenRLHF's
advantages are per token (``[B, T]``): broadcast outcome advantages and varying ones (GAE) are
both checked, the latter through ``token_advantages``. Skipped (exit code 0, with a message) only
when openrlhf is not installed and RECO_REQUIRE_OPENRLHF is unset.
"""
import sys
import unittest

import torch

from standins import StandIns, load_peer_module_or_skip


if not hasattr(torch, "compile"):  # torch 1.x: the utils module decorates helpers with it (no effect on results)
    torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
loss_module = load_peer_module_or_skip("openrlhf", "models", "loss", StandIns({"deepspeed"}), "test_openrlhf",
                                       "RECO_REQUIRE_OPENRLHF")

import reco  # noqa: E402

TOL = 1e-12
WORST = {}


def ragged_batch(gen, groups=3, G=4, T=9, spread=0.3, per_token=False):
    """B = groups * G responses padded to T: ragged lengths, an empty response, interior masked
    tokens; outcome advantages per response broadcast over the tokens, or (per_token) varying
    along each response; 0 outside the mask (OpenRLHF's advantages are masked there)."""
    B = groups * G
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[1] = T
    lengths[2] = 0
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)) & (torch.rand(B, T, generator=gen) > 0.1)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    new = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread).clamp(max=-1e-3)
    rollout = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3).clamp(max=-1e-3)
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    adv = torch.zeros(B, dtype=torch.float64)
    for g in range(groups):
        r = rewards[g * G:(g + 1) * G]
        adv[g * G:(g + 1) * G] = (r - r.mean()) / (r.std() + 1e-9)
    tok = adv.unsqueeze(1).expand(B, T).clone()
    if per_token:
        tok = tok + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    return old, new, rollout, adv, tok * mask, mask


class OpenRlhfOwnLoss(unittest.TestCase):
    """openrlhf.models.loss.PolicyLoss(...)(log_probs, old_log_probs, advantages, action_mask, ...)
    against reco.policy_loss, 24 batches per case, float64."""

    def compare(self, case, make_loss, spell, seed, per_token=False, call_kw=None, tol=TOL, spread=0.3):
        gen = torch.Generator().manual_seed(seed)
        worst = 0.0
        for _ in range(24):
            old, new, rollout, adv, tok, mask = ragged_batch(gen, per_token=per_token, spread=spread)
            x = new.clone().requires_grad_(True)
            kw = dict(call_kw or {})
            if kw.pop("rollout", False):
                kw["rollout_log_probs"] = rollout
            lo = make_loss()(x, old, tok, action_mask=mask.double(), **kw)[0]
            lo.backward()
            lo, go = lo.detach(), x.grad
            preset, rkw = spell(mask, rollout)
            y = new.clone().requires_grad_(True)
            given = {"token_advantages": tok} if per_token else {"advantages": adv * mask.any(1)}
            out = reco.policy_loss(preset, y, old_logp=old, mask=mask, **given, **rkw)
            out.loss.backward()
            e = max(abs(out.loss.detach() - lo).item() / max(1.0, abs(lo).item()),
                    (y.grad - go).abs().max().item() / max(1.0, go.abs().max().item()))
            worst = max(worst, e)
            self.assertLessEqual(e, tol, f"{case}: loss {lo.item()} (OpenRLHF) vs {out.loss.item()} (reco)")
            self.assertEqual(int((y.grad[~mask] != 0).sum()), 0, case)
        WORST[case] = worst

    def test_defaults(self):
        # PolicyLoss(): eps 0.2 / 0.2, no dual clip, token-level loss, log-ratio clamp ±20 (ppo).
        for per_token in (False, True):
            self.compare(f"ppo defaults, {'per-token' if per_token else 'outcome'} advantages",
                         loss_module.PolicyLoss,
                         lambda m, r: ("openrlhf_ppo", {}),
                         seed=1 + per_token, per_token=per_token)

    def test_log_ratios_beyond_the_clamp(self):
        # spread 12: log-ratios well beyond +-20, where OpenRLHF 0.11 clamps before the exp.
        self.compare("ppo defaults, log-ratios beyond +-20", loss_module.PolicyLoss,
                     lambda m, r: ("openrlhf_ppo", {}), seed=7, per_token=True, spread=12.0)

    def test_dual_clip_and_global_tokens(self):
        self.compare("ppo dual_clip 3, eps_high 0.28, batch_num_tokens 150",
                     lambda: loss_module.PolicyLoss(clip_eps_high=0.28, dual_clip=3.0),
                     lambda m, r: ("openrlhf_ppo", dict(global_tokens=150, overrides={
                         "clip.eps_high": 0.28, "clip.dual_clip": 1.0,
                         "clip.dual_clip_c": 3.0})),
                     seed=3, per_token=True, call_kw=dict(batch_num_tokens=150.0), spread=2.0)

    def test_sequence_level_loss(self):
        # token_level_loss=False: each response's token mean over (count + 1e-8), averaged over the
        # non-empty responses; reco divides by the count itself, so the two differ by about
        # 1e-8 / n relative (the documented count convention), checked here at 1e-7.
        self.compare("ppo token_level_loss=False (count + 1e-8)",
                     lambda: loss_module.PolicyLoss(token_level_loss=False),
                     lambda m, r: ("openrlhf_ppo", dict(overrides={"aggregate.kind": 1.0})),
                     seed=4, per_token=True, tol=1e-7)

    def test_rollout_correction_token_level(self):
        # is_correction_level="token", gating "ratio": the train/rollout ratio exp(old - rollout)
        # (unclamped) masked outside [low, high] ("mask") or clamped into it ("clip"), multiplying
        # the per-token loss: reco.rollout_correction's weights as token_weights.
        for mode, bound in (("mask", "mask"), ("clip", "truncate")):
            gen_seed = 5 + (mode == "clip")

            def make(mode=mode):
                return loss_module.PolicyLoss(is_correction_level="token", is_correction_mode=mode,
                                              is_correction_threshold=(0.8, 1.25))

            gen = torch.Generator().manual_seed(gen_seed)
            worst = 0.0
            for _ in range(24):
                old, new, rollout, adv, tok, mask = ragged_batch(gen, per_token=True)
                x = new.clone().requires_grad_(True)
                lo = make()(x, old, tok, action_mask=mask.double(), rollout_log_probs=rollout)[0]
                lo.backward()
                rc = reco.rollout_correction(old, rollout, mask=mask, level="token", bound=bound, lower=0.8,
                                             upper=1.25, log_ratio_bound=None)
                y = new.clone().requires_grad_(True)
                out = reco.policy_loss("openrlhf_ppo", y, old_logp=old, mask=mask, token_advantages=tok,
                                       token_weights=rc.weights)
                out.loss.backward()
                e = max(abs(out.loss.detach() - lo.detach()).item() / max(1.0, abs(lo).item()),
                        (y.grad - x.grad).abs().max().item() / max(1.0, x.grad.abs().max().item()))
                worst = max(worst, e)
                self.assertLessEqual(e, TOL, f"is_correction_mode={mode}")
            WORST[f"is_correction token/ratio/{mode} [0.8, 1.25]"] = worst


if __name__ == "__main__":
    result = unittest.main(argv=sys.argv[:1], exit=False).result
    for case, e in sorted(WORST.items()):
        print(f"test_openrlhf: {case}: worst relative difference {e:.1e} (24 batches)")
    sys.exit(0 if result.wasSuccessful() else 1)
