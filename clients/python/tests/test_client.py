#!/usr/bin/env python3
"""Tests of the tollgate package (plain asserts; no pytest needed).

    python tests/test_client.py                                  # offline tests only
    python tests/test_client.py --authority ADDR --authority-token-file FILE \\
        [--supervisor ADDR --supervisor-token-file FILE]

Offline tests cover the receipt verifier (on receipts signed here with a fresh key) and the
helpers. With --authority they run against a live authority daemon (the token must be an
admin's: one test adds an operator); with --supervisor also against a live supervisor that
follows that authority (root: it builds sandboxes).

Prints "ok NAME" or "FAIL NAME: why" per test, then "N passed, N failed"; exits 0 only when
every test passed. The package must be installed (pip install ./clients/python): these tests
import it, never the source tree.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, List, Optional, Tuple

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import tollgate
from tollgate import (
    Authority,
    Ceiling,
    DecidedCall,
    FsGrant,
    Limits,
    OutputChunk,
    PendingCall,
    ReceiptError,
    Run,
    RunState,
    Supervisor,
    TollgateError,
    decode_text,
    ed25519_verify_strict,
    encode_text,
    key_id_of,
    verify_receipt,
)
from tollgate.v1 import receipt_pb2

# ---------------------------------------------------------------------------------------------
# A tiny runner.
# ---------------------------------------------------------------------------------------------

Test = Tuple[str, Callable[[], None]]
OFFLINE: List[Test] = []
AUTHORITY: List[Test] = []
SUPERVISOR: List[Test] = []


def test(group: List[Test]) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        group.append((fn.__name__.removeprefix("test_"), fn))
        return fn

    return register


class Context:
    authority: Optional[Authority] = None
    anonymous: Optional[Authority] = None
    supervisor: Optional[Supervisor] = None
    supervisor_id: str = "workstation"
    tls: dict = {}


CTX = Context()


def expect_error(code: grpc.StatusCode, fn: Callable[[], object], *contains: str) -> TollgateError:
    """Runs fn, which must raise TollgateError with `code` and a message holding `contains`."""
    try:
        fn()
    except ReceiptError:
        raise
    except TollgateError as e:
        assert e.code == code, f"expected {code.name}, got {e.code_name}: {e.message}"
        for part in contains:
            assert part in e.message, f"{code.name} message {e.message!r} lacks {part!r}"
        assert e.code_name is not None and e.code_name in str(e), str(e)
        assert e.method is not None and e.method in str(e), str(e)
        return e
    raise AssertionError(f"expected TollgateError {code.name}, nothing was raised")


def expect_rejected(kind: str, text: str, key_set: object, **kwargs: object) -> ReceiptError:
    try:
        verify_receipt(text, key_set, **kwargs)  # type: ignore[arg-type]
    except ReceiptError as e:
        assert e.kind == kind, f"rejected as {e.kind}, expected {kind}: {e}"
        assert isinstance(e, TollgateError) and e.code is None
        return e
    raise AssertionError(f"receipt verified; expected {kind}")


# ---------------------------------------------------------------------------------------------
# Receipts signed here, for the verifier's offline tests.
# ---------------------------------------------------------------------------------------------


class LocalSigner:
    def __init__(self) -> None:
        self.private = Ed25519PrivateKey.generate()
        self.public = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id_of(self.public)
        self.key_set = tollgate.KeySet("local", (tollgate.PublicKey(self.key_id, self.public, active=True),))

    def receipt(self, now: int, **overrides: object) -> "receipt_pb2.Receipt":
        r = receipt_pb2.Receipt(
            receipt_id=str(uuid.uuid4()),
            issuer="local",
            key_id=self.key_id,
            owner="admin",
            subject="offline",
            audience=["workstation"],
            exec=["/bin/sh"],
        )
        r.issued_at.FromSeconds(now)
        r.not_before.FromSeconds(now)
        r.expires_at.FromSeconds(now + 600)
        for name, value in overrides.items():
            if value is None:
                r.ClearField(name)
            elif isinstance(value, list):
                del getattr(r, name)[:]
                getattr(r, name).extend(value)
            else:
                setattr(r, name, value)
        return r

    def envelope(self, receipt_bytes: bytes, key_id: Optional[str] = None, signature: Optional[bytes] = None) -> bytes:
        sig = self.private.sign(tollgate.receipt.DOMAIN + receipt_bytes) if signature is None else signature
        return receipt_pb2.SignedReceipt(
            receipt=receipt_bytes, key_id=self.key_id if key_id is None else key_id, signature=sig
        ).SerializeToString()

    def text(self, receipt: "receipt_pb2.Receipt") -> str:
        return encode_text(self.envelope(receipt.SerializeToString()))


def flip(data: bytes, index: int) -> bytes:
    b = bytearray(data)
    b[index] ^= 0x01
    return bytes(b)


NOW = int(time.time())


@test(OFFLINE)
def test_helpers_parse_durations_sizes_and_addresses() -> None:
    assert tollgate.parse_duration("10m") == 600 and tollgate.parse_duration(timedelta(hours=2)) == 7200
    assert tollgate.parse_duration("7d") == 604800 and tollgate.parse_duration(90) == 90
    assert tollgate.parse_size("512MiB") == 512 << 20 and tollgate.parse_size("5MB") == 5_000_000
    for bad in ("ten minutes", "0s", -5):
        try:
            tollgate.parse_duration(bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} parsed as a duration")
    limits = Limits.coerce({"memory_bytes": "64MiB", "pids": 8})
    assert limits is not None and limits.memory_bytes == 64 << 20 and limits.pids == 8
    from tollgate._channel import read_token, resolve_address

    with tempfile.TemporaryDirectory() as d:
        addr = os.path.join(d, "authority.addr")
        with open(addr, "w") as f:
            f.write("127.0.0.1:4567\n")
        assert resolve_address(addr) == ("127.0.0.1:4567", False)
        assert resolve_address("http://127.0.0.1:7700") == ("127.0.0.1:7700", False)
        assert resolve_address("localhost:1") == ("localhost:1", False)
        token = os.path.join(d, "admin.token")
        with open(token, "w") as f:
            f.write("s3cret\n")
        assert read_token(None, token) == "s3cret"


@test(OFFLINE)
def test_text_form_is_strict() -> None:
    signer = LocalSigner()
    text = signer.text(signer.receipt(NOW))
    assert encode_text(decode_text(text)) == text
    assert decode_text("  " + text + "\n") == decode_text(text)
    expect_rejected("malformed", text + "=", signer.key_set)
    expect_rejected("malformed", "tgr2." + text[5:], signer.key_set)
    expect_rejected("malformed", text[:-1] + ("+" if text[-1] != "+" else "/"), signer.key_set)
    # A last character with non-zero trailing bits decodes to the same bytes: still refused.
    body = text[5:]
    if len(body) % 4 in (2, 3):
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        i = alphabet.index(body[-1])
        sloppy = "tgr1." + body[:-1] + alphabet[i | 1]
        if sloppy != text:
            expect_rejected("malformed", sloppy, signer.key_set)


@test(OFFLINE)
def test_locally_signed_receipt_verifies_with_every_check() -> None:
    signer = LocalSigner()
    r = signer.receipt(NOW, subject="local-agent")
    text = signer.text(r)
    verified = verify_receipt(text, signer.key_set, audience="workstation", now=NOW)
    assert verified.receipt.subject == "local-agent" and verified.key_id == signer.key_id
    assert verified.receipt_bytes == r.SerializeToString()
    assert verified.receipt.expires_at == datetime.fromtimestamp(NOW + 600, tz=timezone.utc)
    # Also with the generated KeySet message and a plain list of keys.
    pb_set = tollgate.v1.authority_pb2.KeySet(keys=[tollgate.v1.authority_pb2.PublicKey(key_id=signer.key_id, public_key=signer.public)])
    verify_receipt(text, pb_set, now=datetime.now(timezone.utc))
    verify_receipt(text, list(signer.key_set.keys))


@test(OFFLINE)
def test_window_audience_and_revocation() -> None:
    signer = LocalSigner()
    r = signer.receipt(NOW)
    text = signer.text(r)
    expect_rejected("expired", text, signer.key_set, now=NOW + 600, clock_skew=0)
    verify_receipt(text, signer.key_set, now=NOW + 629)  # within the default 30 s skew
    expect_rejected("expired", text, signer.key_set, now=NOW + 630)
    expect_rejected("not_yet_valid", text, signer.key_set, now=NOW - 1, clock_skew=0)
    expect_rejected("not_yet_valid", text, signer.key_set, now=NOW - 31)
    expect_rejected("wrong_audience", text, signer.key_set, audience="laptop", now=NOW)
    expect_rejected("revoked", text, signer.key_set, now=NOW, revoked={r.receipt_id})


@test(OFFLINE)
def test_tampering_and_wrong_keys_are_refused() -> None:
    signer = LocalSigner()
    receipt_bytes = signer.receipt(NOW).SerializeToString()
    good_sig = signer.private.sign(tollgate.receipt.DOMAIN + receipt_bytes)
    for i in sorted({0, len(receipt_bytes) // 2, len(receipt_bytes) - 1}):
        tampered = signer.envelope(flip(receipt_bytes, i), signature=good_sig)
        expect_rejected("bad_signature", encode_text(tampered), signer.key_set, now=NOW)
    for i in (0, 31, 32, 63):
        tampered = signer.envelope(receipt_bytes, signature=flip(good_sig, i))
        expect_rejected("bad_signature", encode_text(tampered), signer.key_set, now=NOW)
    # Signed without the domain prefix: not a receipt signature.
    raw = signer.envelope(receipt_bytes, signature=signer.private.sign(receipt_bytes))
    expect_rejected("bad_signature", encode_text(raw), signer.key_set, now=NOW)
    expect_rejected("unknown_key", encode_text(signer.envelope(receipt_bytes, key_id="0" * 16)), signer.key_set)
    other = LocalSigner()
    expect_rejected("bad_signature", encode_text(other.envelope(receipt_bytes, key_id=signer.key_id)), signer.key_set, now=NOW)
    lying = tollgate.KeySet("x", (tollgate.PublicKey(signer.key_id, other.public),))
    expect_rejected("bad_key", encode_text(signer.envelope(receipt_bytes)), lying, now=NOW)


@test(OFFLINE)
def test_structure_checks() -> None:
    signer = LocalSigner()

    def text_of(**overrides: object) -> str:
        return signer.text(signer.receipt(NOW, **overrides))

    expect_rejected("malformed", text_of(key_id="ffffffffffffffff"), signer.key_set, now=NOW)
    expect_rejected("malformed", text_of(receipt_id="not-a-uuid"), signer.key_set, now=NOW)
    expect_rejected("malformed", text_of(receipt_id=str(uuid.uuid4()).upper()), signer.key_set, now=NOW)
    expect_rejected("malformed", text_of(expires_at=None), signer.key_set, now=NOW)
    expect_rejected("malformed", text_of(audience=[]), signer.key_set, now=NOW)
    # A valid envelope with an unknown field appended is not canonical: refused.
    envelope = signer.envelope(signer.receipt(NOW).SerializeToString()) + b"\x20\x01"
    expect_rejected("malformed", encode_text(envelope), signer.key_set, now=NOW)
    expect_rejected("malformed", encode_text(b"\xff\xff\xff"), signer.key_set, now=NOW)


@test(OFFLINE)
def test_ed25519_is_strict() -> None:
    signer = LocalSigner()
    message = b"tollgate"
    sig = signer.private.sign(message)
    assert ed25519_verify_strict(signer.public, message, sig)
    # S + L is the same scalar, not canonical: refused.
    l_order = 2**252 + 27742317777372353535851937790883648493
    s = int.from_bytes(sig[32:], "little") + l_order
    if s < 2**256:
        assert not ed25519_verify_strict(signer.public, message, sig[:32] + s.to_bytes(32, "little"))
    # The weak-key forgery: identity public key, R = identity, S = 0 "verifies" any message
    # under a non-strict verifier. Strict verification refuses it.
    identity = (1).to_bytes(32, "little")
    forged = identity + bytes(32)
    assert not ed25519_verify_strict(identity, message, forged)
    # An order-2 key (y = -1) and a non-canonical y (>= p) are refused as well.
    p = 2**255 - 19
    assert not ed25519_verify_strict((p - 1).to_bytes(32, "little"), message, forged)
    assert not ed25519_verify_strict((p + 1).to_bytes(32, "little"), message, sig)
    # As a receipt: a key set trusting the identity key still refuses the forgery.
    receipt_bytes = signer.receipt(NOW).SerializeToString()
    weak_id = key_id_of(identity)
    weak = receipt_pb2.Receipt.FromString(receipt_bytes)
    weak.key_id = weak_id
    envelope = receipt_pb2.SignedReceipt(receipt=weak.SerializeToString(), key_id=weak_id, signature=forged)
    weak_set = tollgate.KeySet("weak", (tollgate.PublicKey(weak_id, identity),))
    expect_rejected("bad_signature", encode_text(envelope.SerializeToString()), weak_set, now=NOW)


# ---------------------------------------------------------------------------------------------
# Against a live authority.
# ---------------------------------------------------------------------------------------------


def authority() -> Authority:
    assert CTX.authority is not None
    return CTX.authority


@test(AUTHORITY)
def test_key_set_follows_the_key_id_rule_and_is_public() -> None:
    keys = CTX.anonymous.key_set()  # type: ignore[union-attr]
    assert keys.keys, "no keys"
    assert sum(1 for k in keys.keys if k.active) == 1, keys
    for k in keys.keys:
        assert len(k.public_key) == 32 and k.key_id == hashlib.sha256(k.public_key).hexdigest()[:16], k
    assert keys.issuer


@test(AUTHORITY)
def test_mint_returns_decoded_fields_that_verify() -> None:
    minted = authority().mint(
        "py-client",
        audience=["workstation", "laptop"],
        ttl="5m",
        argv=["/bin/sh", "-c", "echo hi"],
        env={"MODE": "test"},
        exec=["/bin/sh", "/usr/bin/wc"],
        fs=[FsGrant.read("/srv/data"), ("/srv/out", "write", "/out")],
        routes=[("local", "high")],
        limits={"memory_bytes": "128MiB", "pids": 16, "egress_bytes": "64MiB"},
        egress=["pypi.org", tollgate.EgressGrant("api.example.com", ports=(8443,), methods=("GET",))],
    )
    r = minted.receipt
    assert minted.text.startswith("tgr1.") and minted.receipt_id == r.receipt_id
    assert str(uuid.UUID(minted.receipt_id)) == minted.receipt_id
    assert r.subject == "py-client" and r.audience == ("workstation", "laptop")
    assert r.exec == ("/bin/sh", "/usr/bin/wc")
    assert r.agent is not None and r.agent.argv == ("/bin/sh", "-c", "echo hi") and r.agent.env == {"MODE": "test"}
    assert r.fs == (FsGrant("/srv/data", "read"), FsGrant("/srv/out", "write", "/out")), r.fs  # type: ignore[arg-type]
    assert r.routes == (tollgate.RouteGrant("local", "high"),), r.routes  # type: ignore[arg-type]
    assert r.limits is not None and r.limits.memory_bytes == 128 << 20 and r.limits.pids == 16
    assert r.limits.output_bytes > 0, "unset limits take the authority's defaults"
    assert r.limits.egress_bytes == 64 << 20 and r.limits.egress_connections == 16
    assert r.egress[0] == tollgate.EgressGrant("pypi.org", (443,)), r.egress
    assert r.egress[1].ports == (8443,) and r.egress[1].methods == ("GET",) and r.egress[1].inspect
    assert r.owner and r.issuer and r.key_id == minted.key_id and r.depth == 0
    assert r.expires_at is not None and r.not_before is not None
    assert abs((r.expires_at - r.not_before).total_seconds() - 300) <= 1, (r.not_before, r.expires_at)
    keys = authority().key_set()
    verified = verify_receipt(minted.text, keys, audience="workstation")
    assert verified.receipt == r and verified.receipt_bytes == minted.receipt_bytes
    assert r.issuer == keys.issuer
    stored = authority().get_receipt(minted.receipt_id)
    assert stored.minted.text == minted.text and stored.revocation is None


@test(AUTHORITY)
def test_daemon_receipt_tampered_fails_verify_receipt() -> None:
    minted = authority().mint("py-tamper", audience="workstation", ttl=120, exec=["/bin/sh"])
    keys = authority().key_set()
    verify_receipt(minted.text, keys)
    for i in sorted({0, len(minted.receipt_bytes) // 2, len(minted.receipt_bytes) - 1}):
        envelope = receipt_pb2.SignedReceipt(
            receipt=flip(minted.receipt_bytes, i), key_id=minted.key_id, signature=minted.signature
        )
        expect_rejected("bad_signature", encode_text(envelope.SerializeToString()), keys)
    envelope = receipt_pb2.SignedReceipt(
        receipt=minted.receipt_bytes, key_id=minted.key_id, signature=flip(minted.signature, 10)
    )
    expect_rejected("bad_signature", encode_text(envelope.SerializeToString()), keys)
    # One character of the text changed: the envelope no longer parses, or no longer verifies.
    mid = len(minted.text) // 2
    changed = minted.text[:mid] + ("A" if minted.text[mid] != "A" else "B") + minted.text[mid + 1:]
    try:
        verify_receipt(changed, keys)
    except ReceiptError as e:
        assert e.kind in ("malformed", "bad_signature", "unknown_key"), e
    else:
        raise AssertionError("a receipt with a changed character verified")
    expect_rejected("wrong_audience", minted.text, keys, audience="laptop")
    expect_rejected("expired", minted.text, keys, now=time.time() + 3600)


@test(AUTHORITY)
def test_mint_refused_permission_denied() -> None:
    # Above the bootstrap admin's ceiling (7 days by default).
    e = expect_error(
        grpc.StatusCode.PERMISSION_DENIED,
        lambda: authority().mint("py-long", audience="workstation", ttl="30d"),
        "ttl_seconds",
    )
    assert e.method == "MintReceipt"
    # An operator with a narrow ceiling: each grant above it is named.
    name = f"py-op-{uuid.uuid4().hex[:8]}"
    token = authority().add_operator(
        name,
        Ceiling(max_ttl="1h", fs=(FsGrant.read("/srv/data"),), exec=("/bin/",), audience=("workstation",)),
    )
    with Authority(authority().target, token, **CTX.tls) as narrow:
        minted = narrow.mint("in-scope", audience="workstation", ttl="10m", exec=["/bin/sh"], fs=[FsGrant.read("/srv/data/a")])
        assert minted.receipt.owner == name
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.mint("x", audience="workstation", fs=[FsGrant.write("/srv/data")]),
            "fs[0]",
            "/srv/data",
        )
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.mint("x", audience="workstation", fs=[FsGrant.read("/etc")]),
            "fs[0]",
        )
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.mint("x", audience="workstation", exec=["/bin/sh", "/usr/bin/curl"]),
            "exec[1]",
        )
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.mint("x", audience="laptop"),
            "audience[0]",
        )
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.mint("x", audience="workstation", ttl="2h"),
            "ttl_seconds",
        )
        # Not an admin: may not add operators.
        expect_error(
            grpc.StatusCode.PERMISSION_DENIED,
            lambda: narrow.add_operator(name + "-2", Ceiling(max_ttl="1h")),
        )


@test(AUTHORITY)
def test_mint_refused_invalid_argument() -> None:
    a = authority()
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: a.mint("", audience="workstation"), "subject")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: a.mint("x", audience=[]), "audience")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: a.mint("x", audience="workstation", ttl="400d"), "ttl_seconds")
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: a.mint("x", audience="workstation", exec=["bin/sh"]), "exec[0]"
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: a.mint("x", audience="workstation", argv=["/bin/sh"], exec=["/usr/bin/wc"]),
        "agent.argv[0]",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: a.mint("x", audience="workstation", fs=[FsGrant.read("/srv/../etc")]),
        "fs[0]",
    )


@test(AUTHORITY)
def test_calls_without_a_valid_token_are_unauthenticated() -> None:
    expect_error(grpc.StatusCode.UNAUTHENTICATED, lambda: CTX.anonymous.mint("x", audience="workstation"))  # type: ignore[union-attr]
    with Authority(authority().target, "not-a-token", **CTX.tls) as wrong:
        expect_error(grpc.StatusCode.UNAUTHENTICATED, lambda: wrong.mint("x", audience="workstation"))


@test(AUTHORITY)
def test_revoke_is_idempotent_and_recorded() -> None:
    minted = authority().mint("py-revoke", audience="workstation", ttl=120)
    first = authority().revoke(minted.receipt_id, "client test")
    assert not first.already_revoked and first.seq > 0 and first.reason == "client test", first
    assert first.receipt_id == minted.receipt_id and first.revoked_by
    again = authority().revoke(minted.receipt_id, "twice")
    assert again.already_revoked and again.seq == first.seq and again.reason == "client test", again
    stored = authority().get_receipt(minted.receipt_id)
    assert stored.revocation is not None and stored.revocation.seq == first.seq
    expect_rejected("revoked", minted.text, authority().key_set(), revoked={minted.receipt_id})
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: authority().revoke(str(uuid.uuid4())))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: authority().get_receipt(str(uuid.uuid4())))


# ---------------------------------------------------------------------------------------------
# Against a live supervisor (root).
# ---------------------------------------------------------------------------------------------


def supervisor() -> Supervisor:
    assert CTX.supervisor is not None
    return CTX.supervisor


def mint_script(script: str, ttl: int = 120, **kwargs: object) -> tollgate.MintedReceipt:
    kwargs.setdefault("exec", ["/bin/sh", "/usr/bin/sleep"])
    kwargs.setdefault("limits", {"memory_bytes": "64MiB", "pids": 16})
    return authority().mint(
        "py-run", audience=CTX.supervisor_id, ttl=ttl, argv=["/bin/sh", "-c", script], **kwargs  # type: ignore[arg-type]
    )


def collect(run_id: str) -> Tuple[str, str, Run]:
    out: List[bytes] = []
    err: List[bytes] = []
    final: Optional[Run] = None
    for event in supervisor().watch(run_id, timeout=60):
        if isinstance(event, OutputChunk):
            (err if event.stream == "stderr" else out).append(event.data)
        else:
            assert final is None, "two final events"
            final = event
    assert final is not None, "the watch ended without the run"
    return b"".join(out).decode(), b"".join(err).decode(), final


@test(SUPERVISOR)
def test_supervisor_info_trusts_the_authoritys_key() -> None:
    info = supervisor().info()
    assert info.supervisor_id == CTX.supervisor_id
    active = [k.key_id for k in authority().key_set().keys if k.active]
    assert set(active) <= set(info.trusted_key_ids), (active, info.trusted_key_ids)


@test(SUPERVISOR)
def test_start_watch_get_list() -> None:
    minted = mint_script("echo out-line; echo err-line >&2; exit 3")
    run_id = supervisor().start(minted.text)
    assert run_id == minted.receipt_id
    out, err, final = collect(run_id)
    assert out == "out-line\n" and err == "err-line\n", (out, err)
    assert final.state == RunState.EXITED and final.exit_code == 3 and final.ended, final
    assert final.report is not None and final.report.cleanup_errors == (), final.report
    assert final.created_at and final.ended_at and final.ended_at >= final.created_at
    got = supervisor().get(run_id)
    assert got.state == RunState.EXITED and got.exit_code == 3 and got.subject == "py-run"
    assert run_id in [r.run_id for r in supervisor().list()]
    # Watching an ended run replays its output, then the final run.
    out2, _, again = collect(run_id)
    assert out2 == out and again.state == RunState.EXITED
    # The same receipt twice: single use.
    expect_error(grpc.StatusCode.ALREADY_EXISTS, lambda: supervisor().start(minted.text))


@test(SUPERVISOR)
def test_unpinned_receipt_takes_argv_within_exec() -> None:
    minted = authority().mint("py-argv", audience=CTX.supervisor_id, ttl=120, exec=["/bin/sh"])
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: supervisor().start(minted.text, ["/usr/bin/id"]),
        "argv",
    )
    minted = authority().mint("py-argv", audience=CTX.supervisor_id, ttl=120, exec=["/bin/sh"])
    final = supervisor().run(minted.text, ["/bin/sh", "-c", "echo argv-ok"], timeout=60)
    assert final.state == RunState.EXITED and final.exit_code == 0, final


@test(SUPERVISOR)
def test_stop_tears_down_a_live_run() -> None:
    minted = mint_script("echo started; exec /usr/bin/sleep 60", workspace_keep="10m")
    run_id = supervisor().start(minted.text)
    events = supervisor().watch(run_id, timeout=60)
    first = next(events)
    assert isinstance(first, OutputChunk) and first.text == "started\n", first
    stopped = supervisor().stop(run_id, "client test stop")
    assert stopped.state == RunState.STOPPED and stopped.report is not None, stopped
    assert "client test stop" in stopped.report.reason, stopped.report
    # Its /work is kept (a stop is no exception), and the run says where and until when.
    assert stopped.workspace_keep_seconds == 600, stopped
    assert stopped.report.workspace and stopped.report.workspace_kept_until, stopped.report
    kept_for = stopped.report.workspace_kept_until - datetime.now(timezone.utc)
    assert timedelta(minutes=9) < kept_for <= timedelta(minutes=10), kept_for
    rest = list(events)
    assert rest and isinstance(rest[-1], Run) and rest[-1].state == RunState.STOPPED, rest
    # Stopping it again returns it as it ended.
    assert supervisor().stop(run_id).state == RunState.STOPPED


@test(SUPERVISOR)
def test_approvals_are_watched_and_decided_and_live_runs_amended() -> None:
    workdir = tempfile.mkdtemp(prefix="tollgate-py-approvals-")
    try:
        approvals_and_amendments_in(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def approvals_and_amendments_in(workdir: str) -> None:
    os.chmod(workdir, 0o755)
    script = (
        f"printf hi | tollgate-shim tool write {workdir}/x.txt --create; echo write rc=$?; "
        "tollgate-shim tool exec -- /usr/bin/id -u 2>&1; echo exec rc=$?"
    )
    minted = mint_script(
        script,
        fs=[FsGrant.write(workdir, ask=True)],
        exec_ask=["/usr/bin/id"],
        approval_timeout="1m",
    )
    assert minted.receipt.approval_timeout_seconds == 60, minted.receipt
    run_id = supervisor().start(minted.text)
    asked: List[PendingCall] = []
    decided: List[DecidedCall] = []
    for event in supervisor().approvals(run_id, timeout=60):
        if isinstance(event, PendingCall):
            asked.append(event)
            if event.tool == "fs.write":
                supervisor().approve(run_id, event.call_id)
            else:
                supervisor().deny(run_id, event.call_id, "not this command")
        elif isinstance(event, DecidedCall):
            decided.append(event)
            if len(decided) == 2:
                break
    assert [(c.tool, c.path) for c in asked] == [
        ("fs.write", f"{workdir}/x.txt"),
        ("exec", "/usr/bin/id"),
    ], asked
    assert asked[1].argv == ("/usr/bin/id", "-u") and asked[0].bytes == 2, asked
    assert [d.outcome for d in decided] == ["approved", "denied"], decided
    out, _, final = collect(run_id)
    assert "write rc=0" in out and "not this command" in out and "exec rc=1" in out, out
    assert final.state == RunState.EXITED, final
    with open(os.path.join(workdir, "x.txt")) as f:
        assert f.read() == "hi"
    expect_error(
        grpc.StatusCode.NOT_FOUND, lambda: supervisor().approve(run_id, asked[0].call_id)
    )

    # A live run: narrowed without a signature, widened with one.
    a, b = (os.path.join(workdir, name) for name in ("a", "b"))
    for path in (a, b):
        os.mkdir(path)
    minted = mint_script("echo started; exec /usr/bin/sleep 60", fs=[FsGrant.read(a)])
    run_id = supervisor().start(minted.text)
    narrowed = supervisor().narrow(run_id, drop_fs=[a], tool_calls=50, egress_bytes="1MiB")
    assert narrowed.fs == () and narrowed.tool_calls == 50, narrowed
    assert narrowed.egress_bytes == 1 << 20, narrowed
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, lambda: supervisor().narrow(run_id, tool_calls=500))
    amendment = authority().amend(run_id, add_fs=[FsGrant.read(b)], extend="1m", gateway_exec=["/usr/bin/id"])
    assert amendment.receipt_id == run_id and amendment.add_fs[0].path == b, amendment
    assert amendment.gateway_exec == ("/usr/bin/id",), amendment
    widened = supervisor().amend(run_id, amendment)
    assert [g.path for g in widened.fs] == [b], widened
    assert widened.gateway_exec == ("/usr/bin/id",), widened
    assert widened.expires_at is not None and narrowed.expires_at is not None
    assert widened.expires_at - narrowed.expires_at == timedelta(minutes=1), widened
    assert supervisor().narrow(run_id, drop_exec=["/usr/bin/id"]).gateway_exec == ()
    supervisor().stop(run_id)


@test(SUPERVISOR)
def test_tree_shows_a_delegated_child_that_ends_with_its_parent() -> None:
    child_spec = (
        '{"subject": "py-child", "exec": ["/usr/bin/sleep"], "agent": {"argv": ["/usr/bin/sleep", "60"]}}'
    )
    script = (
        f"echo '{child_spec}' | tollgate-shim child delegate > /tmp/id || exit 11; "
        "read id < /tmp/id; tollgate-shim child start $id > /dev/null || exit 12; "
        "echo started; exec /usr/bin/sleep 60"
    )
    minted = mint_script(script, delegate_depth=1, limits={"memory_bytes": "256MiB", "pids": 32, "tool_calls": 20})
    run_id = supervisor().start(minted.text)
    # The parent says "started" on stdout once its child runs (the shim notes the delegation
    # on stderr).
    for event in supervisor().watch(run_id, timeout=60):
        assert isinstance(event, OutputChunk), event
        if event.stream == "stdout":
            assert event.text == "started\n", event
            break
    tree = supervisor().tree(run_id)
    assert [r.depth for r in tree.runs] == [0, 1], tree
    child = tree.runs[1]
    assert child.parent_run_id == run_id and child.subject == "py-child", child
    assert child.state == RunState.RUNNING and not child.ended, child
    supervisor().stop(run_id, "py tree stop")
    deadline = time.monotonic() + 10
    while not supervisor().get(child.run_id).ended:
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.02)
    ended = supervisor().get(child.run_id)
    assert ended.state == RunState.PARENT_ENDED and ended.ended, ended
    assert ended.report is not None and run_id in ended.report.reason, ended.report
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: supervisor().tree(str(uuid.uuid4())))


@test(SUPERVISOR)
def test_refused_receipts_raise_tollgate_error() -> None:
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: supervisor().start("tgr1.garbage"))
    minted = mint_script("exit 0")
    envelope = receipt_pb2.SignedReceipt(
        receipt=flip(minted.receipt_bytes, len(minted.receipt_bytes) // 2),
        key_id=minted.key_id,
        signature=minted.signature,
    )
    expect_error(
        grpc.StatusCode.PERMISSION_DENIED,
        lambda: supervisor().start(encode_text(envelope.SerializeToString())),
        "bad_signature",
    )
    elsewhere = authority().mint("py-elsewhere", audience="laptop", ttl=60, argv=["/bin/sh"], exec=["/bin/sh"])
    expect_error(grpc.StatusCode.PERMISSION_DENIED, lambda: supervisor().start(elsewhere.text), "wrong_audience")
    with Supervisor(supervisor().target, **CTX.tls) as anonymous:
        expect_error(grpc.StatusCode.UNAUTHENTICATED, lambda: anonymous.start(minted.text))
        assert anonymous.info().supervisor_id == CTX.supervisor_id  # public
    # The untampered receipt still starts (the refusals above did not spend it).
    final = supervisor().run(minted.text, timeout=60)
    assert final.state == RunState.EXITED and final.exit_code == 0


@test(SUPERVISOR)
def test_revoked_receipt_is_refused_once_the_supervisor_knows() -> None:
    minted = mint_script("exit 0")
    seq = authority().revoke(minted.receipt_id, "py revoke before start").seq
    deadline = time.monotonic() + 15
    while supervisor().info().last_revocation_seq < seq:
        assert time.monotonic() < deadline, "the revocation never reached the supervisor"
        time.sleep(0.05)
    expect_error(grpc.StatusCode.PERMISSION_DENIED, lambda: supervisor().start(minted.text), "revoked")


@test(SUPERVISOR)
def test_unknown_runs_are_not_found() -> None:
    unknown = str(uuid.uuid4())
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: supervisor().get(unknown))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: list(supervisor().watch(unknown, timeout=10)))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: supervisor().stop(unknown))


# ---------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--authority", help="authority address (host:port or authority.addr)")
    p.add_argument("--authority-token-file", help="an admin token of that authority")
    p.add_argument("--supervisor", help="supervisor address (host:port or supervisor.addr)")
    p.add_argument("--supervisor-token-file", help="the supervisor's admin token")
    p.add_argument("--ca", help="TLS: the CA the daemons' certificates chain to (PEM)")
    p.add_argument("--cert", help="TLS: this client's certificate (PEM), with --key")
    p.add_argument("--key", help="TLS: the key of --cert (PEM)")
    p.add_argument("-k", dest="only", help="run only tests whose name contains this")
    args = p.parse_args(argv)
    tls = {"ca_file": args.ca, "cert_file": args.cert, "key_file": args.key}
    CTX.tls = tls
    if args.supervisor and not args.authority:
        p.error("--supervisor needs --authority (its receipts come from there)")

    tests = list(OFFLINE)
    if args.authority:
        CTX.authority = Authority(args.authority, token_file=args.authority_token_file, **tls)
        CTX.anonymous = Authority(args.authority, **tls)
        tests += AUTHORITY
    if args.supervisor:
        CTX.supervisor = Supervisor(args.supervisor, token_file=args.supervisor_token_file, **tls)
        CTX.supervisor_id = CTX.supervisor.info().supervisor_id
        tests += SUPERVISOR
    if args.only:
        tests = [t for t in tests if args.only in t[0]]

    print(f"tollgate {tollgate.__version__} from {os.path.dirname(tollgate.__file__)}", flush=True)
    passed = failed = 0
    for name, fn in tests:
        started = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a test runner reports everything
            failed += 1
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {detail} (line {where.lineno})", flush=True)
        else:
            passed += 1
            print(f"ok {name} ({time.monotonic() - started:.2f} s)", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
