"""Plain, typed values of the Tollgate API, and their conversion to and from protobuf.

Every value here is a frozen dataclass holding Python types (``str``, ``int``,
``datetime`` in UTC, tuples), so callers never need the generated protobuf classes.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._pb import authority_pb2, receipt_pb2, supervisor_pb2

__all__ = [
    "FsAccess",
    "Sensitivity",
    "RunState",
    "FsGrant",
    "RouteGrant",
    "Limits",
    "AgentSpec",
    "Receipt",
    "MintedReceipt",
    "PublicKey",
    "KeySet",
    "Revocation",
    "StoredReceipt",
    "Ceiling",
    "SupervisorInfo",
    "TeardownReport",
    "Run",
    "RunTree",
    "PendingChild",
    "OutputChunk",
    "PendingCall",
    "DecidedCall",
    "RunEnvelope",
    "Amendment",
    "parse_duration",
    "parse_size",
]

Duration = Union[int, float, timedelta, str]
"""A length of time: seconds, a ``timedelta``, or text such as ``"90s"``, ``"10m"``, ``"2h"``,
``"7d"`` (a bare number is seconds)."""

Size = Union[int, str]
"""A byte count: an ``int``, or text such as ``"512MiB"``, ``"5MB"``, ``"64k"``."""

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1000**3,
    "gib": 1 << 30,
}


def parse_duration(value: Duration) -> int:
    """Whole seconds of ``value`` (see :data:`Duration`). Raises ``ValueError`` when it is not
    a positive length of time."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value.lower())
        if not m:
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
    else:
        raise TypeError(f"a duration must be seconds, a timedelta or text, not {type(value).__name__}")
    if seconds < 1:
        raise ValueError(f"duration {value!r} is under one second")
    return int(seconds)


def parse_size(value: Size) -> int:
    """Bytes of ``value`` (see :data:`Size`). Raises ``ValueError`` on a malformed size."""
    if isinstance(value, bool):
        raise TypeError("a size must be an int or text, not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value} is negative")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
        if not m or m.group(2) not in _SIZE_UNITS:
            raise ValueError(f"{value!r} is not a size (e.g. 512MiB, 5MB, 64k)")
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    raise TypeError(f"a size must be an int or text, not {type(value).__name__}")


def _dt(message: Any, name: str) -> Optional[datetime]:
    """A Timestamp field as an aware UTC datetime, or None when unset."""
    if not message.HasField(name):
        return None
    value: datetime = getattr(message, name).ToDatetime(tzinfo=timezone.utc)
    return value


def _timestamp(value: Union[datetime, float, int]) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime is ambiguous: give one with a tzinfo")
        ts.FromDatetime(value.astimezone(timezone.utc))
    else:
        ts.FromNanoseconds(int(float(value) * 1_000_000_000))
    return ts


class FsAccess(str, enum.Enum):
    """What a file-system grant allows."""

    READ = "read"
    WRITE = "write"

    def to_proto(self) -> Any:
        return {FsAccess.READ: receipt_pb2.FS_ACCESS_READ, FsAccess.WRITE: receipt_pb2.FS_ACCESS_WRITE}[self]

    @classmethod
    def from_proto(cls, value: int) -> "FsAccess":
        if value == receipt_pb2.FS_ACCESS_WRITE:
            return cls.WRITE
        return cls.READ


class Sensitivity(str, enum.Enum):
    """How sensitive a text is; ordered LOW < MEDIUM < HIGH."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"

    def to_proto(self) -> Any:
        return {
            Sensitivity.LOW: receipt_pb2.SENSITIVITY_LOW,
            Sensitivity.MEDIUM: receipt_pb2.SENSITIVITY_MEDIUM,
            Sensitivity.HIGH: receipt_pb2.SENSITIVITY_HIGH,
        }[self]

    @classmethod
    def from_proto(cls, value: int) -> "Sensitivity":
        if value == receipt_pb2.SENSITIVITY_HIGH:
            return cls.HIGH
        if value == receipt_pb2.SENSITIVITY_MEDIUM:
            return cls.MEDIUM
        return cls.LOW


class RunState(str, enum.Enum):
    """Where a run is in its life (``tollgate.v1.RunState``)."""

    UNSPECIFIED = "unspecified"
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    EXPIRED = "expired"
    REVOKED = "revoked"
    LIMIT_EXCEEDED = "limit_exceeded"
    SHIM_DIED = "shim_died"
    SUPERVISOR_SHUTDOWN = "supervisor_shutdown"
    LOST = "lost"
    PARENT_ENDED = "parent_ended"

    @property
    def is_final(self) -> bool:
        """True once the run has ended (every state but UNSPECIFIED, STARTING, RUNNING)."""
        return self not in (RunState.UNSPECIFIED, RunState.STARTING, RunState.RUNNING)

    @classmethod
    def from_proto(cls, value: int) -> "RunState":
        name = supervisor_pb2.RunState.Name(value) if value in supervisor_pb2.RunState.values() else ""
        try:
            return cls(name.removeprefix("RUN_STATE_").lower()) if name else cls.UNSPECIFIED
        except ValueError:  # a state newer than this client
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class FsGrant:
    """Access to one host path.

    Attributes:
        path: Absolute, normalised host path.
        access: ``"read"`` or ``"write"`` (write implies read).
        mount: Optional absolute path inside the sandbox where the host path is bind-mounted;
            empty means reachable only through the gateway's file tools
            (``tollgate-shim tool read PATH``).
        ask: Each change the gateway makes beneath it waits for an operator's approval
            (gateway-only grants: no ``mount``).
        ask_reads: Each read through the gateway beneath it waits for an operator too (no
            mount may reach the same files).
    """

    path: str
    access: FsAccess = FsAccess.READ
    mount: str = ""
    ask: bool = False
    ask_reads: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "access", FsAccess(self.access))

    @classmethod
    def read(cls, path: str, mount: str = "", *, ask_reads: bool = False) -> "FsGrant":
        """A read grant (``ask_reads``: each read waits for an operator)."""
        return cls(path, FsAccess.READ, mount, ask_reads=ask_reads)

    @classmethod
    def write(cls, path: str, mount: str = "", *, ask: bool = False, ask_reads: bool = False) -> "FsGrant":
        """A write grant (``ask``: each change waits for an operator)."""
        return cls(path, FsAccess.WRITE, mount, ask=ask, ask_reads=ask_reads)

    @classmethod
    def coerce(cls, value: Union["FsGrant", Sequence[str]]) -> "FsGrant":
        """An FsGrant from an FsGrant or a ``(path, access[, mount])`` tuple."""
        if isinstance(value, FsGrant):
            return value
        if isinstance(value, str) or not 1 <= len(value) <= 3:
            raise TypeError(f"fs grant {value!r}: give FsGrant.read(path) or (path, access[, mount])")
        access = FsAccess(value[1]) if len(value) > 1 else FsAccess.READ
        return cls(value[0], access, value[2] if len(value) > 2 else "")

    def to_proto(self) -> Any:
        return receipt_pb2.FsGrant(
            path=self.path,
            access=self.access.to_proto(),
            mount=self.mount,
            ask=self.ask,
            ask_reads=self.ask_reads,
        )

    @classmethod
    def from_proto(cls, m: Any) -> "FsGrant":
        return cls(m.path, FsAccess.from_proto(m.access), m.mount, ask=m.ask, ask_reads=m.ask_reads)


@dataclass(frozen=True)
class RouteGrant:
    """Permission to use one model route up to a sensitivity."""

    name: str
    max_sensitivity: Sensitivity = Sensitivity.LOW

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_sensitivity", Sensitivity(self.max_sensitivity))

    @classmethod
    def coerce(cls, value: Union["RouteGrant", Sequence[str]]) -> "RouteGrant":
        """A RouteGrant from a RouteGrant or a ``(name, max_sensitivity)`` tuple."""
        if isinstance(value, RouteGrant):
            return value
        if isinstance(value, str) or len(value) != 2:
            raise TypeError(f"route {value!r}: give RouteGrant(name, sensitivity) or (name, sensitivity)")
        return cls(value[0], Sensitivity(value[1]))

    def to_proto(self) -> Any:
        return receipt_pb2.RouteGrant(name=self.name, max_sensitivity=self.max_sensitivity.to_proto())

    @classmethod
    def from_proto(cls, m: Any) -> "RouteGrant":
        return cls(m.name, Sensitivity.from_proto(m.max_sensitivity))


@dataclass(frozen=True)
class EgressGrant:
    """Permission to open outbound connections to one host (or ``*.suffix``) through the
    supervisor: its ports (``()``: 443 in a request; every port in a ceiling), the most
    sensitive text that may be sent there, and, for an inspected host, the secret the
    supervisor injects and the methods and path prefixes allowed per request."""

    host: str
    ports: Tuple[int, ...] = ()
    max_sensitivity: Sensitivity = Sensitivity.LOW
    inject: str = ""
    methods: Tuple[str, ...] = ()
    paths: Tuple[str, ...] = ()
    inspect: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_sensitivity", Sensitivity(self.max_sensitivity))
        object.__setattr__(self, "ports", tuple(int(p) for p in self.ports))
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "paths", tuple(self.paths))

    @classmethod
    def coerce(cls, value: Union["EgressGrant", str]) -> "EgressGrant":
        """An EgressGrant from an EgressGrant or a host name (port 443, up to low)."""
        if isinstance(value, EgressGrant):
            return value
        if isinstance(value, str):
            return cls(value)
        raise TypeError(f"egress {value!r}: give EgressGrant(host, ...) or a host name")

    def to_proto(self) -> Any:
        return receipt_pb2.EgressGrant(
            host=self.host,
            ports=list(self.ports),
            max_sensitivity=self.max_sensitivity.to_proto(),
            inject=self.inject,
            methods=list(self.methods),
            paths=list(self.paths),
            inspect=self.inspect,
        )

    @classmethod
    def from_proto(cls, m: Any) -> "EgressGrant":
        return cls(
            m.host,
            tuple(m.ports),
            Sensitivity.from_proto(m.max_sensitivity),
            m.inject,
            tuple(m.methods),
            tuple(m.paths),
            m.inspect,
        )


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.

    In a mint request a zero (or omitted) field takes the authority's default, capped by the
    operator's ceiling; in a receipt every field is set. :meth:`coerce` also takes a mapping
    whose byte fields are text such as ``"512MiB"``.
    """

    memory_bytes: int = 0
    pids: int = 0
    cpu_millicores: int = 0
    output_bytes: int = 0
    tmpfs_bytes: int = 0
    tool_calls: int = 0
    tokens: int = 0
    #: Open file descriptors of each sandbox process (RLIMIT_NOFILE); 0 means 1024.
    files: int = 0
    #: Outbound connections open at once; 0 means 16.
    egress_connections: int = 0
    #: Bytes the run's outbound connections carry, each way; 0 means 1 GiB.
    egress_bytes: int = 0
    #: Seconds an outbound connection may be idle; 0 means 60.
    egress_idle_seconds: int = 0

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "output_bytes", "tmpfs_bytes", "egress_bytes"):
            object.__setattr__(self, name, parse_size(getattr(self, name)))

    @classmethod
    def coerce(cls, value: Union["Limits", Mapping[str, Union[int, str]], None]) -> Optional["Limits"]:
        """Limits from Limits, a mapping of field names (byte fields may be text such as
        ``"64MiB"``), or None."""
        if value is None or isinstance(value, Limits):
            return value
        fields = {k: parse_size(v) if k.endswith("_bytes") else int(v) for k, v in value.items()}
        return cls(**fields)

    def to_proto(self) -> Any:
        return receipt_pb2.Limits(
            memory_bytes=self.memory_bytes,
            pids=self.pids,
            cpu_millicores=self.cpu_millicores,
            output_bytes=self.output_bytes,
            tmpfs_bytes=self.tmpfs_bytes,
            tool_calls=self.tool_calls,
            tokens=self.tokens,
            files=self.files,
            egress_connections=self.egress_connections,
            egress_bytes=self.egress_bytes,
            egress_idle_seconds=self.egress_idle_seconds,
        )

    @classmethod
    def from_proto(cls, m: Any) -> "Limits":
        return cls(
            memory_bytes=m.memory_bytes,
            pids=m.pids,
            cpu_millicores=m.cpu_millicores,
            output_bytes=m.output_bytes,
            tmpfs_bytes=m.tmpfs_bytes,
            tool_calls=m.tool_calls,
            tokens=m.tokens,
            files=m.files,
            egress_connections=m.egress_connections,
            egress_bytes=m.egress_bytes,
            egress_idle_seconds=m.egress_idle_seconds,
        )


@dataclass(frozen=True)
class AgentSpec:
    """A pinned agent command."""

    argv: Tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""

    @classmethod
    def from_proto(cls, m: Any) -> "AgentSpec":
        return cls(tuple(m.argv), dict(m.env), m.workdir)


@dataclass(frozen=True)
class Receipt:
    """A decoded receipt: what one run may do. See ``proto/tollgate/v1/receipt.proto``.

    ``gateway_exec`` and ``exec_ask`` are the programs the agent may run only through the
    gateway's exec tool (each command approved first, for ``exec_ask``);
    ``approval_timeout_seconds`` is how long a call waits for an operator."""

    receipt_id: str
    issuer: str
    key_id: str
    owner: str
    subject: str
    audience: Tuple[str, ...]
    issued_at: Optional[datetime]
    not_before: Optional[datetime]
    expires_at: Optional[datetime]
    policy_version: str
    parent_receipt_id: str
    depth: int
    agent: Optional[AgentSpec]
    limits: Optional[Limits]
    fs: Tuple[FsGrant, ...]
    exec: Tuple[str, ...]
    routes: Tuple[RouteGrant, ...]
    delegate_depth: Optional[int]
    egress: Tuple[EgressGrant, ...] = ()
    gateway_exec: Tuple[str, ...] = ()
    exec_ask: Tuple[str, ...] = ()
    approval_timeout_seconds: int = 0

    @classmethod
    def from_proto(cls, m: Any) -> "Receipt":
        return cls(
            receipt_id=m.receipt_id,
            issuer=m.issuer,
            key_id=m.key_id,
            owner=m.owner,
            subject=m.subject,
            audience=tuple(m.audience),
            issued_at=_dt(m, "issued_at"),
            not_before=_dt(m, "not_before"),
            expires_at=_dt(m, "expires_at"),
            policy_version=m.policy_version,
            parent_receipt_id=m.parent_receipt_id,
            depth=m.depth,
            agent=AgentSpec.from_proto(m.agent) if m.HasField("agent") else None,
            limits=Limits.from_proto(m.limits) if m.HasField("limits") else None,
            fs=tuple(FsGrant.from_proto(g) for g in m.fs),
            exec=tuple(m.exec),
            routes=tuple(RouteGrant.from_proto(r) for r in m.routes),
            delegate_depth=m.delegate.max_depth if m.HasField("delegate") else None,
            egress=tuple(EgressGrant.from_proto(g) for g in m.egress),
            gateway_exec=tuple(g.program for g in m.gateway_exec if not g.ask),
            exec_ask=tuple(g.program for g in m.gateway_exec if g.ask),
            approval_timeout_seconds=m.approval_timeout_seconds,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "Receipt":
        """Decodes the exact receipt bytes of an envelope (no signature check)."""
        return cls.from_proto(receipt_pb2.Receipt.FromString(data))


@dataclass(frozen=True)
class MintedReceipt:
    """A receipt as minted.

    Attributes:
        text: The text form (``tgr1.`` + base64url), what :meth:`Supervisor.start` takes.
        receipt_id: The receipt's id, also the id of the run it starts.
        key_id: Which authority key signed it.
        signature: The 64-byte Ed25519 signature.
        receipt_bytes: The exact signed protobuf bytes.
        receipt: Those bytes decoded.
    """

    text: str
    receipt_id: str
    key_id: str
    signature: bytes
    receipt_bytes: bytes
    receipt: Receipt

    @property
    def expires_at(self) -> Optional[datetime]:
        """The receipt's expiry."""
        return self.receipt.expires_at

    @classmethod
    def from_signed(cls, text: str, signed: Any) -> "MintedReceipt":
        receipt = Receipt.from_bytes(signed.receipt)
        return cls(
            text=text,
            receipt_id=receipt.receipt_id,
            key_id=signed.key_id,
            signature=bytes(signed.signature),
            receipt_bytes=bytes(signed.receipt),
            receipt=receipt,
        )


@dataclass(frozen=True)
class PublicKey:
    """One verification key of an authority."""

    key_id: str
    public_key: bytes
    created_at: Optional[datetime] = None
    active: bool = False
    retired_at: Optional[datetime] = None
    verify_until: Optional[datetime] = None

    @classmethod
    def from_proto(cls, m: Any) -> "PublicKey":
        return cls(
            key_id=m.key_id,
            public_key=bytes(m.public_key),
            created_at=_dt(m, "created_at"),
            active=m.active,
            retired_at=_dt(m, "retired_at"),
            verify_until=_dt(m, "verify_until"),
        )


@dataclass(frozen=True)
class KeySet:
    """The public keys that verify one authority's receipts."""

    issuer: str
    keys: Tuple[PublicKey, ...]

    @classmethod
    def from_proto(cls, m: Any) -> "KeySet":
        return cls(m.issuer, tuple(PublicKey.from_proto(k) for k in m.keys))


@dataclass(frozen=True)
class Revocation:
    """A recorded revocation.

    Attributes:
        already_revoked: True when the receipt had been revoked before this call (the record
            is then the earlier revocation). Always False outside :meth:`Authority.revoke`.
    """

    seq: int
    receipt_id: str
    revoked_at: Optional[datetime]
    reason: str
    revoked_by: str
    receipt_expires_at: Optional[datetime]
    already_revoked: bool = False

    @classmethod
    def from_proto(cls, m: Any, already_revoked: bool = False) -> "Revocation":
        return cls(
            seq=m.seq,
            receipt_id=m.receipt_id,
            revoked_at=_dt(m, "revoked_at"),
            reason=m.reason,
            revoked_by=m.revoked_by,
            receipt_expires_at=_dt(m, "receipt_expires_at"),
            already_revoked=already_revoked,
        )


@dataclass(frozen=True)
class StoredReceipt:
    """A receipt fetched back from the authority, with its revocation when revoked."""

    minted: MintedReceipt
    revocation: Optional[Revocation]


@dataclass(frozen=True)
class Ceiling:
    """The most an operator may grant (see ``Ceiling`` in authority.proto).

    ``exec`` entries ending in ``/`` cover every path beneath that directory; a zero limit
    means no cap; an empty ``audience`` means any supervisor.
    """

    max_ttl: Duration
    fs: Tuple[FsGrant, ...] = ()
    exec: Tuple[str, ...] = ()
    routes: Tuple[RouteGrant, ...] = ()
    limits: Optional[Limits] = None
    audience: Tuple[str, ...] = ()
    max_delegate_depth: int = 0
    egress: Tuple[EgressGrant, ...] = ()

    def to_proto(self) -> Any:
        return authority_pb2.Ceiling(
            fs=[FsGrant.coerce(g).to_proto() for g in self.fs],
            exec=list(self.exec),
            routes=[RouteGrant.coerce(r).to_proto() for r in self.routes],
            limits=(Limits.coerce(self.limits) or Limits()).to_proto(),
            max_ttl_seconds=parse_duration(self.max_ttl),
            audience=list(self.audience),
            max_delegate_depth=self.max_delegate_depth,
            egress=[EgressGrant.coerce(g).to_proto() for g in self.egress],
        )


@dataclass(frozen=True)
class SupervisorInfo:
    """Identity of a supervisor: its id is what receipts name in their audience."""

    supervisor_id: str
    trusted_key_ids: Tuple[str, ...]
    version: str
    cgroup_mode: str
    last_revocation_seq: int

    @classmethod
    def from_proto(cls, m: Any) -> "SupervisorInfo":
        return cls(m.supervisor_id, tuple(m.trusted_key_ids), m.version, m.cgroup_mode, m.last_revocation_seq)


@dataclass(frozen=True)
class TeardownReport:
    """What teardown found and did once a run ended."""

    reason: str
    duration_ms: int
    exit_code: Optional[int]
    signal: Optional[int]
    peak_memory_bytes: Optional[int]
    last_tool_call_id: str
    routes_used: Tuple[str, ...]
    output_truncated: bool
    cleanup_errors: Tuple[str, ...]
    landlock_abi: int
    #: Where the run's ``/work`` was kept on the supervisor's host (its receipt's
    #: ``workspace_keep_seconds``, whatever ended the run), for ``tollgate cp``; ``None`` when
    #: it was removed at teardown.
    workspace: Optional[str] = None
    #: Until when it is kept (then, or at ``remove_workspace``, it goes); ``None`` when none
    #: was kept.
    workspace_kept_until: Optional[datetime] = None

    @classmethod
    def from_proto(cls, m: Any) -> "TeardownReport":
        def opt(name: str) -> Optional[int]:
            return getattr(m, name) if m.HasField(name) else None

        return cls(
            reason=m.reason,
            duration_ms=m.duration_ms,
            exit_code=opt("exit_code"),
            signal=opt("signal"),
            peak_memory_bytes=opt("peak_memory_bytes"),
            last_tool_call_id=m.last_tool_call_id,
            routes_used=tuple(m.routes_used),
            output_truncated=m.output_truncated,
            cleanup_errors=tuple(m.cleanup_errors),
            landlock_abi=m.landlock_abi,
            workspace=m.workspace or None,
            workspace_kept_until=(
                datetime.fromtimestamp(m.workspace_kept_until, tz=timezone.utc)
                if m.workspace_kept_until
                else None
            ),
        )


@dataclass(frozen=True)
class Run:
    """One run on a supervisor; ``report`` is set once it has ended. A delegated (child) run
    names the run that started it in ``parent_run_id`` and has ``depth`` ≥ 1; it ends as
    ``PARENT_ENDED`` when its parent ends."""

    run_id: str
    owner: str
    subject: str
    state: RunState
    created_at: Optional[datetime]
    ended_at: Optional[datetime]
    expires_at: Optional[datetime]
    report: Optional[TeardownReport]
    parent_run_id: str = ""
    depth: int = 0
    #: How long its ``/work`` is kept after it ends, in seconds (its receipt's
    #: ``workspace_keep_seconds``; 0: removed at teardown).
    workspace_keep_seconds: int = 0

    @property
    def ended(self) -> bool:
        """Whether the run has ended and been torn down."""
        return self.state.is_final

    @property
    def exit_code(self) -> Optional[int]:
        """The agent's exit code, when it exited."""
        return self.report.exit_code if self.report else None

    @classmethod
    def from_proto(cls, m: Any) -> "Run":
        return cls(
            run_id=m.run_id,
            owner=m.owner,
            subject=m.subject,
            state=RunState.from_proto(m.state),
            created_at=_dt(m, "created_at"),
            ended_at=_dt(m, "ended_at"),
            expires_at=_dt(m, "expires_at"),
            report=TeardownReport.from_proto(m.report) if m.HasField("report") else None,
            parent_run_id=m.parent_run_id,
            depth=m.depth,
            workspace_keep_seconds=m.workspace_keep_seconds,
        )


@dataclass(frozen=True)
class PendingChild:
    """A child receipt minted for a run (through its gateway) and not started yet.

    Attributes:
        receipt_id: The child receipt's id (its run id once started).
        parent_run_id: The run that asked for it.
        subject: The child's name.
        expires_at: Its expiry (never after its parent's).
    """

    receipt_id: str
    parent_run_id: str
    subject: str
    expires_at: Optional[datetime]

    @classmethod
    def from_proto(cls, m: Any) -> "PendingChild":
        return cls(
            receipt_id=m.receipt_id,
            parent_run_id=m.parent_run_id,
            subject=m.subject,
            expires_at=_dt(m, "expires_at"),
        )


@dataclass(frozen=True)
class RunTree:
    """A run and every run it delegated (:meth:`Supervisor.tree`).

    Attributes:
        runs: The run first, then its descendants in pre-order (a parent before its
            children); ``parent_run_id`` and ``depth`` place each one.
        pending: Child receipts minted in the tree and not started yet.
    """

    runs: Tuple[Run, ...]
    pending: Tuple[PendingChild, ...]

    @classmethod
    def from_proto(cls, m: Any) -> "RunTree":
        return cls(
            runs=tuple(Run.from_proto(r) for r in m.runs),
            pending=tuple(PendingChild.from_proto(p) for p in m.pending),
        )


@dataclass(frozen=True)
class OutputChunk:
    """A piece of the agent's output, as it wrote it (not split at line ends).

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: The bytes.
    """

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """The bytes decoded as UTF-8 (undecodable bytes replaced)."""
        return self.data.decode("utf-8", errors="replace")

    @classmethod
    def from_proto(cls, m: Any) -> "OutputChunk":
        stream = "stderr" if m.stream == supervisor_pb2.OUTPUT_STREAM_STDERR else "stdout"
        return cls(stream, bytes(m.data))


def strings(value: Union[str, Iterable[str], None]) -> List[str]:
    """A list of strings from one string, an iterable of them, or None."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


@dataclass(frozen=True)
class PendingCall:
    """A gateway call waiting for an operator's approval: what it would do, never its data.

    Attributes:
        run_id, call_id: The run and the call (what :meth:`Supervisor.decide` names).
        owner, subject: The run's owner (operator) and agent name.
        tool: ``fs.write``, ``fs.delete``, ``fs.read``, ``fs.list``, ``fs.stat``, ``exec``,
            ``egress``, ``model.complete`` or ``delegate``.
        path: What it reaches: the host path, the program, ``host:port``, the route, the
            child's subject.
        bytes: ``fs.write``: bytes written; ``exec``: bytes of stdin; ``model.complete``:
            bytes of text that would leave.
        mode: ``fs.write``: how it writes.
        sensitivity, reasons: ``model.complete``: the classifier's judgement and why.
        argv, cwd: ``exec``: the command line and where it runs.
        stdin_sha256: ``exec``: the SHA-256 (hex) of the stdin it gets.
        asked_at, deadline: When it began to wait, and when it is denied unless decided.
    """

    run_id: str
    call_id: str
    owner: str
    subject: str
    tool: str
    path: str
    bytes: int
    mode: str
    sensitivity: str
    reasons: Tuple[str, ...]
    argv: Tuple[str, ...]
    cwd: str
    stdin_sha256: str
    asked_at: Optional[datetime]
    deadline: Optional[datetime]

    @classmethod
    def from_proto(cls, m: Any) -> "PendingCall":
        return cls(
            run_id=m.run_id,
            call_id=m.call_id,
            owner=m.owner,
            subject=m.subject,
            tool=m.tool,
            path=m.path,
            bytes=m.bytes,
            mode=m.mode,
            sensitivity=m.sensitivity,
            reasons=tuple(m.reasons),
            argv=tuple(m.argv),
            cwd=m.cwd,
            stdin_sha256=m.stdin_sha256,
            asked_at=_dt(m, "asked_at"),
            deadline=_dt(m, "deadline"),
        )


@dataclass(frozen=True)
class DecidedCall:
    """How a wait for approval ended.

    Attributes:
        outcome: ``"approved"``, ``"denied"``, ``"timed_out"``, ``"cancelled"`` or
            ``"run_ended"``.
        decided_by: The operator who decided (empty when no one did).
        reason: Why, as the decider gave it or as the supervisor says.
        remember: Whether later identical calls of the run pass without asking.
    """

    run_id: str
    call_id: str
    outcome: str
    decided_by: str
    reason: str
    remember: bool

    @classmethod
    def from_proto(cls, m: Any) -> "DecidedCall":
        name = supervisor_pb2.ApprovalOutcome.Name(m.outcome)
        return cls(
            run_id=m.run_id,
            call_id=m.call_id,
            outcome=name.removeprefix("APPROVAL_OUTCOME_").lower(),
            decided_by=m.decided_by,
            reason=m.reason,
            remember=m.remember,
        )


@dataclass(frozen=True)
class RunEnvelope:
    """What a live run's gateway allows after an amendment: its fs grants and gateway-only
    programs in force (``exec_ask``: those asking for each command), its budgets (``tokens``
    0: no model calls) and its expiry."""

    fs: Tuple[FsGrant, ...]
    tool_calls: int
    tokens: int
    output_bytes: int
    egress_bytes: int
    expires_at: Optional[datetime]
    gateway_exec: Tuple[str, ...] = ()
    exec_ask: Tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, m: Any) -> "RunEnvelope":
        return cls(
            fs=tuple(FsGrant.from_proto(g) for g in m.fs),
            tool_calls=m.tool_calls,
            tokens=m.tokens,
            output_bytes=m.output_bytes,
            egress_bytes=m.egress_bytes,
            expires_at=_dt(m, "expires_at"),
            gateway_exec=tuple(g.program for g in m.gateway_exec if not g.ask),
            exec_ask=tuple(g.program for g in m.gateway_exec if g.ask),
        )


@dataclass(frozen=True)
class Amendment:
    """A widening of one live run that the authority signed (:meth:`Authority.amend`); hand
    it to :meth:`Supervisor.amend` within 5 minutes.

    Attributes:
        amendment_id, receipt_id: The amendment and the receipt (= run) it widens.
        add_fs: Gateway-only grants it adds.
        tool_calls, tokens, output_bytes, egress_bytes: The new budgets (0: unchanged).
        gateway_exec, exec_ask: Programs it lets the exec tool run, only through the gateway
            (``exec_ask``: each command approved first).
        expires_at: The new expiry (None: unchanged).
        for_children: Whether the run's future children may be granted it too.
        amended_by: The operator who asked for it.
        signed: The signed envelope (``tollgate.v1.SignedAmendment``), passed on unchanged.
    """

    amendment_id: str
    receipt_id: str
    add_fs: Tuple[FsGrant, ...]
    tool_calls: int
    expires_at: Optional[datetime]
    for_children: bool
    amended_by: str
    signed: Any = field(repr=False, compare=False)
    tokens: int = 0
    output_bytes: int = 0
    egress_bytes: int = 0
    gateway_exec: Tuple[str, ...] = ()
    exec_ask: Tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, amendment: Any, signed: Any) -> "Amendment":
        return cls(
            amendment_id=amendment.amendment_id,
            receipt_id=amendment.receipt_id,
            add_fs=tuple(FsGrant.from_proto(g) for g in amendment.add_fs),
            tool_calls=amendment.tool_calls,
            expires_at=_dt(amendment, "expires_at"),
            for_children=amendment.for_children,
            amended_by=amendment.amended_by,
            signed=signed,
            tokens=amendment.tokens,
            output_bytes=amendment.output_bytes,
            egress_bytes=amendment.egress_bytes,
            gateway_exec=tuple(g.program for g in amendment.add_gateway_exec if not g.ask),
            exec_ask=tuple(g.program for g in amendment.add_gateway_exec if g.ask),
        )
