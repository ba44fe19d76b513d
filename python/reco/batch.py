"""Batch operations before the loss: advantages from rewards, DAPO's group filter and overlong
shaping, KL in the reward, TRL's truncated-completion mask, and prompt groups (docs/batch_ops.md, docs/torch.md).

They run on the host (inputs on another device are copied there) and return tensors on the
device of their main input. Bad input raises ``ValueError`` whose message starts with
``reco: <argument>:``.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch

_ops = torch.ops.reco
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


__all__ = ["ESTIMATORS", "GroupFilter", "PromptGrouping", "advantages", "filter_groups", "group_by_prompt",
           "group_offsets", "kl_reward", "mask_truncated", "overlong_penalty"]
