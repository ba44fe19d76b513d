"""reco's objectives as the loss of TRL's ``GRPOTrainer``.

    import reco.integrations.trl as reco_trl
    from trl import GRPOConfig

    Trainer = reco_trl.grpo_trainer("reco")          # a subclass of trl.GRPOTrainer
    trainer = Trainer(model=..., reward_funcs=..., args=GRPOConfig(num_generations=8, beta=0.001, ...),
                      train_dataset=...)
    trainer.train()

``grpo_trainer(preset, overrides)`` returns a subclass of ``trl.GRPOTrainer`` (or of ``base``)
whose ``_compute_loss`` runs the model forward exactly as TRL does and then computes reco's
``preset`` on TRL's own loss inputs; everything else (generation, rewards, advantages, the
optimiser) stays TRL's. ``grpo_trainer(None)`` computes TRL's own ``loss_type`` with reco (the
spelling docs/peers.md gives, :func:`spelling`).

What the loss reads from TRL:

- **advantages**: ``inputs["advantages"]`` (per completion; a ``[B, T]`` tensor constant along each
  completion is the same, one that varies along a completion is read per token, as TRL reads it).
- **old / ref log-probabilities**: ``inputs["old_per_token_logps"]`` (the current ones, detached,
  when TRL omits them) and ``inputs["ref_per_token_logps"]`` (present when ``beta != 0``).
- **mask**: ``completion_mask`` times ``tool_mask`` when present.
- **G** (ReCo's expected-count weight 1/(G·pbar_old)): ``num_generations``. TRL's micro-batches
  hold shuffled completions of several prompts, not whole groups; the weight reads only G, so a
  micro-batch of B completions, B not a multiple of G, is completed with empty completions
  (weight 0, no tokens). ``weight.normalise = group_mean`` needs whole groups and is refused.
- **TRL's knobs**, set on the preset's keys where it has them (``overrides`` win):
  ``epsilon`` / ``epsilon_high`` → ``clip.eps_low`` / ``clip.eps_high`` (the ``cispo`` preset:
  ``ratio.eps_high = epsilon_high − 1``, ``ratio.eps_low = 1``, as TRL caps r at
  ``epsilon_high``; a cap below 1, TRL's default ``epsilon_high = epsilon``, is the cap at 1
  times token weights min(r, cap) / min(r, 1)), ``delta`` → ``clip.delta``, ``beta`` →
  ``kl.beta`` (a preset given without a KL term and ``beta != 0`` is an error naming ``beta``; its
  KL term can be added by the hook's overrides, ``{"kl.beta": ..., "kl.clamp": 0}``, on CPU
  tensors; ``grpo_trainer(None)`` adds TRL's k3 term so by itself), ``use_bias_correction_kl`` →
  ``kl.importance_weighted``, ``top_entropy_quantile < 1`` → ``select.rule = quantile``,
  ``select.rho`` (presets that select by entropy; for another preset it is an error),
  ``vespo_k_pos`` / ... → ``ratio.k_pos`` / .... The preset keeps its other constants (log-ratio
  clamp, dual clip, k3 clamps): :func:`spelling` adds TRL's (none of them) for TRL's own loss
  types.
- **normalisation**, TRL's for each aggregation: per-completion means (kinds 1, 2, 4) over all B
  completions of the micro-batch (an empty one counts as 0, as TRL), divided by the gradient
  accumulation steps; the token mean (kind 0) over TRL's ``num_items_in_batch`` rescaled to one
  accumulation window (TRL's ``dapo``), or over the micro-batch's own tokens divided by the
  accumulation steps when ``token_count="micro_batch"`` (TRL's ``bnpo``); Dr.GRPO's constant
  B·``max_completion_length`` (``aggregate.max_length`` in ``overrides`` replaces the length,
  ``aggregate.constant`` the whole constant).
- **vLLM importance sampling** (``use_vllm`` and ``vllm_importance_sampling_correction``):
  ``inputs["importance_sampling_ratio"]`` as reco's token weights (policy term only, as TRL).
  With a sequence-ratio preset (``gspo``, ``trl_luspo``) each completion's weights are replaced by
  their mean over its valid tokens: TRL multiplies the completion's one loss value by the token's
  ratio, which spreads the gradient of their sum evenly over the completion.
- **entropy bonus** (``entropy_coef``, and ``use_adaptive_entropy`` with ``entropy_target``,
  ``entropy_coef_delta/min/max``): added to reco's loss as TRL adds it, on TRL's own controller
  state (:meth:`RecoLoss._reco_entropy_bonus`).
- **off-policy sequence mask** (``off_policy_mask_threshold``): TRL's rule as token weights of the
  policy term (a dropped completion still counts in the normaliser, as in TRL).
- **router aux loss**: added as TRL does.

The log-probabilities and entropies come from TRL's fused LM head by default. With
``grpo_trainer(..., lm_head="reco")`` the policy's come from its last hidden states through
``reco.linear_logp_entropy`` (:func:`add_reco_lm_head`: the logits are never formed, the entropy's
gradient is exact, the lm_head must be a plain ``nn.Linear`` of a model that does not scale or
soft-cap its logits); the reference model keeps TRL's head.

TRL's ``loss_type`` and ``importance_sampling_level`` are not read when a preset is given (the
preset is the objective). Metrics: TRL's ``entropy`` and ``kl`` plus ``reco/<stat>`` for reco's
clip fractions, ratio mean and ReCo's weight statistics.

TRL is not a dependency of reco: :func:`grpo_trainer` imports it only when no ``base`` is given.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

import reco

# Each preset's own aggregation (docs/presets.md): 0 token_mean, 1 seq_mean_token_mean,
# 2 seq_mean_token_sum, 3 seq_mean_token_sum_norm, 4 seq_mean_token_sum_all.
_AGGREGATION = {
    "grpo": 1, "dr_grpo": 3, "dapo": 0, "gspo": 1, "cispo": 0, "aspo": 0, "reco": 1, "reco_no_cap": 1,
    "reco_response_only": 1, "reco_token_only": 1, "dapo_reco": 0, "rule_80_20": 0, "rule_80_20_reco": 0,
    "trl_bnpo": 0, "trl_luspo": 4, "trl_vespo": 0, "gpg": 0, "sapo": 1,
}
# Presets whose token mean is over the micro-batch's own tokens (TRL's bnpo).
_MICRO_BATCH_TOKEN_MEAN = ("trl_bnpo",)
_TOKEN_COUNTS = ("generation_batch", "micro_batch")

# TRL's own formulas on reco's presets (docs/peers.md): no log-ratio clamp, no dual clip,
# unclamped k3.
_TRL_TOKEN = {"ratio.log_ratio_clamp": 0.0}
_TRL_CLIP = {"clip.dual_clip": 0.0}
_TRL_KL = {"kl.estimator": 3.0, "kl.clamp": 0.0}


def spelling(args: Any) -> Tuple[str, Dict[str, float], str]:
    """reco's spelling of TRL's loss for a ``GRPOConfig`` (or the trainer's ``args``):
    ``(preset, overrides, token_count)``. TRL's knobs (epsilon, beta, ...) are applied by the
    trainer's hook on top."""
    loss_type = getattr(args, "loss_type", "dapo")
    level = getattr(args, "importance_sampling_level", "token")
    quantile = float(getattr(args, "top_entropy_quantile", 1.0))
    beta = float(getattr(args, "beta", 0.0))
    if level not in ("token", "sequence"):
        raise ValueError(f"reco.integrations.trl: unknown importance_sampling_level '{level}'")
    kinds = {"grpo": 1, "bnpo": 0, "dr_grpo": 3, "dapo": 0, "luspo": 4}
    token_count = "micro_batch" if loss_type == "bnpo" else "generation_batch"
    if quantile < 1.0:
        if loss_type not in kinds or level != "token" or beta != 0.0:
            raise ValueError("reco.integrations.trl: top_entropy_quantile < 1 is spelled (rule_80_20) for loss_type "
                             "grpo, bnpo, dr_grpo, dapo and luspo at token level without a KL term (beta = 0); got "
                             f"loss_type '{loss_type}', importance_sampling_level '{level}', beta {beta}")
        return "rule_80_20", {**_TRL_TOKEN, **_TRL_CLIP, "aggregate.kind": float(kinds[loss_type])}, token_count
    if loss_type in kinds:
        if level == "sequence":
            if loss_type == "luspo":
                return "trl_luspo", {}, token_count
            return "gspo", {**_TRL_CLIP, "aggregate.kind": float(kinds[loss_type])}, token_count
        return "grpo", {**_TRL_TOKEN, **_TRL_CLIP, **_TRL_KL, "aggregate.kind": float(kinds[loss_type])}, token_count
    if loss_type == "cispo" and level == "token":
        return "cispo", dict(_TRL_TOKEN), token_count
    if loss_type == "vespo":
        return "trl_vespo", {}, token_count
    if loss_type == "sapo" and level == "token":
        return "trl_sapo", {}, token_count
    raise ValueError(f"reco.integrations.trl: TRL's loss_type '{loss_type}' (importance_sampling_level '{level}') "
                     "has no reco preset in the Python API; pass a preset")


def _knobs(trainer: Any, preset: str, keys: set) -> Dict[str, float]:
    """TRL's configuration on the preset's keys."""
    args = trainer.args
    out: Dict[str, float] = {}
    if "clip.eps_low" in keys:
        out["clip.eps_low"] = float(trainer.epsilon_low)
        out["clip.eps_high"] = float(trainer.epsilon_high)
    if preset == "cispo":
        # TRL caps r at epsilon_high; reco's cispo at 1 + ratio.eps_high. A cap below 1 (TRL's
        # default epsilon_high = epsilon) is the cap at 1 times token weights (_cispo_cap_weights).
        out["ratio.eps_low"] = 1.0
        out["ratio.eps_high"] = max(0.0, float(trainer.epsilon_high) - 1.0)
    delta = getattr(args, "delta", None)
    if delta is not None:
        if "clip.delta" not in keys:
            raise ValueError(f"reco.integrations.trl: delta is set but '{preset}' has no PPO clip")
        out["clip.delta"] = float(delta)
    if reco.has_kl_term(preset):
        out["kl.beta"] = float(trainer.beta)
        out["kl.importance_weighted"] = float(bool(getattr(args, "use_bias_correction_kl", False)))
    elif trainer.beta != 0.0 and getattr(trainer, "reco_preset", "") is None:
        # TRL's own loss type with a KL term its reco preset lacks (cispo, sapo, vespo, the
        # sequence level): the term added by its keys, TRL's k3 (CPU tensors).
        out.update(_TRL_KL)
        out["kl.beta"] = float(trainer.beta)
        out["kl.importance_weighted"] = float(bool(getattr(args, "use_bias_correction_kl", False)))
    elif trainer.beta != 0.0:
        raise ValueError(f"reco.integrations.trl: beta = {trainer.beta} but '{preset}' has no KL term; set beta = 0 "
                         "or choose a preset with one (grpo, aspo, reco, ...)")
    quantile = float(getattr(trainer, "top_entropy_quantile", 1.0))
    if quantile < 1.0:
        if "select.rho" not in keys:
            raise ValueError(f"reco.integrations.trl: top_entropy_quantile = {quantile} but '{preset}' does not select "
                             "tokens by entropy (rule_80_20, rule_80_20_reco do)")
        out.update({"select.rule": 1.0, "select.rho": quantile, "select.denominator": 0.0})
    for name in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
        if f"ratio.{name}" in keys and getattr(args, f"vespo_{name}", None) is not None:
            out[f"ratio.{name}"] = float(getattr(args, f"vespo_{name}"))
    for sign in ("pos", "neg"):
        if f"ratio.tau_{sign}" in keys and getattr(args, f"sapo_temperature_{sign}", None) is not None:
            # TRL builds the temperatures with torch.where from Python floats: a float32 tensor,
            # so its gate uses the temperature rounded to float32 (1.05 -> 1.0499999523).
            tau = float(getattr(args, f"sapo_temperature_{sign}"))
            out[f"ratio.tau_{sign}"] = float(torch.tensor(tau, dtype=torch.float32))
    return out


def _per_completion(advantages: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``advantages`` per completion, or ``token_advantages`` for a ``[B, T]`` tensor that varies
    along a completion (TRL broadcasts a ``[B]`` one itself)."""
    if advantages.dim() == 1:
        return {"advantages": advantages}
    if advantages.dim() == 2 and advantages.shape[1] == 1:
        return {"advantages": advantages[:, 0]}
    if advantages.dim() == 2 and advantages.shape == mask.shape:
        idx = torch.argmax(mask.to(torch.int8), dim=-1, keepdim=True)
        first = advantages.gather(-1, idx).squeeze(-1)
        if bool(((advantages == first.unsqueeze(-1)) | ~mask).all()):
            return {"advantages": torch.where(mask.any(-1), first, torch.zeros_like(first))}
        return {"token_advantages": advantages.contiguous()}
    raise ValueError(f"reco.integrations.trl: inputs['advantages'] of shape {tuple(advantages.shape)}: expected one "
                     f"per completion [B] or one per token {tuple(mask.shape)}")


def _response_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    mean = (x * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return mean.expand_as(x).contiguous()


def _off_policy_keep(advantages: torch.Tensor, logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                     threshold: float) -> torch.Tensor:
    """TRL's off-policy sequence mask (``off_policy_mask_threshold``, DeepSeek-V3.2): a completion's
    policy term is dropped when its advantage is negative and the mean over its tokens of
    log p_sampling - log p_current (NaN tokens counting 0) exceeds the threshold. 1 keeps, 0 drops;
    ``[B, 1]`` for per-completion advantages, ``[B, T]`` for per-token ones."""
    m = mask.to(logp.dtype)
    gap = torch.nan_to_num(sampling_logp - logp, nan=0.0)
    mean_gap = (gap * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    return ((adv >= 0) | (mean_gap <= threshold)).to(logp.dtype)


def _cispo_cap_weights(logp: torch.Tensor, old_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """min(r, cap) / min(r, 1): TRL's CISPO weight min(r, epsilon_high) for a cap below 1, as reco's
    cispo weight capped at 1 (ratio.eps_high = 0) times these token weights."""
    r = torch.exp(logp - old_logp)
    return torch.clamp(r, max=cap) / torch.clamp(r, max=1.0)


def _pad_rows(x: Optional[torch.Tensor], rows: int, value: float = 0.0) -> Optional[torch.Tensor]:
    if x is None or rows == 0:
        return x
    return torch.cat([x, x.new_full((rows,) + tuple(x.shape[1:]), value)])


class _HeadOutput:
    """What TRL reads of a fused LM head's forward: per-token log-probabilities and entropies."""

    def __init__(self, log_probs: torch.Tensor, entropy: torch.Tensor):
        self.log_probs, self.entropy, self.aux_loss = log_probs, entropy, None


def add_reco_lm_head(model: Any, temperature: float = 1.0, memory_budget: int = 0) -> None:
    """Make ``model(..., labels=labels, fused_lm_head=True)`` return the log-probabilities and
    entropies of the labelled next tokens from ``reco.linear_logp_entropy`` on the backbone's last
    hidden states: the ``[B, T, V]`` logits are never formed, and the entropy's gradient is exact
    (TRL's own fused head leaves it out). Other calls (generation) run the forward as before. The
    model's output embedding must be a plain ``torch.nn.Linear`` and its config must not scale or
    soft-cap the logits."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"reco.integrations.trl: lm_head: must be a torch.nn.Linear, got {type(head).__name__}")
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key, neutral in (("final_logit_softcapping", None), ("logit_scale", None), ("output_multiplier", None),
                         ("lm_head_multiplier", None), ("logits_scaling", None)):
        if getattr(text, key, neutral) not in (neutral, 1.0):
            raise ValueError(f"reco.integrations.trl: lm_head: the model's {key} changes the logits; "
                             "reco's hidden-states head computes plain (W h + b) / temperature")
    if getattr(text, "output_router_logits", False):
        raise ValueError("reco.integrations.trl: lm_head: a router aux loss is not computed by reco's head")
    previous = model.forward

    def forward(*args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            given = dict(labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch)
            return previous(*args, **kwargs, **{k: v for k, v in given.items() if v is not None})
        if shift_labels is not None:
            raise ValueError("reco.integrations.trl: lm_head: pre-shifted labels (context or sequence parallelism) "
                             "are not supported by reco's hidden-states head")
        kwargs["use_cache"] = False
        hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        targets = labels[:, 1:].to(hidden.device)
        valid = targets != -100
        out_head = model.get_output_embeddings()  # looked up per call: wrappers may replace it
        logp, entropy = reco.linear_logp_entropy(hidden, out_head.weight, targets.clamp(min=0), out_head.bias,
                                                 temperature=temperature, row_mask=valid,
                                                 memory_budget=memory_budget)
        return _HeadOutput(logp, entropy)

    model.forward = forward


class RecoLoss:
    """Mixin for ``trl.GRPOTrainer`` (first base): ``_compute_loss`` is reco's ``reco_preset``
    with ``reco_overrides`` on TRL's loss inputs. ``reco_preset = None``: TRL's own loss_type
    (:func:`spelling`). ``reco_token_count``: ``"generation_batch"`` (TRL's dapo) or
    ``"micro_batch"`` (TRL's bnpo), for token-mean aggregation. ``reco_lm_head``: the policy's
    log-probabilities and entropies from its hidden states by reco (:func:`add_reco_lm_head`)
    instead of TRL's fused LM head."""

    reco_preset: Optional[str] = "reco"
    reco_overrides: Dict[str, float] = {}
    reco_token_count: Optional[str] = None
    reco_lm_head: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.reco_lm_head:
            model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
            add_reco_lm_head(model, temperature=float(self.temperature))

    def _reco_objective(self) -> Tuple[str, Dict[str, float], str]:
        if self.reco_preset is None:
            preset, spelled, token_count = spelling(self.args)
        else:
            preset, spelled = self.reco_preset, {}
            token_count = "micro_batch" if preset in _MICRO_BATCH_TOKEN_MEAN else "generation_batch"
        if self.reco_token_count is not None:
            token_count = self.reco_token_count
        if token_count not in _TOKEN_COUNTS:
            raise ValueError(f"reco.integrations.trl: token_count '{token_count}' is not one of {_TOKEN_COUNTS}")
        keys = set(reco.override_keys(preset))
        user = dict(self.reco_overrides or {})
        unknown = sorted(set(user) - keys)
        if unknown:
            raise ValueError(f"reco.integrations.trl: '{preset}' has no key(s) {unknown}; "
                             f"reco.override_keys('{preset}') lists them")
        overrides = {**spelled, **_knobs(self, preset, keys), **user}
        return preset, overrides, token_count

    def _compute_loss(self, model, inputs):
        preset, overrides, token_count = self._reco_objective()
        keys = set(reco.override_keys(preset))

        # The model forward, as TRL's _compute_loss runs it.
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{k: inputs.get(k) for k in ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                                          "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids",
                                          "mm_token_type_ids", "image_position_ids")})
        mask = mask.to(torch.bool)
        B, T = mask.shape
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old.detach()
        batch: Dict[str, Any] = {"old_logp": old}
        batch.update({k: v.to(per_token_logps.dtype)
                      for k, v in _per_completion(inputs["advantages"].detach(), mask).items()})
        if "kl.beta" in overrides:
            ref = inputs.get("ref_per_token_logps")
            batch["ref_logp"] = old if ref is None or self.beta == 0.0 else ref.detach()  # beta 0: contributes 0
        if "select.rho" in keys:
            batch["entropy"] = entropies.detach()
        if self.use_vllm and self.vllm_importance_sampling_correction:
            ratio = inputs["importance_sampling_ratio"].detach().to(per_token_logps.dtype).expand(B, T)
            sequence_ratio = "ratio.max_log_ratio" in keys  # gspo, trl_luspo
            batch["token_weights"] = _response_mean(ratio, mask) if sequence_ratio else ratio.contiguous()
        # Token weights of the policy term, as TRL multiplies its per-token loss: the off-policy
        # sequence mask, and the part of CISPO's cap below 1.
        extra = []
        threshold = getattr(self, "off_policy_mask_threshold", None)
        if threshold is not None:
            sampling = inputs.get("sampling_per_token_logps", old)
            extra.append(_off_policy_keep(inputs["advantages"].detach(), per_token_logps.detach(), sampling.detach(),
                                          mask, float(threshold)))
        if preset == "cispo" and float(self.epsilon_high) < 1.0 and "ratio.eps_high" not in self.reco_overrides:
            extra.append(_cispo_cap_weights(per_token_logps.detach(), old, float(self.epsilon_high)))
        for w in extra:
            w = w.to(per_token_logps.dtype).expand(B, T)
            batch["token_weights"] = (w * batch["token_weights"] if "token_weights" in batch else w).contiguous()

        # TRL's normalisation for the aggregation (see the module's doc).
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        base = reco.peer_presets().get(preset, preset)  # a peer preset aggregates as its base
        kind = int(overrides.get("aggregate.kind", _AGGREGATION.get(base, 1)))
        scale = 1.0 / accumulation
        counts: Dict[str, int] = {}
        if kind == 0 and token_count == "generation_batch":
            counts["global_tokens"] = max(1, int(round(float(inputs["num_items_in_batch"]))))
            processes = self.accelerator.num_processes
            scale = processes * (self.args.steps_per_generation / accumulation if mode == "train" else 1.0)
        elif kind in (1, 2, 4):
            counts["global_responses"] = B  # an empty completion counts as 0, as in TRL
        elif kind == 3 and "aggregate.constant" not in self.reco_overrides:
            length = overrides.pop("aggregate.max_length", float(self.max_completion_length))
            overrides["aggregate.constant"] = float(B) * length

        # ReCo's weight reads G: whole groups of G, completed by empty completions.
        logp = per_token_logps
        if "weight.cap" in keys:
            if int(overrides.get("weight.normalise", 0)) == 1:
                raise ValueError("reco.integrations.trl: weight.normalise = group_mean needs whole prompt groups, "
                                 "which TRL's shuffled micro-batches do not hold")
            G = int(self.num_generations)
            pad = (-B) % G
            if pad:
                logp = _pad_rows(logp, pad)
                mask = _pad_rows(mask, pad, False)
                for k in list(batch):
                    batch[k] = _pad_rows(batch[k], pad, 1.0 if k == "token_weights" else 0.0)
            batch["group_size"] = G
        out = reco.policy_loss(preset, logp, mask=mask, overrides=overrides, **batch, **counts)
        loss = out.loss * scale

        if getattr(self, "_entropy_bonus_enabled", False):
            # TRL logs the policy term before its division by the accumulation steps.
            per_window = kind == 0 and token_count == "generation_batch"
            policy = loss.detach() if per_window else loss.detach() * accumulation
            loss = loss - self._reco_entropy_bonus(entropies, mask[:B], policy, mode)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_reco_metrics(mode, out, entropies, mask[:B])
        return loss

    def _reco_entropy_bonus(self, entropies: torch.Tensor, mask: torch.Tensor, policy: torch.Tensor,
                            mode: str) -> torch.Tensor:
        """TRL's entropy bonus (``entropy_coef``, and its adaptive control with
        ``use_adaptive_entropy``): coef times the mean entropy over the micro-batch's tokens (those
        ``top_entropy_quantile`` keeps), divided by the accumulation steps, differentiable in the
        entropies. The adaptive coefficient is the one at the end of the previous optimizer step,
        applied only while that step's entropy was at most ``entropy_target``; at each optimizer
        step it moves by ``entropy_coef_delta`` within [``entropy_coef_min``, ``entropy_coef_max``]
        towards keeping the entropy above the target, as in TRL (the same state, so TRL's
        checkpoints of it apply)."""
        args = self.args
        m = mask.to(entropies.dtype)
        if float(getattr(self, "top_entropy_quantile", 1.0)) < 1.0:
            m = m * self.get_high_entropy_mask(entropies.detach(), mask, 1.0 - self.top_entropy_quantile).to(m.dtype)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        mean_entropy = (entropies * m).sum() / m.sum().clamp(min=1.0) / accumulation
        adaptive = bool(getattr(self, "use_adaptive_entropy", False))
        coef = float(self.entropy_coef)
        if adaptive and not self._last_world_entropy <= args.entropy_target:
            coef = 0.0
        self._metrics[mode]["policy_loss"].append(float(policy))
        if adaptive and mode == "train":
            window = torch.stack([(entropies.detach() * m).sum(), m.sum()])
            held = self._entropy_window_stats
            self._entropy_window_stats = window if held is None else held + window
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                if entropy <= args.entropy_target:
                    self.entropy_coef = min(self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
                else:
                    self.entropy_coef = max(self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
                self._last_world_entropy = entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coef * mean_entropy

    def _log_reco_metrics(self, mode: str, out: Any, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        m = mask.to(entropies.dtype)
        totals = self.accelerator.reduce(torch.stack([(entropies.detach() * m).sum(), m.sum()]), reduction="sum")
        self._metrics[mode]["entropy"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        stats = out.stats_dict()
        if self.beta != 0.0 and "ref_kl_mean" in stats:
            self._metrics[mode]["kl"].append(stats["ref_kl_mean"])
        for name in ("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "weight_mean", "weight_max",
                     "weight_cap_hits", "kept_frac"):
            if name in stats:
                self._metrics[mode][f"reco/{name}"].append(stats[name])


def grpo_trainer(preset: Optional[str] = "reco", overrides: Optional[Dict[str, float]] = None,
                 base: Optional[type] = None, token_count: Optional[str] = None, lm_head: str = "trl") -> type:
    """A subclass of ``base`` (default ``trl.GRPOTrainer``) whose loss is reco's ``preset`` with
    ``overrides`` (see the module's doc); ``preset=None``: TRL's own ``loss_type`` through reco.
    ``lm_head="reco"``: the policy's log-probabilities and entropies from its last hidden states by
    ``reco.linear_logp_entropy`` (:func:`add_reco_lm_head`; a plain linear lm_head)
    instead of TRL's fused head (``"trl"``, the default)."""
    if lm_head not in ("trl", "reco"):
        raise ValueError(f"reco.integrations.trl: lm_head: '{lm_head}' is not one of ('trl', 'reco')")
    if base is None:
        try:
            from trl import GRPOTrainer as base
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("reco.integrations.trl needs trl (pip install trl)") from e
    if preset is not None and preset not in reco.presets():
        raise ValueError(f"reco.integrations.trl: unknown preset '{preset}' (reco.presets() lists them)")
    if token_count is not None and token_count not in _TOKEN_COUNTS:
        raise ValueError(f"reco.integrations.trl: token_count '{token_count}' is not one of {_TOKEN_COUNTS}")
    name = "Reco" + (preset or "TrlLoss").title().replace("_", "") + base.__name__
    return type(name, (RecoLoss, base), {"reco_preset": preset, "reco_overrides": dict(overrides or {}),
                                         "reco_token_count": token_count, "reco_lm_head": lm_head == "reco",
                                         "__module__": __name__})
