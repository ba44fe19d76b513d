"""Log-probability of the sampled token and entropy from the last hidden states and the lm_head,
without the ``[N, V]`` logits (docs/logits.md, "From hidden states").

    logp, entropy = reco.linear_logp_entropy(hidden, model.lm_head.weight, tokens, temperature=0.7)
    head = reco.LinearLogpEntropy(model.lm_head)        # wraps an existing nn.Linear
    logp, entropy = head(hidden, tokens, row_mask=mask)

The logits ``hidden @ weight.T + bias`` are formed a chunk of tokens at a time (one GEMM), reduced
to logp and entropy, and the backward recomputes each chunk's logits and turns them into the
gradients of ``hidden``, ``weight`` and ``bias``: the extra memory is the chunk's workspace
(``memory_budget`` bytes, 256 MiB by default), whatever the number of tokens. On the CPU a forward
whose backward can run keeps its last chunk's logits until then (within that budget), so the
backward skips their GEMM (``keep_last_chunk=False``: nothing is held between the two). CPU tensors, and
CUDA tensors where the op library has the CUDA ops (cuBLAS on PyTorch's current stream). With
``vocab_group`` (CPU tensors), the lm_head is sharded by rows over a ``torch.distributed`` group.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._errors import ops as _ops

Tensor = torch.Tensor

__all__ = ["LinearLogpEntropy", "linear_logp_entropy"]


def linear_logp_entropy(hidden: Tensor, weight: Tensor, tokens: Tensor, bias: Optional[Tensor] = None, *,
                        temperature: float = 1.0, row_mask: Optional[Tensor] = None, memory_budget: int = 0,
                        chunk_rows: int = 0, vocab_group=None, keep_last_chunk: bool = True) -> Tuple[Tensor, Tensor]:
    """``logp`` and ``entropy`` of ``softmax((hidden @ weight.T + bias) / temperature)`` per row.

    ``hidden``: ``[N, H]`` or ``[R, T, H]``; ``weight``: ``[V, H]`` (any strides, e.g. a transposed
    tied embedding); ``bias``: ``[V]`` or None, all of one dtype (float32, float64, bfloat16,
    float16). ``tokens``: int64 of hidden's row shape, ids in ``[0, V)``. ``row_mask``: bool of that
    shape, False rows are never read (padding) and get zero outputs and exactly zero gradient.
    ``memory_budget``: workspace bytes (0: the default of 256 MiB); ``chunk_rows`` > 0 sets the
    tokens per chunk instead; ``keep_last_chunk``: see above. Returns float32 tensors (float64 for float64 inputs) of hidden's row
    shape, differentiable in ``hidden``, ``weight`` and ``bias``. Bad input raises an error whose
    message starts with ``reco: <argument>:``.

    ``vocab_group``: a ``torch.distributed`` process group over which the lm_head is sharded by rows
    (tensor parallelism): each rank passes its rows of ``weight`` (and ``bias``), in rank order (rank
    0 the first ids), and the same ``hidden``, ``tokens`` and ``row_mask``; ``tokens`` are ids of the
    whole vocabulary. Each chunk's row statistics are combined with one all-reduce; every rank gets
    the whole ``logp`` and ``entropy``, and the backward sums the gradient of ``hidden`` over the ranks
    while each rank's ``weight`` gradient is its shard's."""
    group = None
    if vocab_group is not None:
        group = vocab_group if isinstance(vocab_group, str) else getattr(vocab_group, "group_name", None)
        if not isinstance(group, str):
            raise TypeError("reco: vocab_group: must be a torch.distributed process group (or its group_name), got "
                            f"{type(vocab_group).__name__}")
    return _ops.linear_logp_entropy(hidden, weight, tokens, bias, float(temperature), row_mask, int(memory_budget),
                                    int(chunk_rows), group, bool(keep_last_chunk))


class LinearLogpEntropy(torch.nn.Module):
    """An existing ``nn.Linear`` lm_head (its ``weight`` and ``bias`` parameters, shared, not copied)
    that returns ``(logp, entropy)`` of the sampled tokens instead of the logits."""

    def __init__(self, lm_head: torch.nn.Linear, temperature: float = 1.0, memory_budget: int = 0,
                 vocab_group=None):
        super().__init__()
        if not isinstance(lm_head, torch.nn.Linear):
            raise TypeError(f"reco: lm_head: must be a torch.nn.Linear, got {type(lm_head).__name__}")
        self.lm_head = lm_head
        self.temperature = float(temperature)
        self.memory_budget = int(memory_budget)
        self.vocab_group = vocab_group  # the lm_head holds this rank's rows of a sharded vocabulary

    def forward(self, hidden: Tensor, tokens: Tensor, row_mask: Optional[Tensor] = None,
                temperature: Optional[float] = None) -> Tuple[Tensor, Tensor]:
        tau = self.temperature if temperature is None else float(temperature)
        return linear_logp_entropy(hidden, self.lm_head.weight, tokens, self.lm_head.bias, temperature=tau,
                                   row_mask=row_mask, memory_budget=self.memory_budget,
                                   vocab_group=self.vocab_group)
