import { status as Status } from "@grpc/grpc-js";

import { CallOptions, ClientOptions, DaemonClient } from "./connection";
import {
  approvalEventFromRaw,
  decidedCallFromRaw,
  narrowingToRaw,
  Raw,
  runEnvelopeFromRaw,
  runEventFromRaw,
  runFromRaw,
  runTreeFromRaw,
  supervisorInfoFromRaw,
} from "./convert";
import { TollgateError } from "./errors";
import type {
  Amendment,
  ApprovalEvent,
  DecidedCall,
  MintedReceipt,
  Narrowing,
  Run,
  RunEnvelope,
  RunEvent,
  RunTree,
  SignedAmendment,
  SupervisorInfo,
} from "./types";

/** Options of {@link Supervisor.start}. */
export interface StartOptions extends CallOptions {
  /** The agent command, only for receipts that pin none; argv[0] must be in the receipt's `exec`. */
  argv?: string[];
}

/** Options of {@link Supervisor.decide}. */
export interface DecideOptions extends CallOptions {
  /**
   * With approve: let the run's later calls of the same tool on the same path (for `exec`: the
   * same argv) through without asking, for the rest of the run.
   */
  remember?: boolean;
  /** Why (shown to the agent on a denial; audited either way). At most 1024 bytes. */
  reason?: string;
}

/**
 * A client of the supervisor daemon (`tollgate-supervisor`, service `tollgate.v1.Supervisor`):
 * turns one receipt into one sandboxed run, reports and streams it, and stops it.
 *
 * Calls other than {@link Supervisor.info} need the supervisor's token (`<data-dir>/admin.token`).
 * Every failure rejects with a {@link TollgateError}.
 *
 * @example
 * const supervisor = new Supervisor({ address: "127.0.0.1:7701", tokenFile: "/var/lib/tollgate/supervisor/admin.token" });
 * const runId = await supervisor.start(minted);
 * for await (const event of supervisor.watch(runId)) {
 *   if (event.type === "output") process.stdout.write(event.data);
 *   else console.log(event.run.state, event.run.report?.exitCode);
 * }
 */
export class Supervisor extends DaemonClient {
  constructor(options: ClientOptions) {
    super("Supervisor", options);
  }

  /** Who this supervisor is and which authority keys it trusts (public: no token needed). */
  async info(options?: CallOptions): Promise<SupervisorInfo> {
    return supervisorInfoFromRaw(await this.unary<Raw>("GetSupervisorInfo", {}, options));
  }

  /**
   * Verifies a receipt, records it as used, builds its sandbox and starts the agent; resolves
   * with the run id (= the receipt id) once the agent runs. Follow it with {@link watch}.
   *
   * @param receipt the receipt's text form (`tgr1.…`) or what {@link Authority.mint} returned.
   *
   * Rejects with PERMISSION_DENIED for a refused receipt (bad signature, unknown key, not yet
   * valid, expired, wrong audience, revoked: the details say which), ALREADY_EXISTS when the
   * receipt was used before, INVALID_ARGUMENT for malformed text or argv, UNAVAILABLE when no
   * sandbox slot is free.
   */
  async start(receipt: string | Pick<MintedReceipt, "text">, options: StartOptions = {}): Promise<string> {
    const text = typeof receipt === "string" ? receipt.trim() : receipt.text;
    const raw = await this.unary<Raw>("StartRun", { receipt: text, argv: options.argv ?? [] }, options);
    return String(raw.runId ?? "");
  }

  /** One run: its state and, once ended, its teardown report. Rejects with NOT_FOUND for an unknown run. */
  async get(runId: string, options?: CallOptions): Promise<Run> {
    return runFromRaw(await this.unary<Raw>("GetRun", { runId }, options));
  }

  /** Every run this supervisor knows, newest first. */
  async list(options?: CallOptions): Promise<Run[]> {
    const raw = await this.unary<Raw>("ListRuns", {}, options);
    return (Array.isArray(raw.runs) ? (raw.runs as Raw[]) : []).map(runFromRaw);
  }

  /**
   * A run and every run it delegated (children, grandchildren…) in pre-order, with the child
   * receipts minted in the tree and not started yet. Rejects with NOT_FOUND for an unknown run.
   */
  async tree(runId: string, options?: CallOptions): Promise<RunTree> {
    return runTreeFromRaw(await this.unary<Raw>("GetRunTree", { runId }, options));
  }

  /** Stops a live run (teardown with state STOPPED) and resolves with the run as recorded after teardown. */
  async stop(runId: string, reason = "", options?: CallOptions): Promise<Run> {
    const raw = await this.unary<Raw>("StopRun", { runId, reason }, options);
    return runFromRaw(raw.run as Raw | undefined);
  }

  /**
   * The run's output from its start (replayed), then live output, then one final `ended` event
   * with the run as recorded after teardown; the iteration ends after it. Leaving the loop early
   * cancels the stream (the run goes on). No deadline unless `timeoutMs` is given.
   *
   * Throws a TollgateError (NOT_FOUND for an unknown run; UNAVAILABLE when the stream ends
   * before the run does, e.g. the supervisor went away).
   */
  async *watch(runId: string, options: CallOptions = {}): AsyncGenerator<RunEvent, void, undefined> {
    for await (const raw of this.serverStream<Raw>("WatchRun", { runId }, options)) {
      const event = runEventFromRaw(raw);
      if (event === undefined) {
        continue;
      }
      yield event;
      if (event.type === "ended") {
        return;
      }
    }
    throw new TollgateError(Status.UNAVAILABLE, `the stream of run ${runId} ended before the run did`, "Supervisor/WatchRun");
  }

  /**
   * Follows the gateway calls waiting for an operator's approval (calls under a grant with
   * `ask`): first each call waiting now (`pending`), then one `caughtUp`, then each new waiting
   * call and each end of a wait (`decided`) as it happens. An operator sees only its own runs'
   * calls; the admin token every run's. The stream has no end of its own: leave the loop (or
   * abort with `signal`, or give `timeoutMs`) to stop watching.
   *
   * @param runId only this run's calls; "" for every run the caller may see.
   *
   * Throws a TollgateError: NOT_FOUND / PERMISSION_DENIED for a run the caller may not see;
   * RESOURCE_EXHAUSTED when this watcher fell too far behind (watch again).
   */
  async *approvals(runId = "", options: CallOptions = {}): AsyncGenerator<ApprovalEvent, void, undefined> {
    for await (const raw of this.serverStream<Raw>("WatchApprovals", { runId }, options)) {
      const event = approvalEventFromRaw(raw);
      if (event !== undefined) {
        yield event;
      }
    }
  }

  /**
   * Approves (`approve` true) or denies one waiting call, and resolves with how its wait ended.
   * `remember` goes with approve only (INVALID_ARGUMENT with a denial).
   *
   * Rejects with NOT_FOUND when the call does not wait (any more), PERMISSION_DENIED for
   * another operator's run.
   */
  async decide(runId: string, callId: string, approve: boolean, options: DecideOptions = {}): Promise<DecidedCall> {
    const request = { runId, callId, approve, remember: options.remember ?? false, reason: options.reason ?? "" };
    const raw = await this.unary<Raw>("DecideApproval", request, options);
    return decidedCallFromRaw(raw.decided as Raw | undefined);
  }

  /** {@link decide} approving; `remember` lets the run's later identical calls through without asking. */
  async approve(runId: string, callId: string, options: CallOptions & { remember?: boolean } = {}): Promise<DecidedCall> {
    return this.decide(runId, callId, true, options);
  }

  /** {@link decide} denying; the agent's call fails with `reason`. */
  async deny(runId: string, callId: string, reason = "", options: CallOptions = {}): Promise<DecidedCall> {
    return this.decide(runId, callId, false, { ...options, remember: false, reason });
  }

  /**
   * Takes powers away from a live run without stopping it (its owner or an admin; no signature
   * needed): drops gateway-only fs grants (the run's live children lose theirs beneath them)
   * and gateway-only programs, lowers budgets, brings the expiry forward. Resolves with what the
   * run's gateway allows now.
   *
   * Rejects with FAILED_PRECONDITION when the run is not live or a field would widen.
   */
  async narrow(runId: string, narrowing: Narrowing, options?: CallOptions): Promise<RunEnvelope> {
    const raw = await this.unary<Raw>("AmendRun", { runId, narrow: narrowingToRaw(narrowing) }, options);
    return runEnvelopeFromRaw(raw);
  }

  /**
   * Applies a widening the authority signed ({@link Authority.amend}) to the live run: more
   * gateway-only fs grants and programs, bigger budgets, a later expiry (the kernel envelope is
   * never widened). One applied before changes nothing. Resolves with what the run's gateway
   * allows now.
   *
   * @param amendment what {@link Authority.amend} returned, or its `signed` envelope.
   *
   * Rejects with PERMISSION_DENIED for a bad signature, another run's amendment or a stale one
   * (signed over 5 minutes ago), FAILED_PRECONDITION when the run is not live.
   */
  async amend(runId: string, amendment: Amendment | SignedAmendment, options?: CallOptions): Promise<RunEnvelope> {
    const signed = "signed" in amendment ? amendment.signed : amendment;
    const request = { runId, amendment: { amendment: signed.amendment, keyId: signed.keyId, signature: signed.signature } };
    return runEnvelopeFromRaw(await this.unary<Raw>("AmendRun", request, options));
  }

  /**
   * Watches a run to its end and resolves with the ended run, passing each output chunk to
   * `onOutput` (when given) as it arrives.
   */
  async wait(runId: string, onOutput?: (stream: "stdout" | "stderr", data: Buffer) => void, options?: CallOptions): Promise<Run> {
    for await (const event of this.watch(runId, options)) {
      if (event.type === "output") {
        onOutput?.(event.stream, event.data);
      } else {
        return event.run;
      }
    }
    // watch() only finishes normally after an `ended` event.
    throw new TollgateError(Status.INTERNAL, "unreachable", "Supervisor/WatchRun");
  }
}
