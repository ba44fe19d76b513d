"""reco's objectives as verl policy losses.

    import reco.integrations.verl
    reco.integrations.verl.register()          # before verl builds its actor

then choose one in verl's config, for example::

    actor_rollout_ref.actor.policy_loss.loss_mode=reco
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean

Each registered loss has verl's policy-loss signature ``(old_log_prob, log_prob, advantages,
response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)`` and computes reco's
preset of the same name on verl's tensors:

- **advantages**: verl's, per token (``[B, T]``); constant along each response (GRPO and other
  outcome estimators) they are passed per response, otherwise per token (GAE, token baselines:
  ``token_advantages``, read by every per-token term).
- **G** (ReCo's expected-count weight 1 / (G·pbar_old)): ``config.rollout_n``.
- **caps**: ``config.clip_ratio_low`` / ``clip_ratio_high`` (or ``clip_ratio``) and
  ``clip_ratio_c`` set the preset's PPO clip (ε_low, ε_high, dual-clip c) for presets that clip
  with it; ``config.policy_loss.reco_weight_cap`` (if present) sets ReCo's weight cap.
- **aggregation**: verl's ``loss_agg_mode`` must be the preset's own (``token-mean`` for aspo,
  dapo_reco and the 80/20 presets; ``seq-mean-token-mean`` for grpo and the reco presets), or
  ``token-sum`` for a ``token-mean`` preset (the masked sum: reco's sum / constant aggregation
  with the constant 1):
  another mode is an error naming it, never a silent change of objective.
- **normalisation over the step**: verl's ``global_batch_info`` (``batch_num_tokens``,
  ``global_batch_size``, ``dp_size``) gives the step's counts, and the loss is multiplied by
  ``dp_size`` as verl's own losses are (FSDP averages gradients over ranks).
- **KL**: verl adds its own KL loss (``use_kl_loss``), so the preset's KL term is switched off
  (β = 0) and the KL is counted once.
- **rollout correction**: ``rollout_is_weights`` multiplies the policy term per token, as in
  verl's losses.
- **entropy** (the 80/20 presets select tokens by entropy): verl's policy-loss signature carries
  no entropies; hand them over with :func:`provide_entropy` before the loss is computed (for
  example from verl's ``ppo_loss``, which has ``model_output["entropy"]``). Without them those
  losses raise an error naming ``entropy``.

verl is not a dependency of reco: :func:`register` imports it and fails with a clear error if it
is missing.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Iterable, Optional, Tuple

import torch

import reco

#: The presets registered by default, under their own names.
LOSSES: Tuple[str, ...] = ("reco", "reco_no_cap", "reco_response_only", "reco_token_only", "aspo", "dapo_reco",
                           "rule_80_20", "rule_80_20_reco")

# The aggregation each preset uses, in verl's spelling.
_AGGREGATION = {
    "grpo": "seq-mean-token-mean", "reco": "seq-mean-token-mean", "reco_no_cap": "seq-mean-token-mean",
    "reco_response_only": "seq-mean-token-mean", "reco_token_only": "seq-mean-token-mean",
    "gspo": "seq-mean-token-mean", "aspo": "token-mean", "dapo": "token-mean", "dapo_reco": "token-mean",
    "cispo": "token-mean", "rule_80_20": "token-mean", "rule_80_20_reco": "token-mean", "dppo": "token-mean",
}
_SELECTS_BY_ENTROPY = ("rule_80_20", "rule_80_20_reco")

_entropy = threading.local()


def provide_entropy(entropy: Optional[torch.Tensor]) -> None:
    """The token entropies (``[B, T]``, like ``log_prob``) of the next reco loss computed on this
    thread; ``None`` forgets them. Used by the 80/20 presets, which select tokens by entropy."""
    _entropy.value = entropy


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if hasattr(config, "get"):
        try:
            value = config.get(key, default)
        except Exception:  # a dataclass config whose get() refuses unknown keys
            value = getattr(config, key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def _overrides(preset: str, config: Any) -> Dict[str, float]:
    keys = set(reco.override_keys(preset))
    out: Dict[str, float] = {}
    clip = _config_get(config, "clip_ratio", 0.2)
    if "clip.eps_low" in keys:
        out["clip.eps_low"] = float(_config_get(config, "clip_ratio_low", clip))
        out["clip.eps_high"] = float(_config_get(config, "clip_ratio_high", clip))
    if "clip.dual_clip_c" in keys and "clip_ratio_c" in _config_keys(config):
        out["clip.dual_clip_c"] = float(_config_get(config, "clip_ratio_c"))
    cap = _config_get(_config_get(config, "policy_loss"), "reco_weight_cap")
    if cap is not None:
        if "weight.cap" not in keys:
            raise ValueError(f"reco.integrations.verl: policy_loss.reco_weight_cap is set but '{preset}' has no "
                             "response weight")
        out["weight.cap"] = float(cap)
    if "kl.beta" in keys and reco.has_kl_term(preset):
        out["kl.beta"] = 0.0  # verl's own KL loss counts the KL
    return out


def _config_keys(config: Any) -> Iterable[str]:
    if config is None:
        return ()
    if hasattr(config, "keys"):
        return list(config.keys())
    return [k for k in dir(config) if not k.startswith("_")]


def _response_or_token_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``advantages`` per response when every valid token of each response carries the same value
    (outcome advantages broadcast by verl; the faster path), else ``token_advantages``."""
    valid = mask.any(dim=-1)
    # The response's value at its first valid token.
    idx = torch.argmax(mask.to(torch.int8), dim=-1, keepdim=True)
    first = advantages.gather(-1, idx).squeeze(-1)
    constant = bool(((advantages == first.unsqueeze(-1)) | ~mask).all())
    if constant:
        return {"advantages": torch.where(valid, first, torch.zeros_like(first))}
    return {"token_advantages": advantages}


def _loss_for(preset: str):
    def loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
             response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
             rollout_is_weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, Any]]:
        if config is None:
            raise ValueError(f"reco.integrations.verl: '{preset}' needs verl's actor config (config=None)")
        wanted = _AGGREGATION.get(preset)
        # verl's token-sum (the masked sum, times dp_size): a token-mean preset's token sum, the
        # aggregation sum / constant with the constant 1.
        token_sum = loss_agg_mode == "token-sum" and wanted == "token-mean"
        if wanted is not None and loss_agg_mode != wanted and not token_sum:
            also = " (or token-sum)" if wanted == "token-mean" else ""
            raise ValueError(f"reco.integrations.verl: loss_agg_mode '{loss_agg_mode}' is not the aggregation of "
                             f"'{preset}' ('{wanted}'{also}); set actor.loss_agg_mode={wanted}")
        mask = response_mask.to(torch.bool)
        inputs: Dict[str, Any] = {
            "old_logp": old_log_prob.detach(),
            "mask": mask,
        }
        inputs.update(_response_or_token_advantages(advantages.detach(), mask))
        keys = set(reco.override_keys(preset))
        if reco.has_kl_term(preset):
            inputs["ref_logp"] = old_log_prob.detach()  # read with beta = 0: contributes exactly 0
        if any(k.startswith("weight.") for k in keys):
            g = int(_config_get(config, "rollout_n", 0))
            if g < 1:
                raise ValueError(f"reco.integrations.verl: '{preset}' needs G = config.rollout_n (got {g})")
            inputs["group_size"] = g
        if preset in _SELECTS_BY_ENTROPY:
            entropy = getattr(_entropy, "value", None)
            if entropy is None:
                raise ValueError(f"reco.integrations.verl: '{preset}' selects tokens by entropy: pass verl's "
                                 "entropies with reco.integrations.verl.provide_entropy(entropy) first")
            inputs["entropy"] = entropy.detach()
        if rollout_is_weights is not None:
            inputs["token_weights"] = rollout_is_weights.detach()
        info = _config_get(config, "global_batch_info", {}) or {}
        dp_size = int(info.get("dp_size", 1) or 1)
        tokens = info.get("batch_num_tokens")
        responses = info.get("global_batch_size")
        if loss_agg_mode == "token-mean" and tokens is not None:
            inputs["global_tokens"] = int(tokens)
        if loss_agg_mode == "seq-mean-token-mean" and responses is not None:
            inputs["global_responses"] = int(responses)
        if dp_size > 1 and "global_tokens" not in inputs and "global_responses" not in inputs and not token_sum:
            raise ValueError("reco.integrations.verl: dp_size > 1 needs the step's counts in global_batch_info")
        overrides = _overrides(preset, config)
        if token_sum:
            overrides.update({"aggregate.kind": 3.0, "aggregate.constant": 1.0})  # seq_mean_token_sum_norm
        out = reco.policy_loss(preset, log_prob, overrides=overrides, **inputs)
        stats = out.stats_dict()
        metrics = {
            "actor/pg_clipfrac": stats.get("clip_frac", 0.0),
            "actor/ppo_kl": stats.get("ppo_kl", 0.0),
            "actor/pg_clipfrac_lower": stats.get("dual_clip_frac", 0.0),
        }
        if "weight_mean" in stats:
            metrics["actor/reco_weight_mean"] = stats["weight_mean"]
            metrics["actor/reco_weight_max"] = stats.get("weight_max", 0.0)
        return out.loss * dp_size, metrics

    loss.__name__ = f"reco_{preset}_policy_loss"
    loss.__doc__ = f"reco's '{preset}' preset with verl's policy-loss signature (reco.integrations.verl)."
    return loss


def register(names: Iterable[str] = LOSSES, prefix: str = "") -> Dict[str, Any]:
    """Registers reco's presets ``names`` in verl's policy-loss registry as ``prefix + name``.
    A name verl already has is an error (choose a ``prefix``). Returns name -> function."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reco.integrations.verl needs verl (pip install verl)") from e
    known = set(reco.presets()) | set(reco.peer_presets())
    done: Dict[str, Any] = {}
    for name in names:
        if name not in known:
            raise ValueError(f"reco.integrations.verl: unknown preset '{name}' (reco.presets() lists them)")
        key = prefix + name
        existing = core_algos.POLICY_LOSS_REGISTRY.get(key)
        if existing is not None and getattr(existing, "__module__", "") != __name__:
            raise ValueError(f"reco.integrations.verl: verl already has a policy loss '{key}'; pass a prefix")
        fn = _loss_for(name)
        core_algos.register_policy_loss(key)(fn)
        done[key] = fn
    return done
