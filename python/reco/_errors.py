"""``torch.ops.reco`` with reco's argument errors raised as ``ValueError`` on every torch version.

A bad input is a ``reco::error`` (a ``std::invalid_argument``) whose message starts with
``reco: <argument>:``. torch 1.x's op binding turns it into ``ValueError``, torch 2.x's into
``RuntimeError``; the package promises ``ValueError``, so its calls go through these wrappers,
which re-raise such a ``RuntimeError`` as ``ValueError`` with the same message.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Tuple

import torch


class _Op:
    __slots__ = ("_op",)

    def __init__(self, op: Any) -> None:
        self._op = op

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._op(*args, **kwargs)
        except RuntimeError as e:
            message = str(e)
            if message.startswith("reco: "):
                raise ValueError(message) from None
            raise


class _Ops:
    """The op namespace: ``ops.policy_loss(...)`` calls ``torch.ops.reco.policy_loss``."""

    def __getattr__(self, name: str) -> _Op:
        if name.startswith("__"):
            raise AttributeError(name)
        op = _Op(getattr(torch.ops.reco, name))
        setattr(self, name, op)
        return op


ops = _Ops()


_PARAMETER = re.compile(r"^reco: (?:overrides\.)?([a-z_]+)\.(?:params\.)?([a-z_0-9]+): (.*)$", re.S)


def parameter_key(error: BaseException) -> Optional[Tuple[str, str]]:
    """``("<component>.<field>", reason)`` when ``error`` is reco's error about an objective's
    parameter (``reco: clip.params.eps_high: must be ...`` or ``reco: overrides.clip.eps_high:
    ...``), else None: lets an integration name its own argument for the key it set."""
    match = _PARAMETER.match(str(error))
    if match is None:
        return None
    return f"{match.group(1)}.{match.group(2)}", match.group(3)
