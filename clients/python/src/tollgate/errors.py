"""Exceptions raised by the Tollgate client."""

from __future__ import annotations

from typing import Optional

import grpc

__all__ = ["TollgateError", "ReceiptError"]


class TollgateError(Exception):
    """A call to a Tollgate daemon failed, or a receipt was refused.

    Attributes:
        code: The gRPC status code (for example ``grpc.StatusCode.PERMISSION_DENIED``), or
            ``None`` when the failure did not come from a daemon (see :class:`ReceiptError`).
        message: The daemon's message. The daemons name what was wrong: the offending grant
            for ``PERMISSION_DENIED``, the field for ``INVALID_ARGUMENT``.
        method: The RPC that failed (``"MintReceipt"``), or ``None``.
    """

    def __init__(
        self,
        message: str,
        code: Optional[grpc.StatusCode] = None,
        method: Optional[str] = None,
    ) -> None:
        self.message = message
        self.code = code
        self.method = method
        super().__init__(str(self))

    @property
    def code_name(self) -> Optional[str]:
        """The status code's name, e.g. ``"PERMISSION_DENIED"``; ``None`` without a code."""
        return self.code.name if self.code is not None else None

    def __str__(self) -> str:
        parts = [p for p in (self.method, self.code_name) if p]
        return ": ".join(parts + [self.message])

    @classmethod
    def from_rpc(cls, method: str, error: grpc.RpcError) -> "TollgateError":
        """Wraps a ``grpc.RpcError`` raised by ``method``."""
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else None
        return cls(details or str(error), code=code, method=method)


class ReceiptError(TollgateError):
    """A receipt failed verification by :func:`tollgate.verify_receipt`.

    Attributes:
        kind: Why, as one of the verification failure codes of ``docs/receipts.md``:
            ``"malformed"``, ``"unknown_key"``, ``"bad_signature"``, ``"not_yet_valid"``,
            ``"expired"``, ``"wrong_audience"``, ``"revoked"``; plus ``"bad_key"`` when the key
            set itself is unusable (a key that is not 32 bytes, or whose key_id does not follow
            the key_id rule).
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")
