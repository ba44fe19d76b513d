"""reco's spellings of Liger Kernel's GRPO losses against Liger's own loss math (liger-kernel from
PyPI, installed with --no-deps).

Liger's fused linear GRPO loss computes, per chunk of rows, the log-probabilities from the hidden
states and then calls ``LigerFusedLinearGRPOFunction.ppo_loss_fn`` on them: that static method is
the whole objective (ratio, clip, KL, aggregation). The test calls it directly on given
log-probabilities, as one chunk holding the whole batch. Liger's package ``__init__`` pulls in its
Triton kernels; only the two loss modules are loaded (their package ``__init__`` files are not
run), and ``torch._dynamo`` (imported by the base module, never called by the loss math) is
stood in for when this torch has none. Skipped (exit code 0, with a message) only when
liger-kernel is not installed and RECO_REQUIRE_LIGER is unset.
"""
import importlib.util
import sys
import unittest

import torch

from standins import StandIns, load_peer_module_or_skip


# torch._dynamo is stood in for only where this torch has none (torch 1.x).
_DYNAMO = StandIns(set(), prefixes=("torch._dynamo",) if importlib.util.find_spec("torch._dynamo") is None else ())
grpo_loss = load_peer_module_or_skip("liger_kernel", "chunked_loss", "grpo_loss", _DYNAMO, "test_liger",
                                     "RECO_REQUIRE_LIGER")
ppo_loss_fn = grpo_loss.LigerFusedLinearGRPOFunction.ppo_loss_fn

import reco  # noqa: E402

TOL = 1e-12
WORST = {}


def ragged_batch(gen, groups=3, G=4, T=9, spread=0.3, full=False):
    """One chunk of B = groups * G completions padded to T: ragged lengths, one empty completion,
    one fully masked, interior masked tokens (``full``: every token valid); advantages per
    completion, normalised per group."""
    B = groups * G
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[1] = T
    lengths[2] = 0
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    holes = torch.rand(B, T, generator=gen) > 0.15
    holes[4] = False
    mask = mask & holes
    if full:
        mask = torch.ones(B, T, dtype=torch.bool)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    new = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread).clamp(max=-1e-3)
    ref = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2).clamp(max=-1e-3)
    rewards = torch.randint(0, 3, (B,), generator=gen).double()
    adv = torch.zeros(B, dtype=torch.float64)
    for g in range(groups):
        r = rewards[g * G:(g + 1) * G]
        adv[g * G:(g + 1) * G] = (r - r.mean()) / (r.std() + 1e-4)
    return old, new, ref, adv, mask


def liger_loss_and_grad(new, mask, adv, old, ref, **cfg):
    x = new.clone().requires_grad_(True)
    m = mask.to(torch.float64)
    loss, _ = ppo_loss_fn(per_token_logps=x, attention_mask=m, advantages=adv, full_attention_mask=m,
                          ref_per_token_logps=ref, old_per_token_logps=old, **cfg)
    loss.backward()
    return loss.detach(), x.grad


def reco_loss_and_grad(preset, new, mask, adv, old, ref, **kw):
    x = new.clone().requires_grad_(True)
    if reco.has_kl_term(preset) or any(k.startswith("kl.") for k in kw.get("overrides", {})):
        kw["ref_logp"] = ref  # read by the preset's KL term (beta 0: contributes 0)
    out = reco.policy_loss(preset, x, old_logp=old, mask=mask, advantages=adv, **kw)
    out.loss.backward()
    return out.loss.detach(), x.grad


# Liger's (and TRL's) defaults as reco overrides: no log-ratio clamp, no dual clip, k3 unclamped.
TOKEN = {"ratio.log_ratio_clamp": 0.0}
PPO = {"clip.eps_low": 0.2, "clip.eps_high": 0.2, "clip.dual_clip": 0.0}


def kl(beta, importance_weighted):
    return {"kl.beta": beta, "kl.estimator": 3.0, "kl.clamp": 0.0, "kl.importance_weighted": float(importance_weighted)}


class LigerOwnLoss(unittest.TestCase):
    """LigerFusedLinearGRPOFunction.ppo_loss_fn against reco.policy_loss, 24 batches per case."""

    def compare(self, case, cfg, spell, seed, batches=24, spread=0.3, full=False):
        gen = torch.Generator().manual_seed(seed)
        worst = 0.0
        for _ in range(batches):
            old, new, ref, adv, mask = ragged_batch(gen, spread=spread, full=full)
            ll, gl = liger_loss_and_grad(new, mask, adv, old, ref, **cfg)
            preset, kw = spell(mask)
            lr, gr = reco_loss_and_grad(preset, new, mask, adv, old, ref, **kw)
            e = max(abs(lr - ll).item() / max(1.0, abs(ll).item()),
                    (gr - gl).abs().max().item() / max(1.0, gl.abs().max().item()))
            worst = max(worst, e)
            self.assertLessEqual(e, TOL, f"{case}: loss {ll.item()} (Liger) vs {lr.item()} (reco)")
            self.assertEqual(int((gr[~mask] != 0).sum()), 0, case)  # masked tokens: exactly zero gradient
        WORST[case] = worst

    def test_grpo(self):
        # Per-completion means averaged over all B completions (an empty one counts as 0).
        for beta, iw in ((0.0, False), (0.04, False), (0.04, True)):
            self.compare(f"grpo beta={beta} use_bias_correction_kl={iw}",
                         dict(loss_type="grpo", beta=beta, use_bias_correction_kl=iw),
                         lambda m: ("grpo", dict(global_responses=m.shape[0], overrides={**TOKEN, **PPO, **kl(beta, iw)})),
                         seed=1 + int(beta * 100) + iw)

    def test_bnpo(self):
        self.compare("bnpo beta=0.04", dict(loss_type="bnpo", beta=0.04),
                     lambda m: ("grpo", dict(overrides={**TOKEN, **PPO, **kl(0.04, False), "aggregate.kind": 0.0})),
                     seed=5)
        self.compare("bnpo (the trl_bnpo preset)", dict(loss_type="bnpo", beta=0.0), lambda m: ("trl_bnpo", {}), seed=6)

    def test_dr_grpo(self):
        self.compare("dr_grpo beta=0.04", dict(loss_type="dr_grpo", beta=0.04, max_completion_length=16),
                     lambda m: ("grpo", dict(overrides={**TOKEN, **PPO, **kl(0.04, False), "aggregate.kind": 3.0,
                                                        "aggregate.max_length": 16.0})),
                     seed=7)

    def test_dapo(self):
        # Liger's default loss_type; the normaliser is the chunk's tokens (num_items_in_batch unset).
        self.compare("dapo epsilon_high=0.28", dict(loss_type="dapo", beta=0.0, epsilon_high=0.28),
                     lambda m: ("grpo", dict(overrides={**TOKEN, **PPO, "clip.eps_high": 0.28, "kl.beta": 0.0,
                                                        "aggregate.kind": 0.0})),
                     seed=8)
        # num_items_in_batch: the generation batch's tokens, reco's global token count.
        self.compare("dapo num_items_in_batch=100", dict(loss_type="dapo", beta=0.0, num_items_in_batch=100),
                     lambda m: ("grpo", dict(global_tokens=100, overrides={**TOKEN, **PPO, "kl.beta": 0.0,
                                                                           "aggregate.kind": 0.0})),
                     seed=9)

    def test_cispo(self):
        # The detached ratio capped at epsilon_high (no lower bound): reco's cispo ratio with
        # eps_high = epsilon_high - 1, eps_low = 1.
        self.compare("cispo epsilon_high=5", dict(loss_type="cispo", beta=0.0, epsilon_high=5.0),
                     lambda m: ("cispo", dict(overrides={**TOKEN, "ratio.eps_low": 1.0, "ratio.eps_high": 4.0})),
                     seed=10)

    def test_sapo(self):
        # Liger's temperatures are Python floats: the trl_sapo peer preset as it is (1 / 1.05).
        self.compare("sapo (the trl_sapo peer preset)", dict(loss_type="sapo", beta=0.0),
                     lambda m: ("trl_sapo", dict(global_responses=m.shape[0])), seed=11)

    def test_luspo(self):
        # Liger 0.8.5 aggregates luspo as sum(per_token_loss * n_i) / (B * T) with the per-token
        # loss *not* masked (TRL's formula before TRL masked it): padding and masked positions add
        # loss and receive gradient. On batches without masked tokens this is reco's kind 4 (the
        # mean over completions of each one's token sum), as TRL computes it today.
        self.compare("luspo beta=0.04, no masked token", dict(loss_type="luspo", beta=0.04),
                     lambda m: ("grpo", dict(overrides={**TOKEN, **PPO, **kl(0.04, False), "aggregate.kind": 4.0})),
                     seed=12, full=True)
        gen = torch.Generator().manual_seed(13)
        old, new, ref, adv, mask = ragged_batch(gen)
        _, gl = liger_loss_and_grad(new, mask, adv, old, ref, loss_type="luspo", beta=0.0)
        _, gr = reco_loss_and_grad("grpo", new, mask, adv, old, ref,
                                   overrides={**TOKEN, **PPO, "kl.beta": 0.0, "aggregate.kind": 4.0})
        self.assertGreater(int((gl[~mask] != 0).sum()), 0)  # Liger: masked positions get gradient
        self.assertEqual(int((gr[~mask] != 0).sum()), 0)  # reco: exactly zero

    def test_vespo(self):
        self.compare("vespo (the trl_vespo preset)", dict(loss_type="vespo", beta=0.0),
                     lambda m: ("trl_vespo", {}), seed=13)

    def test_delta(self):
        for delta in (1.5, 0.95):
            self.compare(f"grpo delta={delta}", dict(loss_type="grpo", beta=0.0, delta=delta),
                         lambda m: ("grpo", dict(global_responses=m.shape[0],
                                                 overrides={**TOKEN, **PPO, "kl.beta": 0.0, "clip.delta": delta})),
                         seed=14 + int(delta * 10), spread=3.0)

    def test_sequence_level(self):
        # importance_sampling_level="sequence": exp of the mean log-ratio, reco's sequence ratio.
        self.compare("grpo importance_sampling_level=sequence",
                     dict(loss_type="grpo", beta=0.0, importance_sampling_level="sequence"),
                     lambda m: ("gspo", dict(global_responses=m.shape[0], overrides={**PPO, "aggregate.kind": 1.0})),
                     seed=16)


if __name__ == "__main__":
    result = unittest.main(argv=sys.argv[:1], exit=False).result
    for case, e in sorted(WORST.items()):
        print(f"test_liger: {case}: worst relative difference {e:.1e} (24 batches)")
    sys.exit(0 if result.wasSuccessful() else 1)
