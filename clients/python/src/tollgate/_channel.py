"""Connection plumbing shared by the Authority and Supervisor clients."""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Tuple, TypeVar, Union

import grpc

from .errors import TollgateError

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
"""Seconds a unary call may take before it fails with DEADLINE_EXCEEDED."""


def resolve_address(addr: PathLike) -> Tuple[str, bool]:
    """(gRPC target, whether to use TLS) of ``host:port``, ``http://host:port``,
    ``https://host:port``, ``unix:/path``, or the path of a daemon's ``.addr`` readiness file
    (a path starting with ``/`` or ``./``, or ending in ``.addr``), as the CLI accepts."""
    text = os.fspath(addr).strip()
    if not text:
        raise ValueError("empty daemon address")
    if text.startswith(("/", "./")) or text.endswith(".addr"):
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise ValueError(f"cannot read address file {os.fspath(addr)}: {e}") from None
        if not text:
            raise ValueError(f"address file {os.fspath(addr)} is empty (is the daemon ready?)")
    if text.startswith("https://"):
        return text[len("https://"):].rstrip("/"), True
    if text.startswith("http://"):
        return text[len("http://"):].rstrip("/"), False
    return text, False


def _read_pem(what: str, path: PathLike) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {os.fspath(path)}: {e}") from None


def tls_credentials(
    ca_file: Optional[PathLike], cert_file: Optional[PathLike], key_file: Optional[PathLike]
) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials from PEM files, as the CLI's ``--ca``, ``--cert`` and ``--key`` take
    them (``tollgate pki`` makes them); ``None`` when no CA is given (plaintext)."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("give cert_file and key_file together")
    if ca_file is None:
        if cert_file is not None:
            raise ValueError("cert_file needs ca_file: a client certificate is presented over TLS")
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("ca_file", ca_file),
        private_key=_read_pem("key_file", key_file) if key_file is not None else None,
        certificate_chain=_read_pem("cert_file", cert_file) if cert_file is not None else None,
    )


def read_token(token: Optional[str], token_file: Optional[PathLike]) -> Optional[str]:
    """The bearer token given directly or in a file (surrounding whitespace stripped)."""
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read()
        except OSError as e:
            raise ValueError(f"cannot read token file {os.fspath(token_file)}: {e}") from None
        if not token.strip():
            raise ValueError(f"token file {os.fspath(token_file)} is empty")
    if token is None:
        return None
    token = token.strip()
    if not token or any(c in token for c in "\r\n"):
        raise ValueError("the bearer token is empty or spans lines")
    return token


class _Client:
    """A channel to one daemon with its bearer token."""

    def __init__(
        self,
        addr: PathLike,
        token: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        timeout: float = DEFAULT_TIMEOUT,
        channel: Optional[grpc.Channel] = None,
        ca_file: Optional[PathLike] = None,
        cert_file: Optional[PathLike] = None,
        key_file: Optional[PathLike] = None,
    ) -> None:
        self.target, tls = resolve_address(addr)
        self.timeout = timeout
        self._token = read_token(token, token_file)
        credentials = tls_credentials(ca_file, cert_file, key_file)
        if channel is not None:
            self._channel = channel
        elif credentials is not None:
            self._channel = grpc.secure_channel(self.target, credentials)
        elif tls:
            self._channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials())
        else:
            self._channel = grpc.insecure_channel(self.target)

    def _metadata(self) -> List[Tuple[str, str]]:
        # DESIGN.md: gRPC metadata "authorization: Bearer <token>".
        return [("authorization", f"Bearer {self._token}")] if self._token else []

    def _unary(self, method: str, rpc: Callable[..., T], request: Any, timeout: Optional[float] = None) -> T:
        try:
            return rpc(request, metadata=self._metadata(), timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as e:
            raise TollgateError.from_rpc(method, e) from None

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"
