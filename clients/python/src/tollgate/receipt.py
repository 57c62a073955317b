"""Receipt verification, implemented from the signing rule alone (DESIGN.md, docs/receipts.md).

This module shares no code with the Rust implementation. The rule::

    signature = Ed25519(private_key, b"tollgate.receipt.v1\\n" || SignedReceipt.receipt)
    key_id    = lowercase hex of the first 8 bytes of SHA-256(32-byte public key)
    text form = "tgr1." + base64url without padding of the SignedReceipt protobuf bytes

The signature is checked over the exact bytes carried in the envelope; the receipt is never
re-encoded. Ed25519 is verified strictly (canonical ``S``; no small-order or non-canonical
public key or ``R``), as the Rust verifier's ``verify_strict`` does. The checks run in the
order of docs/receipts.md and stop at the first failure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection, Optional, Sequence, Tuple, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._pb import receipt_pb2
from .errors import ReceiptError
from .types import KeySet, PublicKey, Receipt

__all__ = [
    "DOMAIN",
    "TEXT_PREFIX",
    "DEFAULT_CLOCK_SKEW",
    "VerifiedReceipt",
    "verify_receipt",
    "decode_text",
    "encode_text",
    "key_id_of",
    "ed25519_verify_strict",
]

DOMAIN = b"tollgate.receipt.v1\n"
"""The domain prefix signed before the receipt bytes."""

TEXT_PREFIX = "tgr1."
"""The prefix of a receipt's text form."""

DEFAULT_CLOCK_SKEW = 30
"""Seconds of clock disagreement tolerated at both ends of the validity window (as the Rust
verifier's default)."""


def key_id_of(public_key: bytes) -> str:
    """The key_id of a 32-byte public key: hex of the first 8 bytes of its SHA-256."""
    return hashlib.sha256(public_key).digest()[:8].hex()


def encode_text(signed_bytes: bytes) -> str:
    """The text form of SignedReceipt bytes."""
    return TEXT_PREFIX + base64.urlsafe_b64encode(signed_bytes).decode("ascii").rstrip("=")


def decode_text(text: str) -> bytes:
    """The SignedReceipt bytes of a text form (surrounding whitespace ignored).

    Strict: the prefix, the base64url alphabet, no padding and zero trailing bits, so that
    every character is significant. Raises :class:`ReceiptError` (``malformed``).
    """
    text = text.strip()
    if not text.startswith(TEXT_PREFIX):
        raise ReceiptError("malformed", f"text form must start with {TEXT_PREFIX!r}")
    body = text[len(TEXT_PREFIX):]
    if not body:
        raise ReceiptError("malformed", "text form has an empty body")
    if "=" in body:
        raise ReceiptError("malformed", "text form carries base64 padding")
    if len(body) % 4 == 1:
        raise ReceiptError("malformed", "text form has an impossible base64 length")
    try:
        data = base64.b64decode((body + "=" * (-len(body) % 4)).encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise ReceiptError("malformed", f"text form is not base64url: {e}") from None
    # Non-zero trailing bits decode to the same bytes as the canonical text: refuse them.
    if encode_text(data) != text:
        raise ReceiptError("malformed", "text form has non-zero trailing bits")
    return data


def _parse_envelope(data: bytes) -> Any:
    try:
        signed = receipt_pb2.SignedReceipt.FromString(data)
    except Exception as e:  # protobuf's DecodeError, or anything its parser raises
        raise ReceiptError("malformed", f"envelope is not a SignedReceipt: {e}") from None
    # Only the canonical encoding is a receipt: no unknown, repeated or reordered fields.
    canonical = receipt_pb2.SignedReceipt(
        receipt=signed.receipt, key_id=signed.key_id, signature=signed.signature
    ).SerializeToString()
    if canonical != data:
        raise ReceiptError(
            "malformed", "envelope is not canonically encoded (unknown, repeated or reordered fields)"
        )
    return signed


# ---------------------------------------------------------------------------------------------
# Strict Ed25519: the checks OpenSSL's verification does not make (small-order and
# non-canonical points), on top of it. Edwards25519 arithmetic in affine coordinates; speed
# does not matter for a handful of points.
# ---------------------------------------------------------------------------------------------

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _decode_point(encoded: bytes) -> Optional[Tuple[int, int]]:
    """The affine point of a 32-byte encoding, or None when non-canonical or not on the curve."""
    if len(encoded) != 32:
        return None
    value = int.from_bytes(encoded, "little")
    sign = value >> 255
    y = value & ((1 << 255) - 1)
    if y >= _P:
        return None
    u = (y * y - 1) % _P
    v = (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P != 0:
        if (v * x * x + u) % _P != 0:
            return None
        x = x * _SQRT_M1 % _P
    if x == 0 and sign == 1:
        return None
    if x & 1 != sign:
        x = _P - x
    return x, y


def _add(p: Tuple[int, int], q: Tuple[int, int]) -> Tuple[int, int]:
    (x1, y1), (x2, y2) = p, q
    t = _D * x1 * x2 * y1 * y2 % _P
    x3 = (x1 * y2 + y1 * x2) * pow(1 + t, _P - 2, _P) % _P
    y3 = (y1 * y2 + x1 * x2) * pow(1 - t, _P - 2, _P) % _P
    return x3, y3


def _is_small_order(point: Tuple[int, int]) -> bool:
    eight = point
    for _ in range(3):
        eight = _add(eight, eight)
    return eight == (0, 1)


def _strict_point(encoded: bytes) -> bool:
    point = _decode_point(encoded)
    return point is not None and not _is_small_order(point)


def ed25519_verify_strict(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Strict Ed25519 verification (RFC 8032 with canonical S; the public key and R must be
    canonical encodings of points that are not of small order)."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    if int.from_bytes(signature[32:], "little") >= _L:
        return False
    if not _strict_point(public_key) or not _strict_point(signature[:32]):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedReceipt:
    """A receipt that passed :func:`verify_receipt`.

    Attributes:
        text: The text form as given (stripped).
        key_id: The key that signed it.
        receipt_bytes: The exact signed bytes.
        receipt: Those bytes decoded.
    """

    text: str
    key_id: str
    receipt_bytes: bytes
    receipt: Receipt

    @property
    def receipt_id(self) -> str:
        """The receipt's id."""
        return self.receipt.receipt_id


def _keys_of(key_set: Any) -> Sequence[Any]:
    """Accepts a :class:`KeySet`, the generated ``KeySet`` message, or a sequence of keys
    (objects with ``key_id`` and ``public_key``)."""
    return list(getattr(key_set, "keys", key_set))


def _now_seconds(now: Union[datetime, float, int, None]) -> int:
    if now is None:
        return int(time.time())
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise ValueError("now: a naive datetime is ambiguous: give one with a tzinfo")
        return int(now.timestamp() // 1)
    return int(now // 1)


def verify_receipt(
    text: str,
    key_set: Union[KeySet, Sequence[PublicKey], Any],
    audience: Optional[str] = None,
    now: Union[datetime, float, int, None] = None,
    *,
    revoked: Collection[str] = (),
    clock_skew: int = DEFAULT_CLOCK_SKEW,
) -> VerifiedReceipt:
    """Verifies a receipt's text form against an authority's key set.

    Checks, in order (the first failure raises :class:`ReceiptError` with its ``kind``): the
    text and envelope decode canonically (``malformed``); the envelope's key_id is in the key
    set (``unknown_key``) and that key follows the key_id rule (``bad_key``); the strict
    Ed25519 signature over ``"tollgate.receipt.v1\\n" || receipt bytes`` (``bad_signature``);
    the receipt decodes, names the envelope's key, has a lowercase hyphenated UUID id, a
    validity window and an audience (``malformed``); ``now + skew >= not_before``
    (``not_yet_valid``); ``now - skew < expires_at`` (``expired``); ``audience``, when given,
    is in the receipt's audience (``wrong_audience``); its id is not in ``revoked``
    (``revoked``). Times compare in whole seconds, as the Rust verifier does.

    Single use is the supervisor's check and is not made here.

    Args:
        text: The receipt's text form (``tgr1.``...).
        key_set: The authority's keys: :meth:`Authority.key_set`'s result, the generated
            ``KeySet`` message, or a sequence of keys.
        audience: The supervisor id the receipt must name, or None to skip the check.
        now: The verifier's clock (aware datetime or Unix seconds); None for the current time.
        revoked: Receipt ids known to be revoked.
        clock_skew: Seconds of tolerance at both ends of the validity window.

    Returns:
        The verified receipt, decoded from the signed bytes.
    """
    signed = _parse_envelope(decode_text(text))

    matches = [k for k in _keys_of(key_set) if k.key_id == signed.key_id]
    if not matches:
        raise ReceiptError("unknown_key", f"key_id {signed.key_id!r} is not in the key set")
    key = matches[0]
    public_key = bytes(key.public_key)
    if len(public_key) != 32:
        raise ReceiptError("bad_key", f"key {key.key_id} is {len(public_key)} bytes, not 32")
    if key_id_of(public_key) != signed.key_id:
        raise ReceiptError(
            "bad_key", f"key set lists key_id {signed.key_id} for a key whose key_id is {key_id_of(public_key)}"
        )
    if not ed25519_verify_strict(public_key, DOMAIN + signed.receipt, signed.signature):
        raise ReceiptError("bad_signature", f"signature does not verify under key {signed.key_id}")

    try:
        message = receipt_pb2.Receipt.FromString(signed.receipt)
    except Exception as e:
        raise ReceiptError("malformed", f"signed bytes are not a Receipt: {e}") from None
    if message.key_id != signed.key_id:
        raise ReceiptError(
            "malformed", f"receipt names key {message.key_id} but the envelope names {signed.key_id}"
        )
    try:
        canonical_id = str(uuid.UUID(message.receipt_id))
    except ValueError:
        canonical_id = None
    if canonical_id != message.receipt_id:
        raise ReceiptError("malformed", f"receipt_id {message.receipt_id!r} is not a lowercase hyphenated UUID")
    if not message.HasField("not_before") or not message.HasField("expires_at"):
        raise ReceiptError("malformed", "receipt lacks not_before or expires_at")
    not_before, expires_at = message.not_before.seconds, message.expires_at.seconds
    if expires_at <= not_before:
        raise ReceiptError("malformed", "receipt expires before it is valid")
    if not message.audience:
        raise ReceiptError("malformed", "receipt has an empty audience")

    now_s = _now_seconds(now)
    if now_s + clock_skew < not_before:
        raise ReceiptError("not_yet_valid", f"receipt {message.receipt_id} is valid from {not_before}, now is {now_s}")
    if now_s - clock_skew >= expires_at:
        raise ReceiptError("expired", f"receipt {message.receipt_id} expired at {expires_at}, now is {now_s}")
    if audience is not None and audience not in message.audience:
        raise ReceiptError(
            "wrong_audience",
            f"receipt {message.receipt_id} is not for {audience!r}; its audience is {list(message.audience)}",
        )
    if message.receipt_id in revoked:
        raise ReceiptError("revoked", f"receipt {message.receipt_id} has been revoked")
    return VerifiedReceipt(
        text=text.strip(),
        key_id=signed.key_id,
        receipt_bytes=bytes(signed.receipt),
        receipt=Receipt.from_proto(message),
    )
