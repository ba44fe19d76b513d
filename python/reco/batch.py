"""Batch operations before the loss: advantages from rewards, DAPO's group filter and overlong
shaping, KL in the reward, TRL's truncated-completion mask, prompt groups and the rollout
(train-inference) importance-sampling correction (docs/batch_ops.md, docs/torch.md).

They run on the host (inputs on another device are copied there) and return tensors on the
device of their main input. Bad input raises ``ValueError`` whose message starts with
``reco: <argument>:``.
"""
from __future__ import annotations

import math
from typing import Dict, NamedTuple, Optional, Sequence, Union

import torch

from ._errors import ops as _ops  # reco errors as ValueError
Tensor = torch.Tensor

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "opo", "batch_std", "gpg", "reinforce_pp", "pass_at_k")


def advantages(estimator: str, rewards: Tensor, *, group_offsets: Optional[Tensor] = None,
               prompt_ids: Optional[Tensor] = None, lengths: Optional[Tensor] = None,
               overrides: Optional[Dict[str, float]] = None) -> Tensor:
    """Per-response advantages (float64 ``[R]``) as the loss computes them.

    ``estimator`` is an estimator name (``ESTIMATORS``: grpo (s - mean_g) / (std_g + eps) with the
    unbiased std, dr_grpo s - mean_g, rloo, opo, batch_std, gpg, reinforce_pp, pass_at_k) or a
    preset name (``reco.presets()``), which means that preset's estimator with its constants.
    ``rewards``: floating ``[R]``, finite. Groups: ``group_offsets`` (P + 1 int64/int32 offsets
    from 0 to R) or ``prompt_ids`` (``[R]``, each prompt's responses contiguous), exactly one.
    ``lengths``: valid tokens per response (int ``[R]``, e.g. ``mask.sum(-1)``), required by opo
    and reinforce_pp and refused by the others. ``overrides``: ``"advantage.<field>"`` keys
    (``advantage.eps``, ``advantage.scale_by_std``, ``advantage.singleton``, ...), as for
    ``policy_loss``. A group of one response gets 0 (the default singleton policy).
    """
    return _ops.advantages(estimator, rewards, group_offsets, prompt_ids, lengths, overrides)


_BATCH_NORMALISATIONS = ("response", "token", "none")


def gdpo_advantages(rewards: Tensor, *, group_offsets: Optional[Tensor] = None, prompt_ids: Optional[Tensor] = None,
                    group_size: int = 0, weights: Optional[Sequence[float]] = None, eps: float = 1e-6,
                    batch_normalise: str = "response", batch_eps: float = 1e-4,
                    lengths: Optional[Tensor] = None) -> Tensor:
    """GDPO's per-response advantages (float64 ``[R]``) from several rewards per response
    (``rewards`` ``[R, K]``): each reward normalised within its prompt group by the GRPO
    estimator, (r_k - mean_g) / (std_g + ``eps``) with the unbiased std (``advantages("grpo")``),
    then summed with ``weights`` (K values, default all 1), then normalised over the batch:

    - ``batch_normalise="response"``: (s - mean) / (std + ``batch_eps``), mean and unbiased std
      over the R responses (TRL's ``multi_objective_aggregation="normalize_then_sum"``, with
      ``eps = batch_eps = 1e-4``);
    - ``"token"``: (s - mean) / sqrt(var + ``batch_eps``), mean and unbiased variance over the
      tokens, each response counted ``lengths`` times (verl's ``adv_estimator=gdpo``, with
      ``eps = 1e-6``, ``batch_eps = 1e-8``; ``lengths`` = ``response_mask.sum(-1)``);
    - ``"none"``: the weighted sum.

    Groups: ``group_offsets``, ``prompt_ids`` or ``group_size`` (equal groups of that many
    consecutive responses), exactly one; every group needs at least two responses. Rewards must
    be finite."""
    if rewards.dim() != 2 or rewards.shape[1] < 1:
        raise ValueError(f"reco: rewards: expected [R, K] (K rewards per response), got {tuple(rewards.shape)}")
    R, K = rewards.shape
    if sum(x is not None and (not isinstance(x, int) or x != 0) for x in (group_offsets, prompt_ids, group_size)) != 1:
        raise ValueError("reco: group_offsets: give exactly one of group_offsets, prompt_ids and group_size")
    if group_size:
        if group_size < 2 or R % group_size:
            raise ValueError(f"reco: group_size: {group_size} must be >= 2 and divide the {R} responses")
        group_offsets = torch.arange(0, R + 1, group_size, dtype=torch.int64)
    elif prompt_ids is not None:
        group_offsets = _ops.group_offsets(prompt_ids)
    sizes = torch.diff(group_offsets.to("cpu", torch.int64))
    if bool((sizes < 2).any()):
        raise ValueError("reco: group_offsets: every group needs at least two responses for GDPO's per-group std")
    if weights is None:
        w = [1.0] * K
    else:
        w = [float(x) for x in weights]
        if len(w) != K or not all(math.isfinite(x) for x in w):
            raise ValueError(f"reco: weights: expected {K} finite values, one per reward, got {list(weights)}")
    if batch_normalise not in _BATCH_NORMALISATIONS:
        raise ValueError(f"reco: batch_normalise: '{batch_normalise}' is not one of {_BATCH_NORMALISATIONS}")
    if (lengths is not None) != (batch_normalise == "token"):
        raise ValueError("reco: lengths: needed by batch_normalise='token' and only by it")
    total = torch.zeros(R, dtype=torch.float64)
    for k in range(K):
        adv = _ops.advantages("grpo", rewards[:, k].contiguous(), group_offsets, None, None, {"advantage.eps": eps})
        total += w[k] * adv.to("cpu", torch.float64)
    if batch_normalise == "response":
        if R < 2:
            raise ValueError("reco: rewards: batch_normalise='response' needs at least two responses")
        total = (total - total.mean()) / (total.std() + batch_eps)
    elif batch_normalise == "token":
        n = lengths.to("cpu", torch.float64)
        if lengths.shape != (R,) or bool((n < 0).any()) or float(n.sum()) < 2:
            raise ValueError("reco: lengths: expected [R] non-negative token counts summing to at least 2")
        mean = (total * n).sum() / n.sum()
        var = ((total - mean) ** 2 * n).sum() / (n.sum() - 1)
        total = (total - mean) / torch.sqrt(var + batch_eps)
    return total.to(rewards.device)


class GroupFilter(NamedTuple):
    """The kept responses (int64 indices into the batch, in order) and the kept groups' offsets
    over them (int64, kept groups + 1 entries)."""

    kept_responses: Tensor
    group_offsets: Tensor


def filter_groups(rewards: Tensor, group_offsets: Tensor, *, rule: str = "nonzero_std", low: float = 0.0,
                  high: float = 1.0, keep_singletons: bool = True) -> GroupFilter:
    """DAPO's dynamic sampling (``rule="nonzero_std"``: keep a group whose rewards are not all
    equal; a group of one response is kept when ``keep_singletons``) or OpenRLHF's filter
    (``rule="mean_in_range"``: keep a group whose mean reward lies strictly inside (low, high)).
    Compact per-response and padded per-token tensors with ``x[out.kept_responses]``."""
    kept, offsets = _ops.filter_groups(rewards, group_offsets, rule, float(low), float(high), bool(keep_singletons))
    return GroupFilter(kept, offsets)


def overlong_penalty(rewards: Tensor, lengths: Tensor, *, max_length: float = 20480.0, buffer: float = 4096.0,
                     factor: float = 1.0) -> Tensor:
    """DAPO's overlong shaping: a new rewards tensor (dtype and device of ``rewards``) with
    ``min(-(L - (max_length - buffer)) / buffer * factor, 0)`` added to each reward, L the
    response's length (``lengths``, int ``[R]``, >= 0): 0 up to max_length - buffer, -factor at
    max_length, and falling on linearly beyond it. Defaults: the DAPO recipe."""
    return _ops.overlong_penalty(rewards, lengths, float(max_length), float(buffer), float(factor))


def kl_reward(rewards: Tensor, logp: Tensor, ref_logp: Tensor, *, mask: Optional[Tensor] = None,
              offsets: Optional[Tensor] = None, beta: float = 0.001, estimator: str = "k3",
              clamp: bool = True) -> Tensor:
    """KL in the reward instead of the loss (verl's use_kl_in_reward): a new rewards tensor (dtype
    and device of ``rewards``) with ``beta * sum_t k(logp_t, ref_logp_t)`` over each response's
    valid tokens subtracted. ``estimator``: "k1" (d = logp - ref_logp), "abs" (|d|), "k2" (d^2 / 2)
    or "k3" (exp(-d) + d - 1, with verl's clamps when ``clamp``). Per-token tensors: ``[R, T]``
    (``mask`` optional) or ``[N]`` packed with ``offsets``; valid tokens must be finite and <= 0."""
    return _ops.kl_reward(rewards, logp, ref_logp, mask, offsets, float(beta), estimator, bool(clamp))


def mask_truncated(tokens: Tensor, eos_token: int, *, mask: Optional[Tensor] = None,
                   offsets: Optional[Tensor] = None) -> Tensor:
    """TRL's truncated-completion masking: a bool mask of ``tokens``' shape that is ``mask`` (all
    true when None) for the responses holding ``eos_token`` among their valid tokens and false
    for the others. ``tokens``: ``[R, T]`` int64/int32, or ``[N]`` packed with ``offsets``."""
    return _ops.mask_truncated(tokens, int(eos_token), mask, offsets)


def group_offsets(prompt_ids: Tensor) -> Tensor:
    """The P + 1 group offsets of per-response prompt ids whose prompts are contiguous (an error
    naming ``prompt_ids`` otherwise; regroup with ``group_by_prompt``)."""
    return _ops.group_offsets(prompt_ids)


class PromptGrouping(NamedTuple):
    """``order[j]``: the original index of the response at new position j; ``group_offsets``:
    the groups over the reordered responses."""

    order: Tensor
    group_offsets: Tensor


def group_by_prompt(prompt_ids: Tensor) -> PromptGrouping:
    """The stable permutation that makes each prompt's responses contiguous (prompts in order of
    first appearance, responses in their original order); apply it with ``x[out.order]``."""
    order, offsets = _ops.group_by_prompt(prompt_ids)
    return PromptGrouping(order, offsets)


ROLLOUT_STATISTICS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                      "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k1", "seq_max_k2", "seq_max_k3")
ROLLOUT_METRICS = ("valid_tokens", "valid_responses", "weight_mean", "weight_min", "weight_max", "bounded_fraction",
                   "normaliser", "rejected_token_fraction", "rejected_response_fraction", "k1_mean", "k3_mean")


class RolloutFilter(NamedTuple):
    """A rejection filter: keep where ``lower <= statistic <= upper``. ``statistic`` is one of
    ``ROLLOUT_STATISTICS``: the per-token KL estimators of KL(rollout || trainer) with
    l = old_logp - rollout_logp (clamped to +-log_ratio_bound): k1 = -l, k2 = l^2 / 2,
    k3 = exp(l) - 1 - l, at token level (``token_k*``: the token is dropped) or summed, averaged
    or maximised over the response's valid tokens (``seq_sum_k*``, ``seq_mean_k*``,
    ``seq_max_k*``: the response is dropped). With ``negative_advantages_only`` a response whose
    advantage is >= 0 is never dropped by this filter (TRL's off-policy sequence mask)."""

    statistic: str
    lower: float = -math.inf
    upper: float = math.inf
    negative_advantages_only: bool = False


class RolloutCorrection(NamedTuple):
    """``weights``: per-token importance weights (dtype, shape and device of ``old_logp``; 0 at
    masked tokens), to pass as ``token_weights=``; ``keep_mask``: bool, the input mask AND every
    filter, to pass as ``mask=``; ``metrics``: ``ROLLOUT_METRICS`` by name."""

    weights: Tensor
    keep_mask: Tensor
    metrics: Dict[str, float]


def rollout_correction(old_logp: Tensor, rollout_logp: Tensor, *, mask: Optional[Tensor] = None,
                       offsets: Optional[Tensor] = None, level: str = "token", bound: str = "truncate",
                       lower: float = 0.0, upper: Optional[float] = 2.0, log_ratio_bound: Optional[float] = 20.0,
                       normalise: bool = False, count_eps: float = 0.0,
                       filters: Sequence[Union[RolloutFilter, tuple]] = (),
                       advantages: Optional[Tensor] = None) -> RolloutCorrection:
    """The rollout (train-inference) importance-sampling correction from the trainer's
    ``old_logp`` and the inference engine's ``rollout_logp`` (docs/batch_ops.md).

    Weights: ``level`` "token" (exp(l_t)), "sequence" (exp of the response's summed l) or "none"
    (1), l = old_logp - rollout_logp clamped to +-``log_ratio_bound`` (None: no clamp);
    ``bound`` "truncate" (TIS: clamp into [lower, upper]) or "mask" (MIS / IcePop: 0 outside
    [lower, upper]); ``upper`` None means no upper bound; ``normalise`` divides by the batch mean
    (verl's batch normalisation), ``count_eps`` is added to the token counts of the per-response
    means (verl's 1e-8). ``filters``: ``RolloutFilter`` s (or tuples of its fields), all must
    pass. ``advantages`` (``[R]``): required exactly when a filter has negative_advantages_only.
    Per-token tensors: ``[R, T]`` (``mask`` optional) or ``[N]`` packed with ``offsets``.
    """
    fs = [f if isinstance(f, RolloutFilter) else RolloutFilter(*f) for f in filters]
    w, keep, m = _ops.rollout_correction(
        old_logp, rollout_logp, [str(f.statistic) for f in fs], [float(f.lower) for f in fs],
        [float(f.upper) for f in fs], [bool(f.negative_advantages_only) for f in fs], mask, offsets, advantages,
        level, bound, float(lower), math.inf if upper is None else float(upper),
        math.inf if log_ratio_bound is None else float(log_ratio_bound), bool(normalise), float(count_eps))
    return RolloutCorrection(w, keep, dict(zip(ROLLOUT_METRICS, m)))


__all__ = ["ESTIMATORS", "GroupFilter", "PromptGrouping", "ROLLOUT_METRICS", "ROLLOUT_STATISTICS",
           "RolloutCorrection", "RolloutFilter", "advantages", "filter_groups", "gdpo_advantages", "group_by_prompt", "group_offsets",
           "kl_reward", "mask_truncated", "overlong_penalty", "rollout_correction"]
