"""The caps on one model reply: how many bytes are read, how long it may stream (past either it is unusable)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODEL_TIMEOUT", "ReplyLimits"]

#: seconds allowed for one model request: the ``model_timeout`` option's default (:mod:`flakebot_magic.options`
#: reads it from here, so that the model's modules sit below the option table)
MODEL_TIMEOUT = 120.0


@dataclass(frozen=True)
class ReplyLimits:
    """The caps on one reply, made from the ``max_reply_bytes`` and ``max_reply_seconds`` settings.

    Examples
    --------
    >>> ReplyLimits(max_bytes=1024, max_seconds=5.0)
    ReplyLimits(max_bytes=1024, max_seconds=5.0)
    """

    max_bytes: int
    max_seconds: float
