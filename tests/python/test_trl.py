"""reco against TRL's own GRPO loss (TRL from PyPI, installed with --no-deps), and the TRL hook
reco.integrations.trl.

TRL's loss is GRPOTrainer._compute_loss in trl/trainer/grpo_trainer.py. That module imports
transformers, accelerate, datasets, huggingface_hub, pandas, pyarrow and jinja2 (the trainer's
model, data and logging runtime, which the loss never calls): inert stand-in modules replace them
before TRL is imported, with a small dataclass for transformers.TrainingArguments (GRPOConfig
derives from it, so TRL's own config defaults are read from GRPOConfig's fields). Three
torch.distributed submodules that TRL imports for FSDP / DTensor (fsdp, tensor, _composable) are
stood in too: Debian's torch 1.13 lacks two of them and its fsdp package fails to import on
Python 3.11. Nothing on the loss's path is replaced: the test imports the module, creates a
GRPOTrainer without its __init__ and calls TRL's own _compute_loss (and through it TRL's
get_gamma_weights, get_high_entropy_mask and nanmin/nanmax) with the attributes that method
reads; the model forward (_get_per_token_logps_and_entropies) returns the test's leaf tensors.

Each TRL loss_type is compared with reco.policy_loss spelled as docs/peers.md says, loss and
autograd gradient in float64 on >= 20 random ragged batches (an empty completion, a completion
fully masked by TRL's tool_mask, interior masked tokens), to 1e-12 relative (max |difference| /
max |TRL's value|, for the loss and for the gradient); masked tokens get exactly zero gradient.
The hook
(reco.integrations.trl.grpo_trainer) is tested the same way: with TRL's own loss_type spelled by
reco it equals TRL's _compute_loss; with ReCo's presets it runs, is finite and masks exactly.

Run with a python that has reco, torch and trl; the test is skipped (exit code 0, with a message)
only when trl itself is not installed and RECO_REQUIRE_TRL is unset.
"""
import collections
import dataclasses
import sys
import types
import unittest

import torch

from standins import Inert, StandIns, import_peer_or_skip


class _Inert(Inert):
    """Stand-in classes for TRL's imports: an is_*_available() check returns False."""

    available = False


@dataclasses.dataclass
class _TrainingArguments:
    """transformers.TrainingArguments for GRPOConfig's class body: a dataclass base without
    fields, so that dataclasses.fields(GRPOConfig) lists TRL's own fields and defaults."""

    _VALID_DICT_FIELDS = []


# Versions TRL compares at import (transformers >= 5 selects its current code paths).
_VERSIONS = {"transformers": "5.0.0"}


def _prepare(module):
    module.__version__ = _VERSIONS.get(module.__name__.split(".")[0], "1.0.0")
    if module.__name__ == "transformers":
        module.TrainingArguments = _TrainingArguments


grpo_config, grpo_trainer = import_peer_or_skip(
    "trl", ["trl.trainer.grpo_config", "trl.trainer.grpo_trainer"],
    StandIns({"transformers", "accelerate", "datasets", "huggingface_hub", "pandas", "pyarrow", "jinja2"},
             prefixes=("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed._composable"),
             inert=_Inert, prepare=_prepare),
    "test_trl", "RECO_REQUIRE_TRL")
GRPOTrainer = grpo_trainer.GRPOTrainer

import reco  # noqa: E402
import reco.integrations.trl as reco_trl  # noqa: E402

TOL = 1e-12
TRL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(grpo_config.GRPOConfig)
                if f.default is not dataclasses.MISSING}
# case -> [max relative error of the loss, of the gradient, max absolute error of the loss], printed at the end
WORST = collections.defaultdict(lambda: [0.0, 0.0, 0.0])


def record(case, loss, loss_ref, grad, grad_ref):
    """Both relative errors (max |difference| / max |reference|); returns the larger."""
    w = WORST[case]
    errors = (rel(loss, loss_ref), rel(grad, grad_ref), abs(loss - loss_ref).item())
    WORST[case] = [max(a, b) for a, b in zip(w, errors)]
    return max(errors[:2])


class _Accelerator:
    """One process: TRL's reductions and gathers are the identity."""
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def make_trainer(cls=GRPOTrainer, **cfg):
    """A trainer object carrying the attributes _compute_loss reads, set as GRPOTrainer.__init__
    sets them from a GRPOConfig with TRL's defaults updated by ``cfg``."""
    args = dict(TRL_DEFAULTS)
    args.update(steps_per_generation=1, gradient_accumulation_steps=1)
    args.update(cfg)
    args = types.SimpleNamespace(**args)
    t = object.__new__(cls)
    t.args = args
    t.loss_type = args.loss_type
    t.beta = args.beta
    t.epsilon_low = args.epsilon
    t.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.importance_sampling_level = args.importance_sampling_level
    t.top_entropy_quantile = args.top_entropy_quantile
    t.off_policy_mask_threshold = args.off_policy_mask_threshold
    t.max_completion_length = args.max_completion_length
    t.num_generations = args.num_generations
    t.use_vllm = args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t.aux_loss_enabled = False
    t.entropy_coef = args.entropy_coef
    t.use_adaptive_entropy = args.use_adaptive_entropy
    t._entropy_bonus_enabled = t.entropy_coef != 0.0 or t.use_adaptive_entropy
    t._last_world_entropy = float("inf")
    t._entropy_window_stats = None
    t.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    t.model = types.SimpleNamespace(training=True)
    t.accelerator = _Accelerator()
    t._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
    return t


def ragged_batch(gen, groups=3, G=4, T=9, tool_mask=True, empty=True, items_scale=1.0, spread=0.3):
    """TRL's inputs for one micro-batch: completions padded on the right to T, ragged lengths,
    one empty completion, one completion that TRL's tool_mask masks entirely, and interior
    tool-masked tokens; advantages per completion, normalised within groups of G."""
    B = groups * G
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[1] = T
    if empty:
        lengths[2] = 0
    completion_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).long()
    inputs = {
        "prompt_ids": torch.randint(0, 50, (B, 3), generator=gen),
        "prompt_mask": torch.ones(B, 3, dtype=torch.long),
        "completion_ids": torch.randint(0, 50, (B, T), generator=gen),
        "completion_mask": completion_mask,
    }
    mask = completion_mask.clone()
    if tool_mask:
        tm = (torch.rand(B, T, generator=gen) > 0.15).long()
        tm[4] = 0  # a completion with tokens, all of them masked
        inputs["tool_mask"] = tm
        mask = mask * tm
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    new = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * spread).clamp(max=-1e-3)
    ref = (old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.2).clamp(max=-1e-3)
    rewards = torch.randint(0, 3, (B,), generator=gen).double()
    adv = torch.zeros(B, dtype=torch.float64)
    for g in range(groups):
        r = rewards[g * G:(g + 1) * G]
        adv[g * G:(g + 1) * G] = (r - r.mean()) / (r.std() + 1e-4)
    # Entropies on a grid of 1/64 (exact in float32, where TRL takes its quantile).
    entropy = torch.randint(0, 160, (B, T), generator=gen).double() / 64
    inputs.update(advantages=adv, old_per_token_logps=old, ref_per_token_logps=ref,
                  # the generation batch's token count: this micro-batch's times items_scale
                  num_items_in_batch=torch.tensor(float(round(float(mask.sum()) * items_scale))),
                  importance_sampling_ratio=torch.exp(torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.1)
                  .clamp(max=2.0))
    return inputs, new, entropy, mask.bool()


def quantile_batch(gen, rho, **kw):
    """ragged_batch, drawn again while TRL's entropy quantile would sit exactly on an element.
    TRL takes torch.quantile in float32, which places the (1 - rho) quantile at position
    (1 - rho)(n - 1) computed in float32: where that position is an integer in exact arithmetic,
    the rounded one lies just past it (torch 2.x) and the threshold a few ulps above that
    element, which TRL then leaves out while the exact quantile (reco's) keeps it. A tie
    convention of rounding; the test compares the batches without it."""
    while True:
        batch = ragged_batch(gen, **kw)
        position = (1.0 - rho) * (int(batch[3].sum()) - 1)
        if rho >= 1.0 or abs(position - round(position)) > 1e-6:
            return batch


def trl_loss_and_grad(trainer, inputs, logp, entropy):
    """TRL's own _compute_loss on ``inputs``, the model forward returning ``logp`` (a fresh leaf)."""
    x = logp.clone().requires_grad_(True)
    T = inputs["completion_ids"].shape[1]

    def forward(model, input_ids, attention_mask, logits_to_keep, compute_entropy=False, compute_aux_loss=False,
                **kw):
        assert logits_to_keep == T and input_ids.shape[1] == T + inputs["prompt_ids"].shape[1]
        return x, entropy, None

    trainer._get_per_token_logps_and_entropies = forward
    loss = type(trainer)._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), x.grad


def reco_loss_and_grad(preset, inputs, logp, mask, **kw):
    x = logp.clone().requires_grad_(True)
    if "ref_logp" not in kw and (reco.has_kl_term(preset) or any(k.startswith("kl.") for k in kw.get("overrides", {}))):
        kw["ref_logp"] = inputs["ref_per_token_logps"]  # read by the preset's KL term (beta 0: contributes 0)
    out = reco.policy_loss(preset, x, old_logp=inputs["old_per_token_logps"], mask=mask,
                           advantages=inputs["advantages"], **kw)
    out.loss.backward()
    return out.loss.detach(), x.grad, out


def rel(a, b):
    return (a - b).abs().max().item() / max(1e-300, b.abs().max().item())


# TRL's defaults as reco overrides (docs/peers.md): no log-ratio clamp, no dual clip, k3 unclamped.
TOKEN = {"ratio.log_ratio_clamp": 0.0}
PPO = {"clip.eps_low": 0.2, "clip.eps_high": 0.2, "clip.dual_clip": 0.0}
KL_OFF = {"kl.beta": 0.0}


def kl(beta, importance_weighted):
    return {"kl.beta": beta, "kl.estimator": 3.0, "kl.clamp": 0.0, "kl.importance_weighted": float(importance_weighted)}


class TrlOwnLoss(unittest.TestCase):
    """TRL's GRPOTrainer._compute_loss against reco.policy_loss."""

    def compare(self, case, cfg, spell, batches=24, seed=0, batch_kw=None, check=None):
        """``spell(inputs, mask)`` -> (preset, reco keyword arguments) for TRL's config ``cfg``."""
        gen = torch.Generator().manual_seed(seed)
        trainer = make_trainer(**cfg)
        for _ in range(batches):
            inputs, logp, entropy, mask = quantile_batch(gen, trainer.top_entropy_quantile, **(batch_kw or {}))
            if not (trainer.use_vllm and trainer.vllm_importance_sampling_correction):
                del inputs["importance_sampling_ratio"]  # TRL puts it in the inputs only then
            lt, gt = trl_loss_and_grad(trainer, inputs, logp, entropy)
            preset, kw = spell(inputs, mask, entropy)
            lr, gr, out = reco_loss_and_grad(preset, inputs, logp, mask, **kw)
            e = record(case, lr, lt, gr, gt)
            self.assertLessEqual(e, TOL, f"{case}: loss {lt.item()} (TRL) vs {lr.item()} (reco)")
            self.assertEqual(int((gr[~mask] != 0).sum()), 0, case)  # masked tokens: exactly zero gradient
            if check is not None:
                check(out, inputs, mask)

    def test_grpo(self):
        # TRL averages the per-completion means over all B completions (an empty one counts as 0);
        # reco over the non-empty ones unless the call's response count is given.
        for beta, iw in ((0.0, False), (0.04, True), (0.04, False)):
            self.compare(f"grpo beta={beta} bias_correction_kl={iw}",
                         dict(loss_type="grpo", beta=beta, use_bias_correction_kl=iw),
                         lambda inp, m, h: ("grpo", dict(ref_logp=inp["ref_per_token_logps"],
                                                         global_responses=m.shape[0],
                                                         overrides={**TOKEN, **PPO, **kl(beta, iw)})),
                         seed=1 + int(beta * 100) + iw)

    def test_grpo_with_gradient_accumulation(self):
        # TRL divides the micro-batch's loss by the accumulation steps: reco's loss of the call, /4.
        gen = torch.Generator().manual_seed(40)
        trainer = make_trainer(loss_type="grpo", gradient_accumulation_steps=4)
        inputs, logp, entropy, mask = ragged_batch(gen)
        lt, gt = trl_loss_and_grad(trainer, inputs, logp, entropy)
        lr, gr, _ = reco_loss_and_grad("grpo", inputs, logp, mask, global_responses=mask.shape[0],
                                       overrides={**TOKEN, **PPO, **KL_OFF})
        self.assertLessEqual(rel(lr / 4, lt), TOL)
        self.assertLessEqual(rel(gr / 4, gt), TOL)

    def test_grpo_empty_completion_convention(self):
        # Without the response count reco averages over the non-empty completions only: the two
        # differ exactly by that factor (docs/peers.md), and agree on batches without an empty one.
        gen = torch.Generator().manual_seed(41)
        trainer = make_trainer(loss_type="grpo")
        inputs, logp, entropy, mask = ragged_batch(gen)
        lt, _ = trl_loss_and_grad(trainer, inputs, logp, entropy)
        lr, _, _ = reco_loss_and_grad("grpo", inputs, logp, mask, overrides={**TOKEN, **PPO, **KL_OFF})
        nonempty = int(mask.any(1).sum())
        self.assertLess(nonempty, mask.shape[0])
        self.assertGreater(abs(lr - lt).item(), 1e-6 * abs(lt).item())
        self.assertLessEqual(abs(lr * nonempty / mask.shape[0] - lt).item(), TOL * abs(lt).item())
        self.compare("grpo, no empty completion, reco's own count", dict(loss_type="grpo"),
                     lambda inp, m, h: ("grpo", dict(overrides={**TOKEN, **PPO, **KL_OFF})),
                     seed=42, batch_kw=dict(empty=False, tool_mask=False))

    def test_grpo_sequence_level(self):
        # importance_sampling_level="sequence": reco's sequence ratio (the gspo preset's), TRL's caps.
        self.compare("grpo importance_sampling_level=sequence",
                     dict(loss_type="grpo", importance_sampling_level="sequence"),
                     lambda inp, m, h: ("gspo", dict(global_responses=m.shape[0],
                                                     overrides={**PPO, "aggregate.kind": 1.0})),
                     seed=3)

    def test_bnpo(self):
        for beta, iw in ((0.0, False), (0.04, True)):
            self.compare(f"bnpo beta={beta} bias_correction_kl={iw}",
                         dict(loss_type="bnpo", beta=beta, use_bias_correction_kl=iw),
                         lambda inp, m, h: ("grpo", dict(ref_logp=inp["ref_per_token_logps"],
                                                         overrides={**TOKEN, **PPO, **kl(beta, iw),
                                                                    "aggregate.kind": 0.0})),
                         seed=5 + iw)
        self.compare("bnpo (the trl_bnpo preset)", dict(loss_type="bnpo"),
                     lambda inp, m, h: ("trl_bnpo", {}), seed=7)

    def test_dr_grpo(self):
        # Sum over the call's tokens / (B * max_completion_length), B counting every completion.
        for beta in (0.0, 0.04):
            self.compare(f"dr_grpo beta={beta}", dict(loss_type="dr_grpo", beta=beta, max_completion_length=16),
                         lambda inp, m, h: ("grpo", dict(ref_logp=inp["ref_per_token_logps"],
                                                         overrides={**TOKEN, **PPO, **kl(beta, True),
                                                                    "aggregate.kind": 3.0,
                                                                    "aggregate.max_length": 16.0})),
                         seed=8 + int(beta * 100))

    def test_dapo(self):
        # TRL divides by num_items_in_batch (the generation batch's tokens) / num_processes *
        # gradient_accumulation_steps / steps_per_generation: here 4 / 4, the generation batch's
        # token count passed to reco as global_tokens.
        def spell(inp, m, h):
            return "grpo", dict(ref_logp=inp["ref_per_token_logps"], global_tokens=int(inp["num_items_in_batch"]),
                                overrides={**TOKEN, "clip.eps_low": 0.2, "clip.eps_high": 0.28,
                                           "clip.dual_clip": 0.0, **kl(0.04, True), "aggregate.kind": 0.0})

        self.compare("dapo beta=0.04 (generation batch of 4 micro-batches)",
                     dict(loss_type="dapo", beta=0.04, epsilon_high=0.28, gradient_accumulation_steps=4,
                          steps_per_generation=4),
                     spell, seed=10, batch_kw=dict(items_scale=3.5))

    def test_cispo(self):
        # TRL caps the detached ratio at epsilon_high itself: reco's cispo ratio with eps_high =
        # epsilon_high - 1 and no lower bound (eps_low = 1).
        for eps_high in (5.0, 1.1):
            self.compare(f"cispo epsilon_high={eps_high}", dict(loss_type="cispo", epsilon_high=eps_high),
                         lambda inp, m, h: ("cispo", dict(global_tokens=int(inp["num_items_in_batch"]),
                                                          overrides={**TOKEN, "ratio.eps_low": 1.0,
                                                                     "ratio.eps_high": eps_high - 1.0})),
                         seed=11 + int(eps_high), batch_kw=dict(items_scale=2.0))

    def test_luspo(self):
        # Token level: the mean over all B completions of each one's token sum (aggregate kind 4).
        for beta in (0.0, 0.04):
            self.compare(f"luspo beta={beta}", dict(loss_type="luspo", beta=beta),
                         lambda inp, m, h: ("grpo", dict(ref_logp=inp["ref_per_token_logps"],
                                                         overrides={**TOKEN, **PPO, **kl(beta, True),
                                                                    "aggregate.kind": 4.0})),
                         seed=13 + int(beta * 100))
        self.compare("luspo importance_sampling_level=sequence (the trl_luspo preset)",
                     dict(loss_type="luspo", importance_sampling_level="sequence"),
                     lambda inp, m, h: ("trl_luspo", {}), seed=14)

    def test_vespo(self):
        self.compare("vespo (the trl_vespo preset)", dict(loss_type="vespo"),
                     lambda inp, m, h: ("trl_vespo", dict(global_tokens=int(inp["num_items_in_batch"]))),
                     seed=15, batch_kw=dict(items_scale=1.5))
        self.compare("vespo k/lambda 1.5/2.5, 2.5/1.5",
                     dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5,
                          vespo_lambda_neg=1.5),
                     lambda inp, m, h: ("trl_vespo", dict(global_tokens=int(inp["num_items_in_batch"]), overrides={
                         "ratio.k_pos": 1.5, "ratio.lambda_pos": 2.5, "ratio.k_neg": 2.5, "ratio.lambda_neg": 1.5})),
                     seed=16)

    def test_sapo(self):
        # SAPO's gate, per-completion means over all B completions: the trl_sapo peer preset. TRL's
        # temperatures are a float32 tensor (torch.where of Python floats): the convention aligned
        # here is tau rounded to float32; with the exact 1.05 the two differ by ~3e-7 relative.
        f32 = lambda t: float(torch.tensor(t, dtype=torch.float32))
        self.compare("sapo (the trl_sapo peer preset, tau_neg as float32)", dict(loss_type="sapo"),
                     lambda inp, m, h: ("trl_sapo", dict(global_responses=m.shape[0],
                                                         overrides={"ratio.tau_neg": f32(1.05)})), seed=17)
        self.compare("sapo temperatures 0.8 / 1.3", dict(loss_type="sapo", sapo_temperature_pos=0.8,
                                                         sapo_temperature_neg=1.3),
                     lambda inp, m, h: ("trl_sapo", dict(global_responses=m.shape[0],
                                                         overrides={"ratio.tau_pos": f32(0.8),
                                                                    "ratio.tau_neg": f32(1.3)})),
                     seed=18)
        # The peer preset's exact 1.05 against TRL's float32 one: close, not equal.
        gen = torch.Generator().manual_seed(19)
        inputs, logp, entropy, mask = ragged_batch(gen)
        del inputs["importance_sampling_ratio"]
        lt, _ = trl_loss_and_grad(make_trainer(loss_type="sapo"), inputs, logp, entropy)
        lr, _, _ = reco_loss_and_grad("trl_sapo", inputs, logp, mask, global_responses=mask.shape[0])
        self.assertLess(rel(lr, lt), 1e-5)

    def test_delta(self):
        # Two-sided clipping: the unclipped ratio capped at delta for both advantage signs.
        for delta in (1.5, 1.1, 0.95):
            self.compare(f"grpo delta={delta}", dict(loss_type="grpo", delta=delta),
                         lambda inp, m, h: ("grpo", dict(global_responses=m.shape[0],
                                                         overrides={**TOKEN, **PPO, **KL_OFF, "clip.delta": delta})),
                         seed=17 + int(delta * 10), batch_kw=dict(spread=3.0))

    def test_top_entropy_quantile(self):
        # TRL keeps the tokens whose entropy is >= the (1 - rho)-quantile of the valid tokens' entropies;
        # the masked tokens still count in the normaliser (denominator = valid).
        sel = lambda rho: {"select.rule": 1.0, "select.rho": rho, "select.denominator": 0.0}  # noqa: E731
        for rho in (0.2, 0.5):
            self.compare(f"grpo top_entropy_quantile={rho}", dict(loss_type="grpo", top_entropy_quantile=rho),
                         lambda inp, m, h: ("rule_80_20", dict(entropy=h, global_responses=m.shape[0], overrides={
                             **TOKEN, **PPO, **sel(rho), "aggregate.kind": 1.0})),
                         seed=19 + int(rho * 10))
        self.compare("dapo top_entropy_quantile=0.2",
                     dict(loss_type="dapo", top_entropy_quantile=0.2, epsilon_high=0.28),
                     lambda inp, m, h: ("rule_80_20", dict(entropy=h, global_tokens=int(inp["num_items_in_batch"]),
                                                           overrides={**TOKEN, **sel(0.2), "clip.dual_clip": 0.0})),
                     seed=21)

    def test_vllm_importance_sampling_correction(self):
        # TRL multiplies the policy term (not the KL) by the vLLM ratio: reco's token weights.
        vllm = dict(use_vllm=True, vllm_importance_sampling_correction=True)
        self.compare("grpo + vLLM IS ratio, beta=0.04", dict(loss_type="grpo", beta=0.04, **vllm),
                     lambda inp, m, h: ("grpo", dict(ref_logp=inp["ref_per_token_logps"], global_responses=m.shape[0],
                                                     token_weights=inp["importance_sampling_ratio"],
                                                     overrides={**TOKEN, **PPO, **kl(0.04, True)})),
                     seed=22)
        self.compare("cispo + vLLM IS ratio", dict(loss_type="cispo", epsilon_high=1.1, **vllm),
                     lambda inp, m, h: ("cispo", dict(global_tokens=int(inp["num_items_in_batch"]),
                                                      token_weights=inp["importance_sampling_ratio"],
                                                      overrides={**TOKEN, "ratio.eps_low": 1.0,
                                                                 "ratio.eps_high": 0.1})),
                     seed=23)
        # At sequence-level importance sampling TRL multiplies the response's one loss value by each
        # token's ratio, so the gradient of the sum reaches every token of the response evenly;
        # reco's sequence ratio is per token (GSPO-token form) and each token's weight stays on
        # that token. Aligned: token weights = the response's mean ratio over its valid tokens.
        def sequence_spelling(preset, over):
            def spell(inp, m, h):
                return preset, dict(global_responses=m.shape[0], overrides=over,
                                    token_weights=response_mean(inp["importance_sampling_ratio"], m))
            return spell

        self.compare("luspo sequence + vLLM IS ratio (response mean)",
                     dict(loss_type="luspo", importance_sampling_level="sequence", **vllm),
                     sequence_spelling("trl_luspo", {}), seed=24)
        self.compare("grpo sequence + vLLM IS ratio (response mean)",
                     dict(loss_type="grpo", importance_sampling_level="sequence", **vllm),
                     sequence_spelling("gspo", {**PPO, "aggregate.kind": 1.0}), seed=25)

    def test_sequence_level_with_per_token_weights(self):
        # The convention above, shown: with the per-token ratios themselves the loss is the same,
        # each response's gradient sums to the same value, but it is spread differently.
        gen = torch.Generator().manual_seed(30)
        trainer = make_trainer(loss_type="luspo", importance_sampling_level="sequence", use_vllm=True,
                               vllm_importance_sampling_correction=True)
        inputs, logp, entropy, mask = ragged_batch(gen)
        lt, gt = trl_loss_and_grad(trainer, inputs, logp, entropy)
        lr, gr, _ = reco_loss_and_grad("trl_luspo", inputs, logp, mask,
                                       token_weights=inputs["importance_sampling_ratio"])
        self.assertLessEqual(rel(lr, lt), TOL)
        self.assertLessEqual(rel(gr.sum(1), gt.sum(1)), TOL)
        self.assertGreater(rel(gr, gt), 1e-3)


def response_mean(x, mask):
    """Each response's mean of x over its valid tokens, broadcast along the response."""
    m = mask.double()
    return ((x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)).expand_as(x).contiguous()

# TRL configurations the hook is checked on (TRL's own loss_type through reco, and explicit presets).
HOOK_CASES = [
    ("grpo beta=0.04, accumulation 2", dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2)),
    ("grpo beta=0.04 no bias correction, eval", dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False,
                                                     _eval=True)),
    ("grpo delta=1.1", dict(loss_type="grpo", delta=1.1)),
    ("grpo sequence", dict(loss_type="grpo", importance_sampling_level="sequence")),
    ("grpo + vLLM IS ratio", dict(loss_type="grpo", beta=0.04, use_vllm=True,
                                  vllm_importance_sampling_correction=True)),
    ("bnpo beta=0.04, accumulation 2", dict(loss_type="bnpo", beta=0.04, gradient_accumulation_steps=2)),
    ("dr_grpo beta=0.04", dict(loss_type="dr_grpo", beta=0.04, max_completion_length=16)),
    ("dapo beta=0.04, accumulation 4 of 4", dict(loss_type="dapo", beta=0.04, epsilon_high=0.28,
                                                 gradient_accumulation_steps=4, steps_per_generation=4)),
    ("dapo, accumulation 2 of 4, eval", dict(loss_type="dapo", gradient_accumulation_steps=2, steps_per_generation=4,
                                             _eval=True)),
    ("dapo top_entropy_quantile=0.2", dict(loss_type="dapo", top_entropy_quantile=0.2)),
    ("cispo epsilon_high=1.1 + vLLM IS ratio", dict(loss_type="cispo", epsilon_high=1.1, use_vllm=True,
                                                    vllm_importance_sampling_correction=True)),
    ("luspo beta=0.04", dict(loss_type="luspo", beta=0.04)),
    ("luspo sequence + vLLM IS ratio", dict(loss_type="luspo", importance_sampling_level="sequence", use_vllm=True,
                                            vllm_importance_sampling_correction=True)),
    ("vespo k_pos=1.5", dict(loss_type="vespo", vespo_k_pos=1.5)),
    ("sapo temperature_neg=1.3, accumulation 2", dict(loss_type="sapo", sapo_temperature_neg=1.3,
                                                       gradient_accumulation_steps=2)),
    ("cispo at TRL's default epsilon_high (= epsilon, a cap below 1)", dict(loss_type="cispo")),
    ("cispo epsilon_high=0.9 + vLLM IS ratio", dict(loss_type="cispo", epsilon_high=0.9, use_vllm=True,
                                                    vllm_importance_sampling_correction=True)),
    ("grpo off_policy_mask_threshold=0.05, beta=0.04", dict(loss_type="grpo", beta=0.04,
                                                            off_policy_mask_threshold=0.05)),
    ("dapo off_policy_mask_threshold=0 + vLLM sampling logps", dict(loss_type="dapo", off_policy_mask_threshold=0.0,
                                                                    _sampling=True)),
    ("luspo sequence off_policy_mask_threshold=0.02", dict(loss_type="luspo", importance_sampling_level="sequence",
                                                           off_policy_mask_threshold=0.02)),
    ("grpo entropy_coef=0.05, accumulation 2", dict(loss_type="grpo", entropy_coef=0.05,
                                                   gradient_accumulation_steps=2)),
    ("dapo entropy_coef=0.05 top_entropy_quantile=0.5, eval", dict(loss_type="dapo", entropy_coef=0.05,
                                                                  top_entropy_quantile=0.5, _eval=True)),
    ("dapo adaptive entropy, below the target", dict(loss_type="dapo", use_adaptive_entropy=True, entropy_target=10.0,
                                                     entropy_coef=0.02, _state={"_last_world_entropy": 1.0})),
    ("bnpo adaptive entropy, above the target", dict(loss_type="bnpo", use_adaptive_entropy=True, entropy_target=0.5,
                                                     entropy_coef=0.02, _state={"_last_world_entropy": 1.0})),
]


def make(cls, cfg):
    cfg = dict(cfg)
    evaluation = cfg.pop("_eval", False)
    cfg.pop("_sampling", None)
    state = cfg.pop("_state", {})
    t = make_trainer(cls=cls, **cfg)
    t.model.training = not evaluation
    for k, v in state.items():
        setattr(t, k, v)
    return t


class TrlHook(unittest.TestCase):
    """reco.integrations.trl.grpo_trainer: reco's objective as GRPOTrainer's loss."""

    def both(self, hook_cls, cfg, gen, batch_kw=None):
        trl_trainer, hook_trainer = make(GRPOTrainer, cfg), make(hook_cls, cfg)
        inputs, logp, entropy, mask = quantile_batch(gen, trl_trainer.top_entropy_quantile, **(batch_kw or {}))
        if not (trl_trainer.use_vllm and trl_trainer.vllm_importance_sampling_correction):
            del inputs["importance_sampling_ratio"]
        if cfg.get("_sampling"):  # vLLM's own log-probabilities of the sampled tokens
            inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] + 0.05 * torch.randn(
                logp.shape, generator=gen, dtype=logp.dtype)
        lt, gt = trl_loss_and_grad(trl_trainer, inputs, logp, entropy)
        lh, gh = trl_loss_and_grad(hook_trainer, inputs, logp, entropy)
        # The adaptive entropy controller moves the same way in both.
        for k in ("entropy_coef", "_last_world_entropy"):
            self.assertEqual(getattr(trl_trainer, k), getattr(hook_trainer, k), k)
        self.assertEqual(trl_trainer._metrics["train"].get("entropy_coef"), hook_trainer._metrics["train"].get(
            "entropy_coef"))
        return (lt, gt), (lh, gh), mask, hook_trainer

    def test_trl_loss_types_through_the_hook(self):
        hook = reco_trl.grpo_trainer(None, base=GRPOTrainer)  # TRL's own loss_type, computed by reco
        for n, (case, cfg) in enumerate(HOOK_CASES):
            gen = torch.Generator().manual_seed(100 + n)
            for _ in range(20):
                (lt, gt), (lh, gh), mask, _ = self.both(hook, cfg, gen)
                e = record("hook: " + case, lh, lt, gh, gt)
                self.assertLessEqual(e, TOL, case)
                self.assertEqual(int((gh[~mask] != 0).sum()), 0, case)

    def test_knobs_change_the_loss(self):
        # The knobs above are not inert on these batches: each changes TRL's loss (and the hook's
        # equals it, checked above).
        hook = reco_trl.grpo_trainer(None, base=GRPOTrainer)
        pairs = [(dict(loss_type="grpo", off_policy_mask_threshold=0.05), dict(loss_type="grpo")),
                 (dict(loss_type="grpo", entropy_coef=0.05), dict(loss_type="grpo")),
                 (dict(loss_type="cispo"), dict(loss_type="cispo", epsilon_high=1.0))]
        for on, off in pairs:
            gen = torch.Generator().manual_seed(60)
            inputs, logp, entropy, mask = ragged_batch(gen)
            del inputs["importance_sampling_ratio"]
            lt_on, _ = trl_loss_and_grad(make(GRPOTrainer, on), inputs, logp, entropy)
            lt_off, _ = trl_loss_and_grad(make(GRPOTrainer, off), inputs, logp, entropy)
            lh_on, _ = trl_loss_and_grad(make(hook, on), inputs, logp, entropy)
            self.assertGreater(abs(lt_on - lt_off).item(), 1e-6 * abs(lt_off).item(), on)
            self.assertLessEqual(rel(lh_on, lt_on), TOL, on)

    def test_explicit_presets_equal_trl(self):
        dapo = reco_trl.grpo_trainer("dapo", {"ratio.log_ratio_clamp": 0.0, "clip.dual_clip": 0.0}, base=GRPOTrainer)
        bnpo = reco_trl.grpo_trainer("trl_bnpo", base=GRPOTrainer)
        for hook, cfg in ((dapo, dict(loss_type="dapo", epsilon_high=0.28, gradient_accumulation_steps=2,
                                      steps_per_generation=2)),
                          (bnpo, dict(loss_type="bnpo", gradient_accumulation_steps=3))):
            gen = torch.Generator().manual_seed(7)
            for _ in range(20):
                (lt, gt), (lh, gh), _, _ = self.both(hook, cfg, gen, dict(items_scale=2.0))
                e = record(f"hook: preset {hook.reco_preset}", lh, lt, gh, gt)
                self.assertLessEqual(e, TOL, hook.reco_preset)

    def test_reco_preset(self):
        # ReCo's preset on TRL's inputs: finite gradient, exactly zero on masked tokens, equal to
        # reco.policy_loss on the micro-batch (G = num_generations, TRL's normalisation).
        hook = reco_trl.grpo_trainer("reco", {"weight.cap": 0.0}, base=GRPOTrainer)
        gen = torch.Generator().manual_seed(50)
        inputs, logp, entropy, mask = ragged_batch(gen, groups=3, G=4)
        del inputs["importance_sampling_ratio"]
        cfg = dict(loss_type="grpo", beta=0.001, num_generations=4, gradient_accumulation_steps=2)
        trainer = make(hook, cfg)
        l4, g4 = trl_loss_and_grad(trainer, inputs, logp, entropy)
        self.assertTrue(bool(torch.isfinite(g4).all()))
        self.assertEqual(int((g4[~mask] != 0).sum()), 0)
        self.assertGreater(int((g4[mask] != 0).sum()), 0)
        direct = reco.policy_loss("reco", logp, old_logp=inputs["old_per_token_logps"],
                                  ref_logp=inputs["ref_per_token_logps"], mask=mask, advantages=inputs["advantages"],
                                  group_size=4, global_responses=12,
                                  overrides={"weight.cap": 0.0, "kl.beta": 0.001, "kl.importance_weighted": 1.0,
                                             "clip.eps_low": 0.2, "clip.eps_high": 0.2})
        self.assertLessEqual(abs(direct.loss / 2 - l4).item(), TOL * abs(l4).item())
        self.assertIn("reco/weight_mean", trainer._metrics["train"])
        # G = 8 over a micro-batch of 12 completions (not whole groups): completed with empty ones.
        # The uncapped weight 1/(G pbar_old) halves, so without a KL term the loss halves.
        l4, g4 = trl_loss_and_grad(make(hook, dict(cfg, beta=0.0)), inputs, logp, entropy)
        l8, g8 = trl_loss_and_grad(make(hook, dict(cfg, beta=0.0, num_generations=8)), inputs, logp, entropy)
        self.assertLessEqual(abs(2 * l8 - l4).item(), TOL * abs(l4).item())
        self.assertLessEqual(rel(2 * g8, g4), TOL)
        self.assertEqual(int((g8[~mask] != 0).sum()), 0)

    def test_rule_80_20_reco_preset(self):
        hook = reco_trl.grpo_trainer("rule_80_20_reco", base=GRPOTrainer)
        gen = torch.Generator().manual_seed(51)
        inputs, logp, entropy, mask = ragged_batch(gen)
        del inputs["importance_sampling_ratio"]
        loss, grad = trl_loss_and_grad(make(hook, dict(loss_type="dapo", num_generations=4)), inputs, logp, entropy)
        self.assertTrue(bool(torch.isfinite(grad).all()) and bool(torch.isfinite(loss)))
        self.assertEqual(int((grad[~mask] != 0).sum()), 0)
        kept = int((grad != 0).sum())
        self.assertGreater(kept, 0)
        self.assertLessEqual(kept, int(torch.ceil(torch.tensor(0.2 * float(mask.sum())))))

    def test_per_token_advantages_and_the_mixin(self):
        # A [B, T] advantage tensor constant along each completion is the per-completion one;
        # one that varies along a completion is read per token, as TRL's own loss reads it. The
        # mixin on a trainer class of one's own.
        class Mine(reco_trl.RecoLoss, GRPOTrainer):
            reco_preset = None
        gen = torch.Generator().manual_seed(53)
        inputs, logp, entropy, mask = ragged_batch(gen)
        del inputs["importance_sampling_ratio"]
        cfg = dict(loss_type="grpo", beta=0.04)
        lt, gt = trl_loss_and_grad(make(GRPOTrainer, cfg), inputs, logp, entropy)
        wide = dict(inputs, advantages=inputs["advantages"].unsqueeze(1).expand_as(logp).clone())
        lm, gm = trl_loss_and_grad(make(Mine, cfg), wide, logp, entropy)
        self.assertLessEqual(max(rel(lm, lt), rel(gm, gt)), TOL)
        for case in range(20):
            varying = dict(wide, advantages=wide["advantages"] + 0.5 * torch.randn(logp.shape, generator=gen,
                                                                                   dtype=logp.dtype))
            for loss_type in ("grpo", "dapo", "bnpo"):
                c = dict(cfg, loss_type=loss_type)
                lt, gt = trl_loss_and_grad(make(GRPOTrainer, c), varying, logp, entropy)
                lm, gm = trl_loss_and_grad(make(Mine, c), varying, logp, entropy)
                e = record(f"per-token advantages, {loss_type}", lm, lt, gm, gt)
                self.assertLessEqual(e, TOL, loss_type)
                self.assertEqual(int((gm[~mask] != 0).sum()), 0)
        with self.assertRaisesRegex(ValueError, "advantages"):
            trl_loss_and_grad(make(Mine, cfg), dict(inputs, advantages=inputs["advantages"][:-1, None].expand(
                logp.shape[0] - 1, 3).clone()), logp, entropy)

    def test_errors_name_what_is_wrong(self):
        gen = torch.Generator().manual_seed(52)
        inputs, logp, entropy, mask = ragged_batch(gen)
        cases = [
            (reco_trl.grpo_trainer("gspo", base=GRPOTrainer), dict(beta=0.04), "beta"),
            (reco_trl.grpo_trainer("reco", base=GRPOTrainer), dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
            (reco_trl.grpo_trainer("reco", {"weight.normalise": 1.0}, base=GRPOTrainer), {}, "group_mean"),
            (reco_trl.grpo_trainer("reco", {"select.rho": 0.1}, base=GRPOTrainer), {}, "select.rho"),
            (reco_trl.grpo_trainer(None, base=GRPOTrainer), dict(loss_type="sapo", importance_sampling_level="sequence"),
             "sapo"),
        ]
        for hook, cfg, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                trl_loss_and_grad(make(hook, cfg), inputs, logp, entropy)
        with self.assertRaisesRegex(ValueError, "unknown preset 'nope'"):
            reco_trl.grpo_trainer("nope", base=GRPOTrainer)
        with self.assertRaisesRegex(ValueError, "token_count"):
            reco_trl.grpo_trainer("dapo", base=GRPOTrainer, token_count="all")


if __name__ == "__main__":
    result = unittest.main(exit=False).result
    print(f"  {'case (TRL 1.16 _compute_loss vs reco)':62s} rel. loss  rel. grad  abs. loss")
    for case, (el, eg, ea) in sorted(WORST.items()):
        print(f"  {case:62s} {el:9.1e}  {eg:9.1e}  {ea:9.1e}")
    sys.exit(0 if result.wasSuccessful() else 1)
