#!/usr/bin/env python3
"""A small Tollgate agent: every gateway tool, called over gRPC from inside a sandbox.

The gateway (proto/tollgate/v1/gateway.proto) is the sandbox's only way out. Generate the
Python stubs once, outside the sandbox, from the repository root (grpcio-tools adds the
google/protobuf well-known protos itself):

    python -m grpc_tools.protoc -I proto --python_out=OUT --grpc_python_out=OUT proto/tollgate/v1/*.proto

then run this script with OUT on its module path:

    TOLLGATE_STUBS=OUT python3 gateway_agent.py DIR [--outside PATH] [--size N] [--exec ARGV...]

DIR is a HOST path beneath a write grant of the run's receipt (not the grant's mount point
inside the sandbox). The script connects to $TOLLGATE_GATEWAY (default
unix:/run/tollgate/gateway.sock) and, in DIR, writes a new file (mode CREATE), reads it back
in chunks, lists DIR, stats the file, reads PATH (default /etc/passwd, outside every grant)
to show a refusal, deletes the file, then, with --exec, runs ARGV in the sandbox.

Output: one line per step, `STEP RESULT key=value...`; a `details=` field, when present, is
last and runs to the end of the line:

    write ok size=N existed=false call=UUID
    read ok bytes=N calls=K same=true call=UUID
    list ok entries=N found=true kind=FILE size=N call=UUID
    stat ok kind=FILE size=N mode=644 call=UUID
    refused PERMISSION_DENIED call=UUID details=receipt ...: no fs grant covers /etc/passwd
    delete ok kind=FILE size=N call=UUID
    exec ok exit_code=0 signal=none timed_out=false call=UUID stdout_bytes=N stdout=b'...'
    done

A step that fails prints `STEP failed CODE call=UUID details=...` and the script exits 1.
Exit status: 0 when every step did what it should; 1 otherwise; 2 usage.
"""

import argparse
import os
import sys

# Every call gets a deadline: a gateway that stops answering must not hang the agent.
RPC_TIMEOUT_S = 30.0
# The gateway returns at most 1 MiB per fs.read and up to 5 MiB of exec output; gRPC's
# default 4 MiB receive limit would reject a large exec response, so raise it.
MAX_RECEIVE = 16 << 20
FILE_NAME = "gateway-agent.txt"


def parse_args(argv):
    p = argparse.ArgumentParser(description="Call every Tollgate gateway tool once.")
    p.add_argument("dir", help="host directory beneath a write grant of the receipt")
    p.add_argument(
        "--stubs",
        default=os.environ.get("TOLLGATE_STUBS"),
        help="directory of the generated stubs (default: $TOLLGATE_STUBS)",
    )
    p.add_argument("--outside", default="/etc/passwd", help="a path no grant covers")
    p.add_argument("--size", type=int, default=(1 << 20) + 4096, help="bytes to write")
    p.add_argument("--chunk", type=int, default=1 << 20, help="bytes per fs.read call")
    # Everything after --exec is the command (argv[0] must be in the receipt's exec list).
    p.add_argument("--exec", nargs=argparse.REMAINDER, metavar="ARGV", dest="exec_argv")
    return p.parse_args(argv)


def content(size):
    """Deterministic bytes whose lines carry their own number, so a misplaced chunk shows."""
    out = bytearray()
    line = 0
    while len(out) < size:
        out += b"%08d tollgate-agent-canary\n" % line
        line += 1
    return bytes(out[:size])


def call_id(err):
    """The call id of a refusal: the gateway puts it in the trailing metadata."""
    for key, value in err.trailing_metadata() or ():
        if key == "tollgate-call-id":
            return value
    return "none"


def failed(step, err):
    print(f"{step} failed {err.code().name} call={call_id(err)} details={err.details()}")
    return 1


def main(argv):
    args = parse_args(argv)
    if args.stubs:
        sys.path.insert(0, args.stubs)
    # Imported only now, from the stub directory: nothing is generated at run time.
    import grpc
    from tollgate.v1 import gateway_pb2 as gw
    from tollgate.v1 import gateway_pb2_grpc as gw_grpc

    target = os.environ.get("TOLLGATE_GATEWAY", "unix:/run/tollgate/gateway.sock")
    channel = grpc.insecure_channel(
        target,
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE),
            # grpcio >= 1.57 sends a unix: target's %-encoded socket path as :authority,
            # which the gateway's HTTP/2 server (Rust h2) rejects as malformed: every call
            # would fail with INTERNAL "Received RST_STREAM with error code 1".
            ("grpc.default_authority", "localhost"),
        ],
    )
    stub = gw_grpc.GatewayStub(channel)

    def call(**tool):
        # One tool per CallToolRequest (a oneof); the response names the call's audit id.
        return stub.CallTool(gw.CallToolRequest(**tool), timeout=RPC_TIMEOUT_S)

    def kind(value):
        return gw.FileKind.Name(value).removeprefix("FILE_KIND_")

    # The gateway takes only normalised absolute paths: no trailing '/', '.' or '..'.
    args.dir = os.path.normpath(os.path.abspath(args.dir))
    path = os.path.join(args.dir, FILE_NAME)
    data = content(args.size)
    step = "write"
    try:
        # CREATE refuses (ALREADY_EXISTS) rather than replace a file someone else made.
        r = call(fs_write=gw.FsWriteRequest(path=path, data=data, mode=gw.WRITE_MODE_CREATE))
        w = r.fs_write
        print(f"write ok size={w.size} existed={str(w.existed).lower()} call={r.call_id}")

        # fs.read returns at most 1 MiB per call: read on from `offset` until `eof`.
        step = "read"
        got, offset, calls = bytearray(), 0, 0
        while True:
            r = call(fs_read=gw.FsReadRequest(path=path, offset=offset, length=args.chunk))
            calls += 1
            got += r.fs_read.data
            offset += len(r.fs_read.data)
            if r.fs_read.eof:
                break
            if not r.fs_read.data:  # never spin on a file that shrank under us
                print(f"read failed NO_PROGRESS call={r.call_id} details=empty chunk before eof")
                return 1
        same = bytes(got) == data
        print(f"read ok bytes={len(got)} calls={calls} same={str(same).lower()} call={r.call_id}")
        if not same:
            return 1

        step = "list"
        r = call(fs_list=gw.FsListRequest(path=args.dir))
        mine = [e for e in r.fs_list.entries if e.name == FILE_NAME]
        found = "found=false"
        if mine:
            found = f"found=true kind={kind(mine[0].kind)} size={mine[0].size}"
        print(f"list ok entries={len(r.fs_list.entries)} {found} call={r.call_id}")
        if not mine:
            return 1

        step = "stat"
        r = call(fs_stat=gw.FsStatRequest(path=path))
        info = r.fs_stat.info
        print(
            f"stat ok kind={kind(info.kind)} size={info.size} mode={info.mode:o} "
            f"call={r.call_id}"
        )
    except grpc.RpcError as err:
        return failed(step, err)

    # A refusal is an RpcError: PERMISSION_DENIED (NOT_FOUND for a missing file), with the
    # reason in details() and the audit entry's call id in the trailing metadata.
    try:
        r = call(fs_read=gw.FsReadRequest(path=args.outside))
        print(f"refused none call={r.call_id} details={args.outside} was readable")
        return 1
    except grpc.RpcError as err:
        print(f"refused {err.code().name} call={call_id(err)} details={err.details()}")
        if err.code() != grpc.StatusCode.PERMISSION_DENIED:
            return 1

    try:
        # The gateway snapshots the content first: `tollgate restore RUN CALL_ID` undoes it.
        step = "delete"
        r = call(fs_delete=gw.FsDeleteRequest(path=path))
        d = r.fs_delete
        print(f"delete ok kind={kind(d.kind)} size={d.size} call={r.call_id}")

        if args.exec_argv:
            # Runs inside the sandbox; argv[0] is a sandbox path listed in the receipt's exec.
            step = "exec"
            r = call(exec=gw.ExecRequest(argv=args.exec_argv, timeout_ms=10_000))
            e = r.exec
            code = e.exit_code if e.HasField("exit_code") else "none"
            sig = e.signal if e.HasField("signal") else "none"
            print(
                f"exec ok exit_code={code} signal={sig} timed_out={str(e.timed_out).lower()} "
                f"call={r.call_id} stdout_bytes={len(e.stdout)} stdout={e.stdout[:200]!r}"
            )
    except grpc.RpcError as err:
        return failed(step, err)

    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
