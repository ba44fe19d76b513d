"""Evaluation metrics (docs/eval.md): pass@k, BLEU and Self-BLEU, Distinct-n, reasoning-path
uniqueness, token variance by position, mean entropy and |KL|, and the Gaussian KDE of the
base-model likelihood; and the rule-based boxed-answer reward.

Token sequences are 1-D int64/int32 tensors or lists of ints, or strings, which are split on
ASCII whitespace with word ids shared within one prompt's set. ``responses`` is one prompt's
list of sequences, or a list of prompts, each a list of sequences. Per-token values are packed
(``[N]`` with R + 1 int64 ``offsets``) or padded (``[R, T]`` with a bool ``mask``; a response's
tokens are its unmasked entries, in order). Computation is on the host in float64. Bad input
raises ``ValueError`` whose message starts with ``reco: <argument>:``.
"""
from __future__ import annotations

import operator
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from ._errors import ops as _ops  # reco errors as ValueError
Tensor = torch.Tensor
TokenSequence = Union[Tensor, Sequence[int], str]

# ---- boxed-answer reward ---------------------------------------------------------------------


class BoxedAnswer(NamedTuple):
    """``reward`` 1.0 or 0.0; ``found_box``: the response has a well-formed last box;
    ``extracted``: its raw content; the two normalised strings; ``numeric_match``: the numeric
    tier decided (the strings differ)."""

    reward: float
    found_box: bool
    extracted: str
    normalised_answer: str
    normalised_reference: str
    numeric_match: bool


def boxed_answer_reward(response: str, reference: str, *, relative_tolerance: float = 1e-4) -> BoxedAnswer:
    """Rule-based reward: the last ``\\boxed{}`` of ``response`` against ``reference`` after the
    MATH checker's string normalisation, or as numbers within ``relative_tolerance`` (docs/eval.md).
    A reference that is empty after normalisation is a ValueError naming ``reference``."""
    return BoxedAnswer(*_ops.boxed_answer_reward(response, reference, float(relative_tolerance)))


def boxed_answer_rewards(responses: Sequence[str], references: Sequence[str], *,
                         relative_tolerance: float = 1e-4) -> Tensor:
    """``boxed_answer_reward(...).reward`` of each response against its reference (float64 ``[R]``)."""
    return _ops.boxed_answer_rewards(list(responses), list(references), float(relative_tolerance))


# ---- pass@k ----------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. 2021, 1 - C(n - c, k) / C(n, k), for n samples of which
    c are correct; 1 <= k <= n and 0 <= c <= n (else ValueError naming ``k`` or ``c``)."""
    return _ops.pass_at_k(operator.index(n), operator.index(c), operator.index(k))


class PassAtKCurve(NamedTuple):
    """``mean[j]``: the mean over problems of pass@ks[j]; ``per_problem[j, i]``: problem i."""

    ks: List[int]
    mean: Tensor
    per_problem: Tensor


def _int64(x) -> Tensor:
    if isinstance(x, Tensor):
        return x
    values = [operator.index(v) for v in x]
    return torch.tensor(values, dtype=torch.int64) if values else torch.empty(0, dtype=torch.int64)


def pass_at_k_curve(ns: Union[int, Sequence[int], Tensor], cs: Union[Sequence[int], Tensor],
                    ks: Sequence[int]) -> PassAtKCurve:
    """pass@k for every k of ``ks`` over problems with ``ns[i]`` samples (or one ``n`` for every
    problem) of which ``cs[i]`` are correct. Every k must lie in [1, n] for every problem."""
    cs_t = _int64(cs)
    if isinstance(ns, Tensor):
        ns_t = ns
    elif isinstance(ns, Sequence):
        ns_t = _int64(ns)
    else:
        ns_t = torch.full((cs_t.numel(),), operator.index(ns), dtype=torch.int64)
    ks_l = [operator.index(k) for k in ks]
    mean, per = _ops.pass_at_k_curve(ns_t, cs_t, ks_l)
    return PassAtKCurve(ks_l, mean, per)


# ---- token sequences -------------------------------------------------------------------------


def _is_sequence(x) -> bool:
    if isinstance(x, (str, Tensor)):
        return True
    return isinstance(x, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in x)


def _prompt_list(responses) -> Tuple[List[list], bool]:
    """(prompts, single): responses as a list of prompts, each a list of sequences."""
    responses = list(responses)
    if all(_is_sequence(r) for r in responses):
        return [responses], True
    prompts = []
    for i, p in enumerate(responses):
        if not isinstance(p, (list, tuple)) or not all(_is_sequence(r) for r in p):
            raise ValueError(f"reco: responses: entry {i} is neither a token sequence (tensor, list of ints, str) "
                             "nor a list of them (a prompt)")
        prompts.append(list(p))
    return prompts, False


def _token_tensors(prompt: list, name: str) -> List[Tensor]:
    """One prompt's sequences as tensors (texts tokenised together)."""
    texts = [isinstance(r, str) for r in prompt]
    if all(texts) and prompt:
        return list(_ops.tokenise_whitespace(prompt))
    if any(texts):
        raise ValueError(f"reco: {name}: a set mixes strings and token sequences")
    return [r if isinstance(r, Tensor) else torch.tensor(list(r), dtype=torch.int64) for r in prompt]


def _flat(prompts: List[list], name: str) -> Tuple[List[Tensor], List[int]]:
    seqs: List[Tensor] = []
    offsets = [0]
    for p in prompts:
        seqs.extend(_token_tensors(p, name))
        offsets.append(len(seqs))
    return seqs, offsets


# ---- BLEU ------------------------------------------------------------------------------------


def sentence_bleu(references: Sequence[TokenSequence], hypothesis: TokenSequence, *, max_order: int = 4,
                  smoothing: str = "method1", epsilon: float = 0.1) -> float:
    """BLEU of ``hypothesis`` against ``references`` with NLTK's sentence_bleu semantics: uniform
    weights over orders 1..max_order, clipped precision, closest-reference brevity penalty;
    ``smoothing`` "method1" (an order without a match gets precision epsilon / its n-grams, the
    default here) or "method0" (NLTK's default)."""
    seqs = _token_tensors(list(references) + [hypothesis], "references")
    return _ops.sentence_bleu(seqs[:-1], seqs[-1], operator.index(max_order), smoothing, float(epsilon))


def self_bleu_per_response(responses: Sequence[TokenSequence], *, max_order: int = 4, smoothing: str = "method1",
                           epsilon: float = 0.1) -> Tensor:
    """BLEU of each of one prompt's K >= 2 responses against the K - 1 others (float64 ``[K]``)."""
    return _ops.self_bleu_per_response(_token_tensors(list(responses), "responses"), operator.index(max_order),
                                       smoothing, float(epsilon))


def self_bleu(responses: Sequence[TokenSequence], *, max_order: int = 4, smoothing: str = "method1",
              epsilon: float = 0.1) -> float:
    """Self-BLEU of one prompt's responses: the mean of ``self_bleu_per_response`` (diversity is
    1 - Self-BLEU)."""
    return self_bleu_per_response(responses, max_order=max_order, smoothing=smoothing,
                                  epsilon=epsilon).mean().item()


class SelfBleuAmongCorrect(NamedTuple):
    """``mean`` over the prompts with at least 2 correct responses (``prompts_used``);
    ``per_prompt`` holds NaN for a skipped prompt."""

    mean: float
    per_prompt: Tensor
    prompts_used: int


def self_bleu_among_correct(prompts: Sequence[Sequence[TokenSequence]], correct: Sequence[Sequence[bool]], *,
                            max_order: int = 4, smoothing: str = "method1", epsilon: float = 0.1
                            ) -> SelfBleuAmongCorrect:
    """The paper's diversity table: per prompt, Self-BLEU of its responses flagged correct
    (``correct[i][j]``); prompts with fewer than 2 are skipped (every prompt skipped: ValueError
    naming ``correct``)."""
    prompts = [list(p) for p in prompts]
    correct = [list(c) for c in correct]
    if len(correct) != len(prompts):
        raise ValueError(f"reco: correct: has {len(correct)} prompts, prompts has {len(prompts)}")
    for i, (p, c) in enumerate(zip(prompts, correct)):
        if len(p) != len(c):
            raise ValueError(f"reco: correct: prompt {i} has {len(c)} flags for {len(p)} responses")
    seqs, offsets = _flat(prompts, "prompts")
    flags = torch.tensor([bool(f) for c in correct for f in c], dtype=torch.bool)
    mean, per, used = _ops.self_bleu_among_correct(seqs, offsets, flags, operator.index(max_order), smoothing,
                                                   float(epsilon))
    return SelfBleuAmongCorrect(mean, per, used)


# ---- Distinct-n and path uniqueness ----------------------------------------------------------


def distinct_n(responses, n: int, *, scope: str = "pooled_per_prompt", denominator: str = "ngrams") -> float:
    """Distinct-n: with ``scope="pooled_per_prompt"`` the unique n-grams of a prompt's responses
    over their n-grams (``denominator="ngrams"``) or tokens (``"tokens"``); with
    ``"per_response"`` the same per response, averaged over the prompt's responses. The mean over
    prompts; a unit with a zero denominator has no value and is left out (none has one:
    ValueError naming ``responses``)."""
    prompts, _ = _prompt_list(responses)
    seqs, offsets = _flat(prompts, "responses")
    return _ops.distinct_n(seqs, offsets, operator.index(n), scope, denominator)


def path_uniqueness(rollouts, prefix_code_points: int = 300) -> float:
    """Per prompt, the distinct prefixes of ``prefix_code_points`` Unicode code points among its K
    rollouts, divided by K; the mean over prompts. ``rollouts``: one prompt's list of str, or a
    list of such lists."""
    rollouts = list(rollouts)
    if all(isinstance(r, str) for r in rollouts):
        prompts = [rollouts]
    else:
        prompts = []
        for i, p in enumerate(rollouts):
            if isinstance(p, str) or not all(isinstance(r, str) for r in p):
                raise ValueError(f"reco: rollouts: entry {i} is neither a str nor a list of str (a prompt)")
            prompts.append(list(p))
    flat = [r for p in prompts for r in p]
    offsets = [0]
    for p in prompts:
        offsets.append(offsets[-1] + len(p))
    return _ops.path_uniqueness(flat, offsets, operator.index(prefix_code_points))


# ---- per-token summaries ---------------------------------------------------------------------


def _packed(values: Tensor, offsets: Optional[Tensor], mask: Optional[Tensor], name: str,
            *others: Tensor) -> Tuple[List[Tensor], Tensor]:
    """(values..., offsets) in the packed layout from either layout."""
    if (offsets is None) == (mask is None):
        raise ValueError("reco: offsets: give exactly one of offsets (packed values) and mask (padded values)")
    if offsets is not None:
        return [values, *others], offsets
    if mask.dtype != torch.bool:
        raise ValueError(f"reco: mask: must be a bool tensor, got {mask.dtype}")
    if mask.dim() != 2:
        raise ValueError(f"reco: mask: must be [R, T], got shape {tuple(mask.shape)}")
    for n, v in ((name, values), *(("ref_logp", o) for o in others)):
        if v.shape != mask.shape:
            raise ValueError(f"reco: {n}: shape {tuple(v.shape)} does not match mask {tuple(mask.shape)}")
    counts = mask.sum(1).to(torch.int64).cpu()
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    return [values[mask], *(o[mask] for o in others)], offs


class PositionVariance(NamedTuple):
    """Per third of the response (index 0 early, 1 middle, 2 late): ``mean`` token-weighted mean of
    p(1 - p) (NaN without tokens), ``standard_error`` of the per-response means across responses
    (NaN with fewer than 2), ``tokens`` and ``responses`` counted there."""

    mean: Tensor
    standard_error: Tensor
    tokens: Tensor
    responses: Tensor


def token_variance_by_position(probabilities: Tensor, offsets: Optional[Tensor] = None, *,
                               mask: Optional[Tensor] = None, log_probability: bool = False) -> PositionVariance:
    """Bernoulli variance p(1 - p) of each sampled token by position: token t of a response of
    length L is in third floor(3t / L). ``probabilities`` are p in [0, 1], or log p <= 0 with
    ``log_probability=True``."""
    (p,), offs = _packed(probabilities, offsets, mask, "probabilities")
    return PositionVariance(*_ops.token_variance_by_position(p, offs, bool(log_probability)))


class TokenMeanSummary(NamedTuple):
    """``token_mean``: over all tokens; ``response_mean``: over non-empty responses of each one's
    token mean; ``tokens``; ``responses`` (non-empty)."""

    token_mean: float
    response_mean: float
    tokens: int
    responses: int


def mean_token_entropy(entropy: Tensor, offsets: Optional[Tensor] = None, *,
                       mask: Optional[Tensor] = None) -> TokenMeanSummary:
    """Mean token entropy (values finite and >= 0), token- and response-level."""
    (e,), offs = _packed(entropy, offsets, mask, "entropy")
    return TokenMeanSummary(*_ops.mean_token_entropy(e, offs))


def mean_abs_kl(logp: Tensor, ref_logp: Tensor, offsets: Optional[Tensor] = None, *,
                mask: Optional[Tensor] = None) -> TokenMeanSummary:
    """Mean |logp - ref_logp| (the absolute k1 estimator) per token, token- and response-level."""
    (a, b), offs = _packed(logp, offsets, mask, "logp", ref_logp)
    return TokenMeanSummary(*_ops.mean_abs_kl(a, b, offs))


def mean_log_likelihood_per_response(logp: Tensor, offsets: Optional[Tensor] = None, *,
                                     mask: Optional[Tensor] = None) -> Tensor:
    """Each response's mean token log-probability (float64 ``[R]``; the KDE's input)."""
    (a,), offs = _packed(logp, offsets, mask, "logp")
    return _ops.mean_log_likelihood_per_response(a, offs)


class KDE(NamedTuple):
    """``density`` at the points of ``grid``; ``bandwidth`` h = ``factor`` * ``sample_std``."""

    grid: Tensor
    density: Tensor
    bandwidth: float
    factor: float
    sample_std: float


def gaussian_kde(samples: Tensor, *, rule: str = "scott", adjust: float = 1.0, grid_size: int = 200,
                 cut: float = 3.0) -> KDE:
    """Gaussian KDE as scipy.stats.gaussian_kde in one dimension (h = factor * std with ddof 1,
    factor n^(-1/5) for "scott" or (3n/4)^(-1/5) for "silverman", times ``adjust``), on seaborn's
    grid of ``grid_size`` points from min - cut h to max + cut h. ``samples``: >= 2 finite values,
    not all equal."""
    grid, density, h, factor, std = _ops.gaussian_kde(samples, rule, float(adjust), operator.index(grid_size),
                                                      float(cut))
    return KDE(grid, density, h, factor, std)


def gaussian_kde_evaluate(samples: Tensor, bandwidth: float, points: Tensor) -> Tensor:
    """(1/n) sum_i phi((x - x_i) / h) / h at each of ``points``."""
    return _ops.gaussian_kde_evaluate(samples, float(bandwidth), points)


__all__ = ["BoxedAnswer", "KDE", "PassAtKCurve", "PositionVariance", "SelfBleuAmongCorrect", "TokenMeanSummary",
           "boxed_answer_reward", "boxed_answer_rewards", "distinct_n", "gaussian_kde", "gaussian_kde_evaluate",
           "mean_abs_kl", "mean_log_likelihood_per_response", "mean_token_entropy", "pass_at_k", "pass_at_k_curve",
           "path_uniqueness", "self_bleu", "self_bleu_among_correct", "self_bleu_per_response", "sentence_bleu",
           "token_variance_by_position"]
