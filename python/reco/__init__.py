"""reco: GRPO-family policy objectives (ReCo, GRPO, DAPO, GSPO, CISPO, ASPO, the 80/20 rule) for
PyTorch, as typed functions over the op library ``torch.ops.reco``.

    import reco
    out = reco.policy_loss("reco", logp, old_logp=old_logp, ref_logp=ref_logp, mask=mask,
                           rewards=rewards, group_offsets=group_offsets)
    out.loss.backward()          # d loss / d logp (and d loss / d entropy where a term has one)
    print(out.stats_dict()["clip_fraction"])

Shapes: per-token inputs are ``[R, T]`` with a bool/uint8 ``mask`` (padded) or ``[N]`` with
``offsets`` (packed, R + 1 int64 offsets); per-response inputs are ``[R]``; ``group_offsets`` are
P + 1 int64 offsets of the prompt groups (or give ``prompt_ids``, one per response, contiguous).
Every input a preset does not read is an error naming it. ``presets()`` lists the preset names
and ``override_keys(preset)`` the parameters ``overrides`` may set. The docs of the repository
(docs/torch.md, docs/presets.md, docs/distributed.md) give the definitions.

Batch operations (``reco.batch``, also at the top level): ``advantages`` (a preset's or an
estimator's per-response advantages), ``filter_groups``, ``overlong_penalty``, ``mask_truncated``,
``group_offsets``, ``group_by_prompt``. Evaluation metrics (``reco.metrics``, also at the top
level): ``pass_at_k``, ``pass_at_k_curve``, ``sentence_bleu``, ``self_bleu``,
``self_bleu_per_response``, ``self_bleu_among_correct``, ``distinct_n``, ``path_uniqueness``,
``token_variance_by_position``, ``mean_token_entropy``, ``mean_abs_kl``,
``mean_log_likelihood_per_response``, ``gaussian_kde``, ``gaussian_kde_evaluate``
(docs/batch_ops.md, docs/eval.md).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

__version__ = "0.1.0"

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libreco_torch_ops.so")
if not os.path.exists(_LIBRARY):
    raise ImportError(f"reco: the op library {_LIBRARY} is missing; reinstall with "
                      "`pip install --no-build-isolation .` from the repository")
try:
    from ._build_info import BUILD_INFO as _BUILD_INFO
except ImportError:  # an op library built by hand with CMake and copied here
    _BUILD_INFO = {}
try:
    torch.ops.load_library(_LIBRARY)
except OSError as e:
    built = _BUILD_INFO.get("torch", "an unknown torch")
    raise ImportError(f"reco: the op library {_LIBRARY} was built against torch {built} and does not load with "
                      f"torch {torch.__version__} ({e}); rebuild it with this torch: "
                      "pip install --no-build-isolation --force-reinstall .") from e
from ._errors import ops as _ops  # noqa: E402 (reco errors as ValueError)

Tensor = torch.Tensor


def library_path() -> str:
    """The path of the op library this package loaded (for torch.ops.load_library elsewhere)."""
    return _LIBRARY


def build_info() -> Dict[str, object]:
    """What the installed op library was built with, and what it runs with now:

    ``torch`` (the version it was compiled against) and ``torch_cuda`` (that torch's CUDA, "" for
    a CPU build of torch), ``cuda`` (whether the CUDA ops were compiled: CUDA tensors run only
    then), ``cuda_architectures`` (CMake's notation: ``90-real`` is sm_90 code, ``120`` sm_120
    code plus PTX), ``cuda_compile_check_only`` (compiled as a check only, unoptimised: CI),
    ``nvcc``, ``compiler``, ``build_type``, ``cxx11_abi``; ``torch_runtime`` (the torch imported
    now) and ``cuda_available`` (``torch.cuda.is_available()`` now)."""
    info: Dict[str, object] = dict(_BUILD_INFO)
    info["torch_runtime"] = torch.__version__
    info["cuda_available"] = bool(torch.cuda.is_available())
    return info


def presets() -> List[str]:
    """The preset names, in registry order."""
    return list(_ops.presets())


def peer_presets() -> Dict[str, str]:
    """The peer presets (``verl_vanilla``, ``trl_dapo``, ...) as name -> the preset it runs.

    A peer preset is a preset of ``presets()`` with a peer's default constants (docs/peers.md);
    every function that takes a preset name takes these too, and ``overrides`` apply on top."""
    flat = list(_ops.peer_presets())
    return dict(zip(flat[0::2], flat[1::2]))


def override_keys(preset: str) -> List[str]:
    """The keys ``overrides`` may set for ``preset`` ("<component>.<field>"), or for a
    composition (``compose``): the keys of its chosen components."""
    return list(_ops.override_keys(preset))


@functools.lru_cache(maxsize=256)
def has_kl_term(preset: str) -> bool:
    """Whether ``preset`` (or a composition) has a KL term of its own. Every preset takes the
    ``kl.*`` keys on CPU tensors; one without a KL term gains it only when a key sets it."""
    if "=" in preset:
        return "kl=kl_penalty" in re.split(r"[ ,;\t]+", preset.replace("compose:", ""))
    if preset in ("clip_cov", "kl_cov"):
        return False  # covariance selection: no composition, no KL term
    return "kl=kl_penalty" in as_composition(preset)[0].split()


def composition_slots() -> Dict[str, List[str]]:
    """The slots of a composition and the kinds each takes (the first is the default)."""
    out: Dict[str, List[str]] = {}
    for entry in _ops.composition_slots():
        slot, kinds = entry.split("=", 1)
        out[slot] = kinds.split("|")
    return out


def compose(**slots: str) -> str:
    """Any objective without compiling: a component named for each slot, e.g.

        name = reco.compose(advantage="rloo", ratio="variance", clip="ppo",
                            weight="expected_count", aggregate="token_mean", kl="kl_penalty")
        out = reco.policy_loss(name, logp, ..., overrides={"clip.eps_high": 0.28})

    Slots (``composition_slots()``): advantage, ratio, clip, weight, aggregate, select, kl,
    entropy; a slot left out takes its default. The name is accepted wherever a preset name is
    (CPU tensors), and ``overrides`` set the chosen components' parameters
    (``override_keys(name)``). The result equals the same components composed in C++
    (docs/composition.md)."""
    known = composition_slots()
    for slot, kind in slots.items():
        if slot not in known:
            raise ValueError(f"compose: '{slot}' is not a slot (slots: {', '.join(known)})")
        if kind not in known[slot]:
            raise ValueError(f"compose: {slot}='{kind}' is not a kind of this slot (kinds: {', '.join(known[slot])})")
    return " ".join(f"{slot}={slots[slot]}" for slot in known if slot in slots)


def as_composition(preset: str) -> Tuple[str, Dict[str, float]]:
    """A preset (or peer preset) spelled as a composition: ``(name, overrides)`` such that
    ``policy_loss(name, ..., overrides=overrides)`` computes what ``policy_loss(preset, ...)``
    does (its components by name, its constants as keys): a starting point to vary one slot."""
    flat = list(_ops.as_composition(preset))
    overrides = {}
    for entry in flat[1:]:
        key, value = entry.split("=", 1)
        overrides[key] = float(value)
    return flat[0], overrides


def load_objective(config) -> Tuple[str, Dict[str, float]]:
    """An objective from a config: a dict, or the path of a JSON file, of the form

        {"preset": "dapo"}                       or
        {"objective": {"advantage": "grpo", "ratio": "variance", ...}}
        plus optional "overrides": {"clip.eps_high": 0.28, ...}

    Returns ``(name, overrides)`` for ``policy_loss(name, ..., overrides=overrides)``. A choice
    parameter may be given by its label ("clip.dual_clip": "hard") or its index."""
    if isinstance(config, (str, os.PathLike)):
        import json
        with open(config, "r", encoding="utf-8") as f:
            config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError("load_objective: the config must be a dict or a JSON file of one")
    unknown = set(config) - {"preset", "objective", "overrides"}
    if unknown:
        raise ValueError(f"load_objective: unknown entries {sorted(unknown)} (expected preset or objective, overrides)")
    if ("preset" in config) == ("objective" in config):
        raise ValueError("load_objective: give exactly one of 'preset' and 'objective'")
    name = config["preset"] if "preset" in config else compose(**config["objective"])
    overrides: Dict[str, float] = {}
    for key, value in (config.get("overrides") or {}).items():
        overrides[key] = _choice_index(name, key, value) if isinstance(value, str) else float(value)
    return name, overrides


def choice_labels(preset: str) -> Dict[str, List[str]]:
    """The parameters of ``preset`` (or of a composition) that are choices, as key -> labels;
    ``overrides`` take a choice by its index in the list."""
    out: Dict[str, List[str]] = {}
    for entry in _ops.choice_labels(preset):
        key, labels = entry.split("=", 1)
        out[key] = labels.split("|")
    return out


def _choice_index(name: str, key: str, label: str) -> float:
    labels = choice_labels(name)
    if key not in labels:
        raise ValueError(f"load_objective: overrides.{key} = '{label}': not a choice parameter of '{name}' "
                         "(give a number)")
    if label not in labels[key]:
        raise ValueError(f"load_objective: overrides.{key} = '{label}' is not one of {', '.join(labels[key])}")
    return float(labels[key].index(label))


def stat_names() -> List[str]:
    """The names of the entries of a loss's ``stats`` tensor, in order."""
    return list(_ops.stat_names())


class PolicyLoss(NamedTuple):
    """A policy loss: the 0-dim ``loss`` (differentiable in logp, and in entropy where a term
    reads it) and ``stats``, a float64 tensor named by ``stat_names()``."""

    loss: Tensor
    stats: Tensor

    def stats_dict(self) -> Dict[str, float]:
        """The stats as a name -> value dict (reads them on the host)."""
        return dict(zip(stat_names(), self.stats.double().cpu().tolist()))


def policy_loss(preset: str, logp: Tensor, *, old_logp: Optional[Tensor] = None,
                ref_logp: Optional[Tensor] = None, entropy: Optional[Tensor] = None,
                mask: Optional[Tensor] = None, offsets: Optional[Tensor] = None,
                rewards: Optional[Tensor] = None, advantages: Optional[Tensor] = None,
                group_offsets: Optional[Tensor] = None, prompt_ids: Optional[Tensor] = None,
                token_weights: Optional[Tensor] = None, response_weights: Optional[Tensor] = None,
                overrides: Optional[Dict[str, float]] = None, global_tokens: int = 0,
                global_responses: int = 0, global_kept_tokens: int = 0, global_kept_responses: int = 0,
                host_stats: bool = True, group_size: int = 0, rollout_logp: Optional[Tensor] = None,
                token_advantages: Optional[Tensor] = None) -> PolicyLoss:
    """The loss of one call of ``preset`` (with ``overrides``) on a batch.

    ``advantages`` (``[R]``) instead of ``rewards``: the preset's advantage estimator is replaced
    by the given values (verl, TRL), everything else unchanged. Groups are then needed only by a
    response weight that reads the group size (``reco``, ``dapo_reco``, ...): give
    ``group_offsets``, ``prompt_ids`` or ``group_size`` (equal groups of G responses).

    ``token_advantages`` (like ``logp``, CPU) instead of ``advantages``: one advantage per token
    (GAE's, verl's token baselines), read by every per-token term in place of the response's;
    masked tokens are not read. Not both.

    ``global_*`` are the step's counts when a step is split by hand (0: count this call); a
    split step is better served by the step plan (``plan_summary`` / ``planned_policy_loss``).

    ``rollout_logp`` (like ``logp``, CPU): the inference engine's log-probs of the sampled tokens,
    read only by the expected-count weight (``reco``, ``dapo_reco``, ...) with the override
    ``{"weight.sampling": 1}`` (rollout), which then averages them instead of ``old_logp``
    (docs/presets.md); given without that switch, or the switch without them, is an error.
    Per-token rollout importance weights (``rollout_correction``) go in ``token_weights``.
    """
    loss, stats = _ops.policy_loss(preset, logp, old_logp, ref_logp, entropy, mask, offsets, rewards,
                                   advantages, group_offsets, prompt_ids, token_weights, response_weights,
                                   overrides, global_tokens, global_responses, global_kept_tokens,
                                   global_kept_responses, host_stats, group_size, rollout_logp, token_advantages)
    return PolicyLoss(loss, stats)


def token_logp_entropy(logits: Tensor, tokens: Tensor, temperature: float = 1.0,
                       row_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """log p(token) and the entropy of softmax(logits / temperature) per row: logits ``[..., V]``
    (float32, bfloat16 or float16), tokens ``[...]`` int64. Differentiable in logits."""
    return _ops.token_logp_entropy(logits, tokens, temperature, row_mask)


def plan_summary(preset: str, part: Sequence[int], scale: float, summaries: Sequence[Tensor], logp: Tensor, *,
                 overrides: Optional[Dict[str, float]] = None, group_size: int = 0,
                 **inputs: Optional[Tensor]) -> Tensor:
    """This micro-batch's summary of the step plan's next stage (stage 0 when ``summaries`` is
    empty), or an empty tensor once the plan is complete. Sum it over the step's micro-batches
    and ranks (``torch.distributed.all_reduce``) and append the sum to ``summaries``. The summary
    is a float64 tensor on ``logp``'s device (CUDA tensors: NCCL sums it there; the plan's passes
    read host copies of the inputs).
    ``part`` = [step id, responses of the step, first response of this micro-batch, its first
    group]; ``scale`` = the world size under DDP averaging (1 for a plain sum); ``inputs`` are the
    tensor keywords of ``policy_loss``."""
    rollout_logp = inputs.pop("rollout_logp", None)
    token_advantages = inputs.pop("token_advantages", None)
    return _ops.plan_summary(preset, list(part), float(scale), list(summaries), logp, *_tensor_inputs(inputs),
                             overrides, group_size, rollout_logp, token_advantages)


def planned_policy_loss(preset: str, part: Sequence[int], scale: float, summaries: Sequence[Tensor], logp: Tensor,
                        *, overrides: Optional[Dict[str, float]] = None, group_size: int = 0,
                        **inputs: Optional[Tensor]) -> PolicyLoss:
    """This micro-batch's share of the step's loss under the plan ``summaries`` give (see
    ``plan_summary``): the shares' sum over the step is one call on the whole step."""
    rollout_logp = inputs.pop("rollout_logp", None)
    token_advantages = inputs.pop("token_advantages", None)
    loss, stats = _ops.planned_policy_loss(preset, list(part), float(scale), list(summaries), logp,
                                           *_tensor_inputs(inputs), overrides, group_size, rollout_logp,
                                           token_advantages)
    return PolicyLoss(loss, stats)


_TENSOR_INPUTS = ("old_logp", "ref_logp", "entropy", "mask", "offsets", "rewards", "advantages", "group_offsets",
                  "prompt_ids", "token_weights", "response_weights")


def _tensor_inputs(inputs: Dict[str, Optional[Tensor]]) -> List[Optional[Tensor]]:
    unknown = sorted(set(inputs) - set(_TENSOR_INPUTS))
    if unknown:
        raise TypeError(f"reco: unknown input(s) {unknown}; the inputs are "
                        f"{list(_TENSOR_INPUTS) + ['rollout_logp', 'token_advantages']}")
    return [inputs.get(k) for k in _TENSOR_INPUTS]


# After the op library is loaded: the submodules bind torch.ops.reco.
from . import batch, metrics, nn  # noqa: E402
from .batch import *  # noqa: E402,F401,F403
from .metrics import *  # noqa: E402,F401,F403
from .linear import LinearLogpEntropy, linear_logp_entropy  # noqa: E402,F401

__all__ = batch.__all__ + metrics.__all__ + [
    "PolicyLoss", "batch", "build_info", "library_path", "metrics", "nn", "override_keys", "plan_summary",
    "planned_policy_loss", "policy_loss", "presets", "stat_names", "token_logp_entropy", "__version__"]
