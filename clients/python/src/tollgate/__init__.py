"""Python client of Tollgate.

An authority mints Ed25519-signed run receipts; a supervisor runs each receipt in a sandbox.
This package wraps both gRPC APIs (``proto/tollgate/v1``) with typed values and clear errors,
and verifies receipts by the signing rule alone::

    from tollgate import Authority, Supervisor, FsGrant, OutputChunk, verify_receipt

    authority = Authority("127.0.0.1:7700", token_file="authority/admin.token")
    minted = authority.mint(
        "summarizer", audience="workstation", ttl="10m",
        argv=["/bin/sh", "-c", "tollgate-shim tool read /srv/notes.txt"],
        exec=["/bin/sh"], fs=[FsGrant.read("/srv")],
    )
    verify_receipt(minted.text, authority.key_set(), audience="workstation")

    supervisor = Supervisor("127.0.0.1:7701", token_file="supervisor/admin.token")
    run = supervisor.run(minted.text, on_output=lambda c: print(c.text, end=""))
    print(run.state.value, run.exit_code)

The raw generated stubs are importable as ``tollgate.v1.*_pb2`` / ``*_pb2_grpc``.
"""

from .authority import DEFAULT_AUTHORITY, Authority
from .errors import ReceiptError, TollgateError
from .receipt import (
    DEFAULT_CLOCK_SKEW,
    VerifiedReceipt,
    decode_text,
    ed25519_verify_strict,
    encode_text,
    key_id_of,
    verify_receipt,
)
from .supervisor import DEFAULT_SUPERVISOR, ApprovalEvent, RunEvent, Supervisor
from .types import (
    AgentSpec,
    Amendment,
    Ceiling,
    DecidedCall,
    EgressGrant,
    FsAccess,
    FsGrant,
    KeySet,
    Limits,
    MintedReceipt,
    OutputChunk,
    PendingCall,
    PendingChild,
    PublicKey,
    Receipt,
    Revocation,
    RouteGrant,
    Run,
    RunEnvelope,
    RunState,
    RunTree,
    Sensitivity,
    StoredReceipt,
    SupervisorInfo,
    TeardownReport,
    parse_duration,
    parse_size,
)

__version__ = "0.1.0"

__all__ = [
    "Authority",
    "Supervisor",
    "TollgateError",
    "ReceiptError",
    "verify_receipt",
    "VerifiedReceipt",
    "decode_text",
    "encode_text",
    "key_id_of",
    "ed25519_verify_strict",
    "DEFAULT_CLOCK_SKEW",
    "DEFAULT_AUTHORITY",
    "DEFAULT_SUPERVISOR",
    "RunEvent",
    "ApprovalEvent",
    "AgentSpec",
    "Amendment",
    "Ceiling",
    "DecidedCall",
    "EgressGrant",
    "FsAccess",
    "FsGrant",
    "KeySet",
    "Limits",
    "MintedReceipt",
    "OutputChunk",
    "PendingCall",
    "PendingChild",
    "PublicKey",
    "Receipt",
    "Revocation",
    "RouteGrant",
    "Run",
    "RunEnvelope",
    "RunState",
    "RunTree",
    "Sensitivity",
    "StoredReceipt",
    "SupervisorInfo",
    "TeardownReport",
    "parse_duration",
    "parse_size",
]
