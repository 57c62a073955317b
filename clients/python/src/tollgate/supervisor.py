"""Client of the supervisor daemon (``tollgate.v1.Supervisor``)."""

from __future__ import annotations

from datetime import datetime
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Union

import grpc

from ._channel import DEFAULT_TIMEOUT, PathLike, _Client
from ._pb import supervisor_pb2, supervisor_pb2_grpc
from .errors import TollgateError
from .types import (
    Amendment,
    DecidedCall,
    OutputChunk,
    PendingCall,
    Run,
    RunEnvelope,
    RunTree,
    SupervisorInfo,
    _timestamp,
    parse_size,
    strings,
)

__all__ = ["Supervisor", "RunEvent", "ApprovalEvent", "DEFAULT_SUPERVISOR"]

DEFAULT_SUPERVISOR = "127.0.0.1:7701"
"""The supervisor's default listen address."""

RunEvent = Union[OutputChunk, Run]
"""What :meth:`Supervisor.watch` yields: output, then the ended :class:`Run` last."""

ApprovalEvent = Union[PendingCall, DecidedCall, None]
"""What :meth:`Supervisor.approvals` yields: a call that waits, a wait that ended, or None
once every call waiting when the watch began has been yielded (what follows is live)."""


class Supervisor(_Client):
    """Starts receipts as sandboxed runs, follows them and stops them.

    Example::

        with Supervisor("127.0.0.1:7701", token_file="/var/lib/tollgate/supervisor/admin.token") as s:
            run_id = s.start(minted.text)
            for event in s.watch(run_id):
                if isinstance(event, OutputChunk):
                    print(event.text, end="")
                else:
                    print("ended:", event.state.value, event.exit_code)

    Args:
        addr: ``host:port``, ``http://host:port``, or the path of the daemon's
            ``supervisor.addr`` readiness file.
        token: The supervisor's admin token (``<data-dir>/admin.token``); only
            :meth:`info` works without it.
        token_file: A file holding the token, instead of ``token``.
        timeout: Seconds each unary call may take (:meth:`stop` waits for the teardown, up to
            30 s on the daemon's side).
        channel: An existing ``grpc.Channel`` to use instead of opening one.
        ca_file: PEM of the CA the daemon's certificate must chain to: connect with TLS
            (``tollgate pki init`` makes one).
        cert_file, key_file: This client's certificate and key (PEM), for a daemon that
            requires one (``--tls-client-ca``).

    Every failed call raises :class:`tollgate.TollgateError`: ``UNAUTHENTICATED`` (token),
    ``INVALID_ARGUMENT`` (malformed receipt text or argv), ``PERMISSION_DENIED`` (receipt
    refused: bad signature, unknown key, not yet valid, expired, wrong audience, revoked),
    ``ALREADY_EXISTS`` (receipt used before), ``NOT_FOUND`` (unknown run),
    ``RESOURCE_EXHAUSTED`` (no sandbox slot), ``UNAVAILABLE``, ``INTERNAL``.
    """

    def __init__(
        self,
        addr: PathLike = DEFAULT_SUPERVISOR,
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
        self._stub = supervisor_pb2_grpc.SupervisorStub(self._channel)

    def info(self) -> SupervisorInfo:
        """Who this supervisor is (its id is the audience receipts must name) and which
        authority keys it trusts. Public."""
        return SupervisorInfo.from_proto(
            self._unary("GetSupervisorInfo", self._stub.GetSupervisorInfo, supervisor_pb2.GetSupervisorInfoRequest())
        )

    def start(self, receipt_text: str, argv: Optional[Sequence[str]] = None) -> str:
        """Verifies a receipt, records it as used, builds its sandbox and starts the agent.

        Args:
            receipt_text: The receipt's text form (``MintedReceipt.text``).
            argv: The agent command, only for a receipt that does not pin one; argv[0] must
                be in the receipt's exec list.

        Returns:
            The run id (equal to the receipt id). Returns once the agent runs.
        """
        request = supervisor_pb2.StartRunRequest(receipt=receipt_text.strip(), argv=strings(argv))
        return str(self._unary("StartRun", self._stub.StartRun, request).run_id)

    def get(self, run_id: str) -> Run:
        """One run: its state and, once it has ended, its teardown report."""
        return Run.from_proto(self._unary("GetRun", self._stub.GetRun, supervisor_pb2.GetRunRequest(run_id=run_id)))

    def list(self) -> List[Run]:
        """Every run this supervisor has recorded, newest first."""
        response = self._unary("ListRuns", self._stub.ListRuns, supervisor_pb2.ListRunsRequest())
        return [Run.from_proto(r) for r in response.runs]

    def tree(self, run_id: str) -> RunTree:
        """A run and every run it delegated (children, grandchildren…) in pre-order, with the
        child receipts minted in the tree and not started yet. ``NOT_FOUND`` for an unknown
        run."""
        response = self._unary(
            "GetRunTree", self._stub.GetRunTree, supervisor_pb2.GetRunTreeRequest(run_id=run_id)
        )
        return RunTree.from_proto(response)

    def stop(self, run_id: str, reason: str = "") -> Run:
        """Stops a live run (state STOPPED) and returns it after its teardown. Stopping a run
        that already ended returns it as it ended."""
        response = self._unary(
            "StopRun",
            self._stub.StopRun,
            supervisor_pb2.StopRunRequest(run_id=run_id, reason=reason),
            timeout=max(self.timeout, 45.0),
        )
        return Run.from_proto(response.run)

    def watch(self, run_id: str, timeout: Optional[float] = None) -> Iterator[RunEvent]:
        """Follows a run: its output from the start (replayed), then live output, then the
        ended :class:`Run` (with its report) as the last item.

        Args:
            run_id: The run.
            timeout: Seconds the whole stream may last; None for no limit (a run never
                outlives its receipt).

        Yields:
            :class:`OutputChunk` items, then one :class:`Run`.

        Raises:
            TollgateError: ``NOT_FOUND`` for an unknown run; ``DATA_LOSS`` when this watcher
                fell too far behind the run's output; ``UNAVAILABLE`` when the stream ended
                before the run did (the supervisor went away).
        """
        call = self._stub.WatchRun(
            supervisor_pb2.WatchRunRequest(run_id=run_id), metadata=self._metadata(), timeout=timeout
        )
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "output":
                    yield OutputChunk.from_proto(event.output)
                elif kind == "ended":
                    yield Run.from_proto(event.ended)
                    return
        except grpc.RpcError as e:
            raise TollgateError.from_rpc("WatchRun", e) from None
        finally:
            call.cancel()
        # The stream ended without its final event: report the run if it did end after all.
        run = self.get(run_id)
        if not run.ended:
            raise TollgateError(
                f"the output stream of run {run_id} ended while the run is {run.state.value}",
                code=grpc.StatusCode.UNAVAILABLE,
                method="WatchRun",
            )
        yield run

    def wait(
        self,
        run_id: str,
        on_output: Optional[Callable[[OutputChunk], None]] = None,
        timeout: Optional[float] = None,
    ) -> Run:
        """Follows a run until it ends, passing each output chunk to ``on_output``; returns
        the ended run with its report."""
        for event in self.watch(run_id, timeout=timeout):
            if isinstance(event, Run):
                return event
            if on_output is not None:
                on_output(event)
        raise TollgateError(f"run {run_id}: the watch ended without the run", method="WatchRun")

    def run(
        self,
        receipt_text: str,
        argv: Optional[Sequence[str]] = None,
        on_output: Optional[Callable[[OutputChunk], None]] = None,
        timeout: Optional[float] = None,
    ) -> Run:
        """:meth:`start` then :meth:`wait`: runs a receipt to its end."""
        return self.wait(self.start(receipt_text, argv), on_output=on_output, timeout=timeout)

    def approvals(self, run_id: str = "", timeout: Optional[float] = None) -> Iterator[ApprovalEvent]:
        """Follows the calls waiting for an operator's approval: those waiting now, then
        ``None``, then each new :class:`PendingCall` and each :class:`DecidedCall` as it
        happens. An operator sees only its own runs' calls; the admin token sees all.

        Args:
            run_id: Only this run's calls; empty for every run the caller may see.
            timeout: Seconds the whole stream may last; None for no limit.

        Raises:
            TollgateError: ``RESOURCE_EXHAUSTED`` when this watcher fell too far behind
                (watch again); ``NOT_FOUND`` / ``PERMISSION_DENIED`` for a run it may not see.
        """
        call = self._stub.WatchApprovals(
            supervisor_pb2.WatchApprovalsRequest(run_id=run_id), metadata=self._metadata(), timeout=timeout
        )
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "pending":
                    yield PendingCall.from_proto(event.pending)
                elif kind == "decided":
                    yield DecidedCall.from_proto(event.decided)
                elif kind == "caught_up":
                    yield None
        except grpc.RpcError as e:
            raise TollgateError.from_rpc("WatchApprovals", e) from None
        finally:
            call.cancel()

    def decide(
        self, run_id: str, call_id: str, approve: bool, *, remember: bool = False, reason: str = ""
    ) -> DecidedCall:
        """Approves or denies one waiting call. ``remember`` (with approve) lets the run's
        later identical calls (same tool and path; for ``exec`` the same argv) through
        without asking. ``NOT_FOUND`` once the call no longer waits."""
        request = supervisor_pb2.DecideApprovalRequest(
            run_id=run_id, call_id=call_id, approve=approve, remember=remember, reason=reason
        )
        response = self._unary("DecideApproval", self._stub.DecideApproval, request)
        return DecidedCall.from_proto(response.decided)

    def approve(self, run_id: str, call_id: str, *, remember: bool = False) -> DecidedCall:
        """:meth:`decide` approving."""
        return self.decide(run_id, call_id, True, remember=remember)

    def deny(self, run_id: str, call_id: str, reason: str = "") -> DecidedCall:
        """:meth:`decide` denying; the agent is told ``reason``."""
        return self.decide(run_id, call_id, False, reason=reason)

    def narrow(
        self,
        run_id: str,
        *,
        drop_fs: Iterable[str] = (),
        tool_calls: int = 0,
        tokens: int = 0,
        output_bytes: Union[int, str] = 0,
        egress_bytes: Union[int, str] = 0,
        drop_exec: Iterable[str] = (),
        expires_at: Union[datetime, float, None] = None,
    ) -> RunEnvelope:
        """Takes powers away from a live run without stopping it (its owner or an admin; no
        signature needed): drops fs grants (a mounted one is unmounted from the sandbox, and
        the run's live children lose theirs beneath it) and gateway-only programs
        (``drop_exec``), lowers budgets (each the run's in all; 0 leaves it), brings the expiry
        forward. Anything that would widen is
        ``FAILED_PRECONDITION``. Returns what the run may do now."""
        narrowing = supervisor_pb2.Narrowing(
            drop_fs=strings(drop_fs),
            tool_calls=tool_calls,
            tokens=tokens,
            output_bytes=parse_size(output_bytes) if output_bytes else 0,
            egress_bytes=parse_size(egress_bytes) if egress_bytes else 0,
            drop_gateway_exec=strings(drop_exec),
        )
        if expires_at is not None:
            narrowing.expires_at.CopyFrom(_timestamp(expires_at))
        request = supervisor_pb2.AmendRunRequest(run_id=run_id, narrow=narrowing)
        return RunEnvelope.from_proto(self._unary("AmendRun", self._stub.AmendRun, request))

    def amend(self, run_id: str, amendment: Amendment) -> RunEnvelope:
        """Applies a widening the authority signed (:meth:`Authority.amend`) to the live run.
        A forged, stale or other run's amendment is ``PERMISSION_DENIED``; one applied before
        changes nothing. Returns what the run may do now."""
        request = supervisor_pb2.AmendRunRequest(run_id=run_id, amendment=amendment.signed)
        return RunEnvelope.from_proto(self._unary("AmendRun", self._stub.AmendRun, request))
