"""reco's policy loss as a ``torch.nn.Module``: the objective and its constants fixed at
construction (typed, documented arguments; choices by label), the batch at each call, the result
as a named structure.

    import reco.nn

    loss_fn = reco.nn.PolicyLoss("dapo", eps_high=0.28, dual_clip="off")
    loss_fn = reco.nn.PolicyLoss({"advantage": "rloo", "ratio": "variance", "weight": "expected_count"},
                                 weight_cap=5.0, group_size=8)
    out = loss_fn(logp, old_logp=old_logp, mask=mask, advantages=advantages)
    out.loss.backward()
    out.metrics()["clip_frac"]

The module computes exactly what :func:`reco.policy_loss` computes for its objective and override
keys (``loss_fn.objective``, ``loss_fn.overrides``); it has no parameters or buffers.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, NamedTuple, Optional, Union

import torch

import reco
from reco._errors import parameter_key

Tensor = torch.Tensor
Value = Union[float, int, bool, str]

# The typed constructor arguments and the override key each one sets.
_NAMED = {
    "eps_low": "clip.eps_low",
    "eps_high": "clip.eps_high",
    "dual_clip": "clip.dual_clip",
    "dual_clip_c": "clip.dual_clip_c",
    "delta": "clip.delta",
    "log_ratio_clamp": "ratio.log_ratio_clamp",
    "aggregation": "aggregate.kind",
    "max_length": "aggregate.max_length",
    "kl_beta": "kl.beta",
    "kl_estimator": "kl.estimator",
    "kl_importance_weighted": "kl.importance_weighted",
    "weight_cap": "weight.cap",
    "entropy_coef": "entropy.coef",
    "advantage_eps": "advantage.eps",
    "scale_by_std": "advantage.scale_by_std",
}


class LossOutput(NamedTuple):
    """One call's result: the 0-dim ``loss`` (differentiable in ``logp``, and in ``entropy``
    where a term reads it) and ``stats``, a float64 tensor on ``logp``'s device whose entries
    :func:`reco.stat_names` names."""

    loss: Tensor
    stats: Tensor

    def metrics(self) -> Dict[str, float]:
        """The stats as name -> value (reads them on the host: one synchronisation on CUDA)."""
        return dict(zip(reco.stat_names(), self.stats.double().cpu().tolist()))


class PolicyLoss(torch.nn.Module):
    """A GRPO-family policy loss (ReCo, GRPO, DAPO, GSPO, CISPO, ...) as a module.

    Args:
        objective: a preset name (:func:`reco.presets`), a peer preset (:func:`reco.peer_presets`),
            a composition (:func:`reco.compose`'s string) or a mapping slot -> component, e.g.
            ``{"advantage": "rloo", "ratio": "variance"}`` (:func:`reco.composition_slots`).
        eps_low, eps_high: the PPO clip's lower and upper ε (``clip.eps_low`` / ``clip.eps_high``).
        dual_clip: ``"off"``, ``"hard"`` or ``"soft"`` (``clip.dual_clip``).
        dual_clip_c: the dual clip's constant c (``clip.dual_clip_c``).
        delta: the two-sided clip's cap on the ratio, 0 for none (``clip.delta``).
        log_ratio_clamp: the clamp of log r before exp, 0 for none (``ratio.log_ratio_clamp``).
        aggregation: ``"token_mean"``, ``"seq_mean_token_mean"``, ``"seq_mean_token_sum"``,
            ``"seq_mean_token_sum_norm"`` or ``"seq_mean_token_sum_all"`` (``aggregate.kind``).
        max_length: the length L of ``seq_mean_token_sum_norm`` (``aggregate.max_length``).
        kl_beta: the KL term's coefficient β (``kl.beta``).
        kl_estimator: ``"k1"``, ``"abs"``, ``"k2"`` or ``"k3"`` (``kl.estimator``).
        kl_importance_weighted: the KL term weighted by the ratio (``kl.importance_weighted``).
        weight_cap: ReCo's response-weight cap, 0 for none (``weight.cap``).
        entropy_coef: the entropy bonus's coefficient (``entropy.coef``, compositions with
            ``entropy="entropy_bonus"``).
        advantage_eps: ε of the estimator's std (``advantage.eps``).
        scale_by_std: the estimator divides by the group's std (``advantage.scale_by_std``).
        group_size: G for equal groups of G consecutive responses (0: give ``group_offsets`` or
            ``prompt_ids`` at the call, or none where the objective reads no groups).
        host_stats: copy the stats to the host after each call and check the data there (CUDA:
            ``False`` never synchronises; bad data then sets the ``status`` stat).
        overrides: any other override key (:func:`reco.override_keys`), a number, a bool or, for
            a choice, its label (:func:`reco.choice_labels`).

    A named argument the objective has no key for is an error naming the argument; ``None``
    keeps the objective's own value.
    """

    def __init__(self, objective: Union[str, Mapping[str, str]] = "reco", *, eps_low: Optional[float] = None,
                 eps_high: Optional[float] = None, dual_clip: Optional[str] = None,
                 dual_clip_c: Optional[float] = None, delta: Optional[float] = None,
                 log_ratio_clamp: Optional[float] = None, aggregation: Optional[str] = None,
                 max_length: Optional[float] = None, kl_beta: Optional[float] = None,
                 kl_estimator: Optional[str] = None, kl_importance_weighted: Optional[bool] = None,
                 weight_cap: Optional[float] = None, entropy_coef: Optional[float] = None,
                 advantage_eps: Optional[float] = None, scale_by_std: Optional[bool] = None, group_size: int = 0,
                 host_stats: bool = True, overrides: Optional[Mapping[str, Value]] = None) -> None:
        super().__init__()
        if isinstance(objective, Mapping):
            name = reco.compose(**dict(objective))
        elif isinstance(objective, str):
            name = objective
            known = set(reco.presets()) | set(reco.peer_presets())
            if "=" not in name and name not in known:
                raise ValueError(f"reco.nn.PolicyLoss: objective: unknown preset '{name}' (reco.presets() lists them)")
        else:
            raise TypeError("reco.nn.PolicyLoss: objective: a preset name, a composition or a mapping slot -> kind")
        if not isinstance(group_size, int) or group_size < 0:
            raise ValueError(f"reco.nn.PolicyLoss: group_size: {group_size!r} must be an int >= 0")
        keys = set(reco.override_keys(name))
        labels = reco.choice_labels(name)
        given = dict(eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, dual_clip_c=dual_clip_c, delta=delta,
                     log_ratio_clamp=log_ratio_clamp, aggregation=aggregation, max_length=max_length, kl_beta=kl_beta,
                     kl_estimator=kl_estimator, kl_importance_weighted=kl_importance_weighted, weight_cap=weight_cap,
                     entropy_coef=entropy_coef, advantage_eps=advantage_eps, scale_by_std=scale_by_std)
        values: Dict[str, float] = {}
        self._arguments: Dict[str, str] = {}  # key -> the named argument that set it
        for argument, value in given.items():
            if value is None:
                continue
            key = _NAMED[argument]
            if key not in keys:
                raise ValueError(f"reco.nn.PolicyLoss: {argument}: '{name}' has no {key} (its keys: "
                                 f"reco.override_keys('{name}'))")
            values[key] = _number(argument, key, value, labels)
            self._arguments[key] = argument
        for key, value in (overrides or {}).items():
            if key not in keys:
                raise ValueError(f"reco.nn.PolicyLoss: overrides: '{name}' has no key '{key}' (its keys: "
                                 f"reco.override_keys('{name}'))")
            if key in values:
                raise ValueError(f"reco.nn.PolicyLoss: overrides: '{key}' is also set by a named argument")
            values[key] = _number(f"overrides['{key}']", key, value, labels)
        self.objective = name
        self.overrides: Dict[str, float] = values
        self.group_size = group_size
        self.host_stats = bool(host_stats)

    def forward(self, logp: Tensor, *, old_logp: Optional[Tensor] = None, ref_logp: Optional[Tensor] = None,
                entropy: Optional[Tensor] = None, mask: Optional[Tensor] = None, offsets: Optional[Tensor] = None,
                rewards: Optional[Tensor] = None, advantages: Optional[Tensor] = None,
                token_advantages: Optional[Tensor] = None, group_offsets: Optional[Tensor] = None,
                prompt_ids: Optional[Tensor] = None, token_weights: Optional[Tensor] = None,
                response_weights: Optional[Tensor] = None, rollout_logp: Optional[Tensor] = None,
                global_tokens: int = 0, global_responses: int = 0, global_kept_tokens: int = 0,
                global_kept_responses: int = 0) -> LossOutput:
        """The loss of one batch: the inputs of :func:`reco.policy_loss` (``[R, T]`` per-token
        tensors with ``mask``, or ``[N]`` with ``offsets``; ``[R]`` per response). ``group_size``
        set at construction is used unless ``group_offsets`` or ``prompt_ids`` are given."""
        groups = 0 if (group_offsets is not None or prompt_ids is not None) else self.group_size
        try:
            out = reco.policy_loss(self.objective, logp, old_logp=old_logp, ref_logp=ref_logp, entropy=entropy,
                               mask=mask, offsets=offsets, rewards=rewards, advantages=advantages,
                               group_offsets=group_offsets, prompt_ids=prompt_ids, token_weights=token_weights,
                               response_weights=response_weights, overrides=self.overrides,
                               global_tokens=global_tokens, global_responses=global_responses,
                               global_kept_tokens=global_kept_tokens, global_kept_responses=global_kept_responses,
                               host_stats=self.host_stats, group_size=groups, rollout_logp=rollout_logp,
                               token_advantages=token_advantages)
        except ValueError as e:
            found = parameter_key(e)
            if found is None or found[0] not in self.overrides:
                raise
            key, reason = found
            argument = self._arguments.get(key, f"overrides['{key}']")
            raise ValueError(f"reco.nn.PolicyLoss: {argument} = {self.overrides[key]:g}: {reason}") from None
        return LossOutput(out.loss, out.stats)

    def extra_repr(self) -> str:
        keys = ", ".join(f"{k}={v:g}" for k, v in sorted(self.overrides.items()))
        return f"'{self.objective}'" + (f", {keys}" if keys else "") + (
            f", group_size={self.group_size}" if self.group_size else "")


def _number(argument: str, key: str, value: Value, labels: Dict[str, list]) -> float:
    """An override value as the op takes it: a choice's label as its index, a bool as 0 / 1."""
    if isinstance(value, str):
        if key not in labels:
            raise ValueError(f"reco.nn.PolicyLoss: {argument}: {key} is a number, not a choice (got '{value}')")
        if value not in labels[key]:
            raise ValueError(f"reco.nn.PolicyLoss: {argument}: '{value}' is not one of {', '.join(labels[key])}")
        return float(labels[key].index(value))
    if key in labels:
        raise ValueError(f"reco.nn.PolicyLoss: {argument}: {key} is a choice: give its label "
                         f"({', '.join(labels[key])}), not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"reco.nn.PolicyLoss: {argument}: {value!r} must be finite")
    return number


__all__ = ["LossOutput", "PolicyLoss"]
