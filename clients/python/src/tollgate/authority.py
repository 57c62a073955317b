"""Client of the authority daemon (``tollgate.v1.Authority``)."""

from __future__ import annotations

from datetime import datetime
from typing import Iterable, Mapping, Optional, Sequence, Union

import grpc

from ._channel import DEFAULT_TIMEOUT, PathLike, _Client
from ._pb import authority_pb2, authority_pb2_grpc, receipt_pb2
from .types import (
    Amendment,
    Ceiling,
    Duration,
    EgressGrant,
    FsGrant,
    KeySet,
    Limits,
    MintedReceipt,
    Revocation,
    RouteGrant,
    StoredReceipt,
    Size,
    _timestamp,
    parse_duration,
    parse_size,
    strings,
)

__all__ = ["Authority", "DEFAULT_AUTHORITY"]

DEFAULT_AUTHORITY = "127.0.0.1:7700"
"""The authority's default listen address."""


class Authority(_Client):
    """Mints, fetches and revokes receipts, and serves the authority's public key set.

    Example::

        with Authority("127.0.0.1:7700", token_file="/var/lib/tollgate/authority/admin.token") as a:
            minted = a.mint("summarizer", audience="workstation", ttl="10m",
                            argv=["/usr/bin/python3", "/work/agent.py"],
                            exec=["/usr/bin/python3"],
                            fs=[FsGrant.read("/home/me/project")])
            print(minted.text)

    Args:
        addr: ``host:port``, ``http://host:port``, or the path of the daemon's
            ``authority.addr`` readiness file.
        token: The operator's bearer token (``<data-dir>/admin.token`` for the bootstrap
            admin). May be omitted for the public calls (:meth:`key_set`).
        token_file: A file holding the token, instead of ``token``.
        timeout: Seconds each call may take.
        channel: An existing ``grpc.Channel`` to use instead of opening one.
        ca_file: PEM of the CA the daemon's certificate must chain to: connect with TLS
            (``tollgate pki init`` makes one).
        cert_file, key_file: This client's certificate and key (PEM), for a daemon that
            requires one (``--tls-client-ca``).

    Every failed call raises :class:`tollgate.TollgateError` with the gRPC code and the
    daemon's message: ``UNAUTHENTICATED`` (missing or unknown token), ``PERMISSION_DENIED``
    (above the operator's ceiling; the message names the grant), ``INVALID_ARGUMENT``
    (malformed request; the message names the field), ``NOT_FOUND`` (unknown receipt id).
    """

    def __init__(
        self,
        addr: PathLike = DEFAULT_AUTHORITY,
        token: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        timeout: float = DEFAULT_TIMEOUT,
        channel: Optional[grpc.Channel] = None,
        ca_file: Optional[PathLike] = None,
        cert_file: Optional[PathLike] = None,
        key_file: Optional[PathLike] = None,
    ) -> None:
        super().__init__(
            addr,
            token,
            token_file=token_file,
            timeout=timeout,
            channel=channel,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self._stub = authority_pb2_grpc.AuthorityStub(self._channel)

    def mint(
        self,
        subject: str,
        *,
        audience: Union[str, Sequence[str]],
        ttl: Duration = 600,
        argv: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: str = "",
        fs: Iterable[Union[FsGrant, Sequence[str]]] = (),
        exec: Iterable[str] = (),
        routes: Iterable[Union[RouteGrant, Sequence[str]]] = (),
        limits: Union[Limits, Mapping[str, Union[int, str]], None] = None,
        delegate_depth: Optional[int] = None,
        not_before: Union[datetime, float, None] = None,
        egress: Iterable[Union[EgressGrant, str]] = (),
        gateway_exec: Iterable[str] = (),
        exec_ask: Iterable[str] = (),
        approval_timeout: Optional[Duration] = None,
        workspace_keep: Optional[Duration] = None,
    ) -> MintedReceipt:
        """Mints and signs a receipt for the calling operator, within its ceiling.

        Args:
            subject: The agent's name.
            audience: The supervisor id(s) allowed to honour the receipt.
            ttl: Lifetime from now (or from ``not_before``): seconds, a timedelta, or text
                such as ``"10m"``; at most the operator's ceiling.
            argv: Pins the agent command (absolute path first; it must be in ``exec``).
                Without it, the command is given when the run starts.
            env: Extra environment of a pinned agent (receipts are readable: no secrets).
            workdir: Working directory of a pinned agent inside the sandbox (default /work).
            fs: File-system grants: :class:`FsGrant` or ``(path, "read"|"write"[, mount])``.
            exec: Absolute paths of the executables the agent may run.
            routes: Model routes: :class:`RouteGrant` or ``(name, "low"|"medium"|"high")``.
            limits: :class:`Limits` or a mapping of its fields; zero or omitted fields take
                the authority's defaults.
            delegate_depth: Levels of delegation allowed; None means none.
            not_before: Start of validity (aware datetime or Unix seconds); None means now.
            egress: Outbound connections: :class:`EgressGrant` or a host name (port 443).
            gateway_exec: Programs the agent may run only through the gateway's exec tool
                (never directly), each command audited.
            exec_ask: Programs run only through the gateway, each command approved by an
                operator first.
            approval_timeout: How long a call waits for an operator before it is denied
                (default 5 minutes).
            workspace_keep: How long the run's ``/work`` is kept after it ends, however it
                ends, for ``tollgate cp`` (default: removed at teardown).

        Returns:
            The minted receipt: its text form, id and decoded fields.
        """
        request = authority_pb2.MintReceiptRequest(
            subject=subject,
            ttl_seconds=parse_duration(ttl),
            audience=strings(audience),
            fs=[FsGrant.coerce(g).to_proto() for g in fs],
            exec=strings(exec),
            routes=[RouteGrant.coerce(r).to_proto() for r in routes],
            egress=[EgressGrant.coerce(g).to_proto() for g in egress],
            gateway_exec=[receipt_pb2.GatewayExecGrant(program=p, ask=False) for p in strings(gateway_exec)]
            + [receipt_pb2.GatewayExecGrant(program=p, ask=True) for p in strings(exec_ask)],
        )
        if approval_timeout is not None:
            request.approval_timeout_seconds = parse_duration(approval_timeout)
        if workspace_keep is not None:
            request.workspace_keep_seconds = parse_duration(workspace_keep)
        if argv is not None or env or workdir:
            request.agent.CopyFrom(
                receipt_pb2.AgentSpec(argv=strings(argv), env=dict(env or {}), workdir=workdir)
            )
        lim = Limits.coerce(limits)
        if lim is not None:
            request.limits.CopyFrom(lim.to_proto())
        if delegate_depth is not None:
            request.delegate.CopyFrom(receipt_pb2.Delegation(max_depth=delegate_depth))
        if not_before is not None:
            request.not_before.CopyFrom(_timestamp(not_before))
        response = self._unary("MintReceipt", self._stub.MintReceipt, request)
        return MintedReceipt.from_signed(response.text, response.signed)

    def amend(
        self,
        receipt_id: str,
        *,
        add_fs: Iterable[Union[FsGrant, Sequence[str]]] = (),
        tool_calls: int = 0,
        tokens: int = 0,
        output_bytes: Size = 0,
        egress_bytes: Size = 0,
        gateway_exec: Iterable[str] = (),
        exec_ask: Iterable[str] = (),
        extend: Optional[Duration] = None,
        for_children: bool = False,
    ) -> Amendment:
        """Signs a widening of a live run (the receipt's owner, or an admin; within the
        caller's ceiling): gateway-only fs grants and programs (``gateway_exec``; ``exec_ask``
        for programs each command of which an operator approves), bigger budgets (each above
        the receipt's; 0 leaves it), a later expiry.
        Hand the result to :meth:`Supervisor.amend` within 5 minutes. ``for_children`` lets
        the run's future delegated children be granted it too."""
        request = authority_pb2.AmendReceiptRequest(
            receipt_id=receipt_id,
            add_fs=[FsGrant.coerce(g).to_proto() for g in add_fs],
            tool_calls=tool_calls,
            tokens=tokens,
            output_bytes=parse_size(output_bytes) if output_bytes else 0,
            egress_bytes=parse_size(egress_bytes) if egress_bytes else 0,
            add_gateway_exec=[receipt_pb2.GatewayExecGrant(program=p, ask=False) for p in strings(gateway_exec)]
            + [receipt_pb2.GatewayExecGrant(program=p, ask=True) for p in strings(exec_ask)],
            extend_seconds=parse_duration(extend) if extend is not None else 0,
            for_children=for_children,
        )
        response = self._unary("AmendReceipt", self._stub.AmendReceipt, request)
        return Amendment.from_proto(response.amendment, response.signed)

    def key_set(self) -> KeySet:
        """The public keys that verify this authority's receipts (public: no token needed)."""
        return KeySet.from_proto(self._unary("GetKeySet", self._stub.GetKeySet, authority_pb2.GetKeySetRequest()))

    def revoke(self, receipt_id: str, reason: str = "") -> Revocation:
        """Revokes a receipt (idempotent). Supervisors tear down its run when they learn of it.

        Returns:
            The revocation as recorded; ``already_revoked`` tells whether it was revoked
            before this call (the record is then the earlier one).
        """
        response = self._unary(
            "RevokeReceipt",
            self._stub.RevokeReceipt,
            authority_pb2.RevokeReceiptRequest(receipt_id=receipt_id, reason=reason),
        )
        return Revocation.from_proto(response.revocation, already_revoked=response.already_revoked)

    def get_receipt(self, receipt_id: str) -> StoredReceipt:
        """One receipt minted by this authority, with its revocation when revoked."""
        response = self._unary(
            "GetReceipt", self._stub.GetReceipt, authority_pb2.GetReceiptRequest(receipt_id=receipt_id)
        )
        revocation = Revocation.from_proto(response.revocation) if response.HasField("revocation") else None
        return StoredReceipt(MintedReceipt.from_signed(response.text, response.signed), revocation)

    def add_operator(self, name: str, ceiling: Ceiling, *, admin: bool = False) -> str:
        """Admin: creates an operator with a ceiling; returns its bearer token (shown once)."""
        response = self._unary(
            "AddOperator",
            self._stub.AddOperator,
            authority_pb2.AddOperatorRequest(name=name, ceiling=ceiling.to_proto(), admin=admin),
        )
        return str(response.token)
