#!/usr/bin/env python3
"""Independent verifier of Tollgate run receipts.

Knows only the signing rule of DESIGN.md ("The receipt" / "Signing") and the public key set
served by the authority's GetKeySet; shares no code with the Rust implementation:

    signature = Ed25519(private_key, b"tollgate.receipt.v1\\n" || SignedReceipt.receipt)
    key_id    = lowercase hex of the first 8 bytes of SHA-256(32-byte public key)
    text form = "tgr1." + base64url without padding of the SignedReceipt protobuf bytes

Usage:
    python3 verify_receipt.py --addr HOST:PORT --token-file PATH --proto-root PROTO_DIR

It generates Python stubs from PROTO_DIR/tollgate/v1/*.proto at run time, fetches the key set,
mints a receipt with the operator token, verifies the receipt's text form, and runs negative
checks (tampered receipt bytes, tampered signature, unknown key id).

Exit status: 0 and one JSON line on stdout when every check passes; 1 and one line on stderr
when anything fails; 2 when a Python dependency is missing.
"""

import argparse
import base64
import binascii
import glob
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

DOMAIN = b"tollgate.receipt.v1\n"
TEXT_PREFIX = "tgr1."
SUBJECT = "python-check"
AUDIENCE = "workstation"
EXEC = "/usr/bin/python3"
TTL_SECONDS = 300
RPC_TIMEOUT_S = 15.0
INSTALL_HINT = "pip install -r tests/python/requirements.txt"


class CheckFailed(Exception):
    """A check failed; the message is the one line printed to stderr."""


class VerifyError(Exception):
    """Receipt verification rejected a receipt. `kind` names the reason."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class _Parser(argparse.ArgumentParser):
    # Usage errors exit 1, so that exit status 2 means only "a dependency is missing".
    def error(self, message):
        print(f"verify_receipt: {message}", file=sys.stderr)
        sys.exit(1)


def parse_args(argv):
    p = _Parser(description="Verify a Tollgate run receipt minted by a live authority.")
    p.add_argument("--addr", required=True, help="authority address, host:port")
    p.add_argument("--token-file", required=True, help="file holding an operator bearer token")
    p.add_argument("--proto-root", required=True, help="directory holding tollgate/v1/*.proto")
    return p.parse_args(argv)


def import_dependencies():
    """Import third-party modules; exit 2 with an install hint when one is missing."""
    mods = {}
    for name in ("grpc", "grpc_tools", "google.protobuf", "cryptography"):
        try:
            mods[name] = importlib.import_module(name)
        except ImportError as e:
            print(
                f"verify_receipt: missing Python dependency {name!r} ({e}); "
                f"run: {INSTALL_HINT}",
                file=sys.stderr,
            )
            sys.exit(2)
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as e:
        print(
            f"verify_receipt: unusable 'cryptography' package ({e}); run: {INSTALL_HINT}",
            file=sys.stderr,
        )
        sys.exit(2)
    mods["InvalidSignature"] = InvalidSignature
    mods["Ed25519PublicKey"] = Ed25519PublicKey
    # OpenSSL's Ed25519 verification is not strict (it accepts small-order keys and R): the
    # strict check (canonical S, canonical non-small-order A and R) comes from the Python
    # client, which scripts/test installs into the same environment.
    try:
        from tollgate.receipt import ed25519_verify_strict
    except ImportError as e:
        print(
            f"verify_receipt: missing the Python client ({e}); run: pip install ./clients/python",
            file=sys.stderr,
        )
        sys.exit(2)
    mods["ed25519_verify_strict"] = ed25519_verify_strict
    return mods


def well_known_protos_dir():
    """The directory of grpc_tools' bundled google/protobuf/*.proto."""
    try:
        from importlib.resources import files

        path = str(files("grpc_tools") / "_proto")
    except Exception:  # very old importlib.resources
        import grpc_tools

        path = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    if not os.path.isfile(os.path.join(path, "google", "protobuf", "timestamp.proto")):
        raise CheckFailed(f"grpc_tools has no bundled google/protobuf/timestamp.proto under {path}")
    return path


def generate_stubs(proto_root, out_dir):
    """Compile <proto_root>/tollgate/v1/*.proto into out_dir and import the modules."""
    proto_root = os.path.abspath(proto_root)
    protos = sorted(glob.glob(os.path.join(proto_root, "tollgate", "v1", "*.proto")))
    if not protos:
        raise CheckFailed(f"no .proto files under {proto_root}/tollgate/v1")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={proto_root}",
        f"--proto_path={well_known_protos_dir()}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        detail = " | ".join(l.strip() for l in (res.stderr + res.stdout).splitlines() if l.strip())
        raise CheckFailed(f"protoc failed on {proto_root}: {detail or 'exit %d' % res.returncode}")
    # Make tollgate/ and tollgate/v1/ regular packages so an unrelated "tollgate" elsewhere on
    # sys.path cannot shadow them.
    for pkg in ("tollgate", os.path.join("tollgate", "v1")):
        open(os.path.join(out_dir, pkg, "__init__.py"), "a").close()
    sys.path.insert(0, out_dir)
    importlib.invalidate_caches()
    try:
        receipt_pb2 = importlib.import_module("tollgate.v1.receipt_pb2")
        authority_pb2 = importlib.import_module("tollgate.v1.authority_pb2")
        authority_pb2_grpc = importlib.import_module("tollgate.v1.authority_pb2_grpc")
    except Exception as e:
        raise CheckFailed(f"cannot import generated stubs: {type(e).__name__}: {e}")
    return receipt_pb2, authority_pb2, authority_pb2_grpc


# ---------------------------------------------------------------------------------------------
# The verifier proper: only DESIGN.md's rule, the key set and the receipt schema.
# ---------------------------------------------------------------------------------------------


def key_id_of(public_key):
    return hashlib.sha256(public_key).digest()[:8].hex()


def decode_text(text):
    """'tgr1.' + unpadded base64url -> SignedReceipt bytes (strict alphabet, no padding)."""
    if not text.startswith(TEXT_PREFIX):
        raise VerifyError("bad_text", f"receipt text does not start with {TEXT_PREFIX!r}")
    body = text[len(TEXT_PREFIX):]
    if not body:
        raise VerifyError("bad_text", "receipt text has an empty body")
    if "=" in body:
        raise VerifyError("bad_text", "receipt text carries base64 padding")
    if len(body) % 4 == 1:
        raise VerifyError("bad_text", "receipt text has an impossible base64 length")
    padded = body + "=" * (-len(body) % 4)
    try:
        return base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise VerifyError("bad_text", f"receipt text is not base64url: {e}")


def encode_text(signed_bytes):
    return TEXT_PREFIX + base64.urlsafe_b64encode(signed_bytes).decode("ascii").rstrip("=")


def verify_text(text, keyset, pb, deps, now_ns):
    """Verify a receipt's text form against a key set. Returns (SignedReceipt, Receipt)."""
    receipt_pb2 = pb
    signed_bytes = decode_text(text)
    signed = receipt_pb2.SignedReceipt()
    try:
        signed.ParseFromString(signed_bytes)
    except Exception as e:
        raise VerifyError("bad_envelope", f"cannot parse SignedReceipt: {e}")

    matches = [k for k in keyset.keys if k.key_id == signed.key_id]
    if not matches:
        raise VerifyError("unknown_key", f"key_id {signed.key_id!r} is not in the key set")
    key = matches[0]
    if len(key.public_key) != 32:
        raise VerifyError("bad_key", f"public key {key.key_id} is {len(key.public_key)} bytes, not 32")
    if key_id_of(key.public_key) != signed.key_id:
        raise VerifyError(
            "bad_key",
            f"key_id {signed.key_id} != sha256(public_key)[:8] = {key_id_of(key.public_key)}",
        )
    if len(signed.signature) != 64:
        raise VerifyError("bad_signature", f"signature is {len(signed.signature)} bytes, not 64")
    try:
        pub = deps["Ed25519PublicKey"].from_public_bytes(key.public_key)
    except Exception as e:
        raise VerifyError("bad_key", f"public key {key.key_id} is not a valid Ed25519 key: {e}")
    # Over the exact bytes in the envelope; never re-encoded. Strict: OpenSSL alone is not.
    del pub
    if not deps["ed25519_verify_strict"](key.public_key, DOMAIN + signed.receipt, signed.signature):
        raise VerifyError("bad_signature", f"Ed25519 signature does not verify under key {key.key_id}")

    receipt = receipt_pb2.Receipt()
    try:
        receipt.ParseFromString(signed.receipt)
    except Exception as e:
        raise VerifyError("bad_receipt", f"cannot parse Receipt: {e}")
    if receipt.key_id != signed.key_id:
        raise VerifyError(
            "key_mismatch", f"receipt.key_id {receipt.key_id!r} != envelope key_id {signed.key_id!r}"
        )
    if not receipt.HasField("not_before") or not receipt.HasField("expires_at"):
        raise VerifyError("bad_receipt", "receipt lacks not_before or expires_at")
    nbf = receipt.not_before.ToNanoseconds()
    exp = receipt.expires_at.ToNanoseconds()
    if now_ns < nbf:
        raise VerifyError("not_yet_valid", f"now {now_ns} < not_before {nbf}")
    if now_ns >= exp:
        raise VerifyError("expired", f"now {now_ns} >= expires_at {exp}")
    return signed, receipt


def expect_rejection(name, want_kind, text, keyset, pb, deps, now_ns):
    try:
        verify_text(text, keyset, pb, deps, now_ns)
    except VerifyError as e:
        if e.kind != want_kind:
            raise CheckFailed(f"negative check {name}: rejected as {e.kind}, expected {want_kind} ({e})")
        return
    raise CheckFailed(f"negative check {name}: tampered receipt verified")


def flip_byte(data, index):
    b = bytearray(data)
    b[index] ^= 0x01
    return bytes(b)


# ---------------------------------------------------------------------------------------------


def run(args, deps):
    grpc = deps["grpc"]
    try:
        with open(args.token_file, "r", encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise CheckFailed(f"cannot read token file {args.token_file}: {e}")
    if not token:
        raise CheckFailed(f"token file {args.token_file} is empty")

    with tempfile.TemporaryDirectory(prefix="tollgate-pystubs-") as out_dir:
        receipt_pb2, authority_pb2, authority_pb2_grpc = generate_stubs(args.proto_root, out_dir)
        checks = []

        with grpc.insecure_channel(args.addr) as channel:
            stub = authority_pb2_grpc.AuthorityStub(channel)
            try:
                keyset = stub.GetKeySet(authority_pb2.GetKeySetRequest(), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as e:
                raise CheckFailed(f"GetKeySet on {args.addr} failed: {e.code().name}: {e.details()}")
            req = authority_pb2.MintReceiptRequest(
                subject=SUBJECT, ttl_seconds=TTL_SECONDS, audience=[AUDIENCE], exec=[EXEC]
            )
            try:
                resp = stub.MintReceipt(
                    req,
                    metadata=[("authorization", f"Bearer {token}")],
                    timeout=RPC_TIMEOUT_S,
                )
            except grpc.RpcError as e:
                raise CheckFailed(f"MintReceipt on {args.addr} failed: {e.code().name}: {e.details()}")

        # The key set itself must follow the key_id rule.
        if not keyset.keys:
            raise CheckFailed("GetKeySet returned no keys")
        for k in keyset.keys:
            if len(k.public_key) != 32:
                raise CheckFailed(f"key set: key {k.key_id!r} is {len(k.public_key)} bytes, not 32")
            if k.key_id != key_id_of(k.public_key):
                raise CheckFailed(
                    f"key set: key_id {k.key_id!r} != sha256(public_key)[:8] {key_id_of(k.public_key)}"
                )
        checks.append("keyset_key_ids")

        now_ns = time.time_ns()
        try:
            signed, receipt = verify_text(resp.text, keyset, receipt_pb2, deps, now_ns)
        except VerifyError as e:
            raise CheckFailed(f"minted receipt does not verify: {e}")
        checks += ["text_decodes", "key_known", "key_id_rule", "signature", "receipt_key_id", "validity_window"]

        if receipt.subject != SUBJECT:
            raise CheckFailed(f"receipt subject {receipt.subject!r} != {SUBJECT!r}")
        checks.append("subject")
        if AUDIENCE not in receipt.audience:
            raise CheckFailed(f"receipt audience {list(receipt.audience)} lacks {AUDIENCE!r}")
        checks.append("audience")
        if EXEC not in receipt.exec:
            raise CheckFailed(f"receipt exec {list(receipt.exec)} lacks {EXEC!r}")
        checks.append("exec")
        if keyset.issuer and receipt.issuer != keyset.issuer:
            raise CheckFailed(f"receipt issuer {receipt.issuer!r} != key set issuer {keyset.issuer!r}")
        checks.append("issuer")

        # The response's other fields must describe the same receipt as its text form.
        if (
            resp.signed.receipt != signed.receipt
            or resp.signed.key_id != signed.key_id
            or resp.signed.signature != signed.signature
        ):
            raise CheckFailed("MintReceiptResponse.signed differs from the envelope in .text")
        if resp.receipt != receipt:
            raise CheckFailed("MintReceiptResponse.receipt differs from the signed receipt bytes")
        checks.append("response_consistent")

        # Negative checks. The envelope is re-encoded (it is not signed); the receipt bytes are
        # carried exactly as given, with one byte flipped.
        def envelope_text(receipt_bytes, key_id, signature):
            env = receipt_pb2.SignedReceipt(receipt=receipt_bytes, key_id=key_id, signature=signature)
            return encode_text(env.SerializeToString())

        # Round trip of the untouched envelope must still verify (guards the negative checks).
        try:
            verify_text(envelope_text(signed.receipt, signed.key_id, signed.signature), keyset,
                        receipt_pb2, deps, now_ns)
        except VerifyError as e:
            raise CheckFailed(f"re-wrapped untouched envelope does not verify: {e}")

        for i in sorted({0, len(signed.receipt) // 2, len(signed.receipt) - 1}):
            expect_rejection(
                f"receipt_byte_{i}", "bad_signature",
                envelope_text(flip_byte(signed.receipt, i), signed.key_id, signed.signature),
                keyset, receipt_pb2, deps, now_ns,
            )
        checks.append("reject_tampered_receipt")

        for i in (0, 63):
            expect_rejection(
                f"signature_byte_{i}", "bad_signature",
                envelope_text(signed.receipt, signed.key_id, flip_byte(signed.signature, i)),
                keyset, receipt_pb2, deps, now_ns,
            )
        checks.append("reject_tampered_signature")

        known = {k.key_id for k in keyset.keys}
        unknown = "0" * 16
        while unknown in known:
            unknown = hashlib.sha256(unknown.encode()).hexdigest()[:16]
        expect_rejection(
            "unknown_key_id", "unknown_key",
            envelope_text(signed.receipt, unknown, signed.signature),
            keyset, receipt_pb2, deps, now_ns,
        )
        checks.append("reject_unknown_key")

        # A text form with padding or a wrong prefix is not a receipt.
        expect_rejection("padded_text", "bad_text", resp.text + "=",
                         keyset, receipt_pb2, deps, now_ns)
        expect_rejection("wrong_prefix", "bad_text", "tgr2." + resp.text[5:],
                         keyset, receipt_pb2, deps, now_ns)
        checks.append("reject_bad_text")

        # Validity window is enforced.
        expect_rejection("after_expiry", "expired", resp.text, keyset, receipt_pb2, deps,
                         receipt.expires_at.ToNanoseconds())
        expect_rejection("before_not_before", "not_yet_valid", resp.text, keyset, receipt_pb2,
                         deps, receipt.not_before.ToNanoseconds() - 1)
        checks.append("reject_outside_window")

        return {
            "ok": True,
            "receipt_id": receipt.receipt_id,
            "key_id": signed.key_id,
            "issuer": receipt.issuer,
            "keys_in_set": len(keyset.keys),
            "checks": checks,
        }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    deps = import_dependencies()
    try:
        summary = run(args, deps)
    except CheckFailed as e:
        print(f"verify_receipt: FAIL: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # anything unexpected is a failure, still on one line
        msg = " ".join(str(e).split())
        print(f"verify_receipt: FAIL: unexpected {type(e).__name__}: {msg}", file=sys.stderr)
        return 1
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
