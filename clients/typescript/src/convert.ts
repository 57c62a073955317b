// Between the public shapes (types.ts) and what @grpc/proto-loader encodes and decodes (camelCase
// plain objects; Timestamps as {seconds, nanos}). Decoding is defensive: unset message fields
// arrive as null, unset proto3 `optional` fields as undefined.

import type {
  AgentSpec,
  AmendRequest,
  Amendment,
  ApprovalEvent,
  ApprovalOutcome,
  DecidedCall,
  FsAccess,
  FsGrant,
  KeySet,
  Limits,
  MintedReceipt,
  MintRequest,
  Narrowing,
  NetworkAccess,
  OutputStream,
  PendingCall,
  PublicKey,
  Receipt,
  Revocation,
  RouteGrant,
  Run,
  RunEnvelope,
  RunEvent,
  RunState,
  RunTree,
  Sensitivity,
  SignedAmendment,
  SignedReceipt,
  SupervisorInfo,
  TeardownReport,
} from "./types";

/** A decoded message: fields by camelCase name. */
export type Raw = { [field: string]: unknown };

export interface RawTimestamp {
  seconds: number | string;
  nanos: number;
}

export function toTimestamp(date: Date): RawTimestamp {
  const ms = date.getTime();
  if (!Number.isFinite(ms)) {
    throw new TypeError("invalid Date");
  }
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: (ms - seconds * 1000) * 1_000_000 };
}

export function fromTimestamp(value: unknown): Date | undefined {
  if (value === null || value === undefined || typeof value !== "object") {
    return undefined;
  }
  const { seconds, nanos } = value as Partial<RawTimestamp>;
  return new Date(Number(seconds ?? 0) * 1000 + Math.floor(Number(nanos ?? 0) / 1_000_000));
}

function message(value: unknown): Raw | undefined {
  return value !== null && value !== undefined && typeof value === "object" ? (value as Raw) : undefined;
}

function str(value: unknown): string {
  return typeof value === "string" ? value : "";
}

function num(value: unknown): number {
  return typeof value === "number" ? value : Number(value ?? 0);
}

function optNum(value: unknown): number | undefined {
  return value === null || value === undefined ? undefined : num(value);
}

function strings(value: unknown): string[] {
  return Array.isArray(value) ? value.map(String) : [];
}

function list(value: unknown): Raw[] {
  return Array.isArray(value) ? (value as Raw[]) : [];
}

function buffer(value: unknown): Buffer {
  return Buffer.isBuffer(value) ? value : Buffer.from((value as Uint8Array | undefined) ?? []);
}

/** A mint request as the proto encoder takes it. */
export function mintRequestToRaw(request: MintRequest): Raw {
  return {
    subject: request.subject,
    ttlSeconds: request.ttlSeconds,
    audience: request.audience,
    agent: request.agent && {
      argv: request.agent.argv,
      env: request.agent.env ?? {},
      workdir: request.agent.workdir ?? "",
    },
    limits: request.limits && { ...request.limits },
    fs: (request.fs ?? []).map((grant) => fsGrantToRaw(grant)),
    exec: request.exec ?? [],
    routes: (request.routes ?? []).map((route) => ({ name: route.name, maxSensitivity: route.maxSensitivity })),
    egress: (request.egress ?? []).map((grant) => ({
      host: grant.host,
      ports: grant.ports ?? [],
      maxSensitivity: grant.maxSensitivity ?? "SENSITIVITY_UNSPECIFIED",
      inject: grant.inject ?? "",
      methods: grant.methods ?? [],
      paths: grant.paths ?? [],
      inspect: grant.inspect ?? false,
    })),
    delegate: request.delegate && { maxDepth: request.delegate.maxDepth },
    notBefore: request.notBefore && toTimestamp(request.notBefore),
    gatewayExec: (request.gatewayExec ?? []).map((grant) => ({ program: grant.program, ask: grant.ask ?? false })),
    approvalTimeoutSeconds: request.approvalTimeoutSeconds ?? 0,
    workspaceKeepSeconds: request.workspaceKeepSeconds ?? 0,
  };
}

function fsGrantToRaw(grant: { path: string; access: FsAccess; mount?: string; ask?: boolean; askReads?: boolean }): Raw {
  return {
    path: grant.path,
    access: grant.access,
    mount: grant.mount ?? "",
    ask: grant.ask ?? false,
    askReads: grant.askReads ?? false,
  };
}

function fsGrantFromRaw(raw: Raw): FsGrant {
  return {
    path: str(raw.path),
    access: str(raw.access) as FsAccess,
    mount: str(raw.mount),
    ask: raw.ask === true,
    askReads: raw.askReads === true,
  };
}

/** An AmendReceiptRequest as the proto encoder takes it. */
export function amendRequestToRaw(receiptId: string, request: AmendRequest): Raw {
  return {
    receiptId,
    addFs: (request.addFs ?? []).map((grant) => fsGrantToRaw(grant)),
    toolCalls: request.toolCalls ?? 0,
    tokens: request.tokens ?? 0,
    outputBytes: request.outputBytes ?? 0,
    egressBytes: request.egressBytes ?? 0,
    addGatewayExec: (request.addGatewayExec ?? []).map((grant) => ({ program: grant.program, ask: grant.ask ?? false })),
    extendSeconds: request.extendSeconds ?? 0,
    forChildren: request.forChildren ?? false,
  };
}

/** A Narrowing as the proto encoder takes it. */
export function narrowingToRaw(narrowing: Narrowing): Raw {
  return {
    dropFs: narrowing.dropFs ?? [],
    toolCalls: narrowing.toolCalls ?? 0,
    tokens: narrowing.tokens ?? 0,
    outputBytes: narrowing.outputBytes ?? 0,
    egressBytes: narrowing.egressBytes ?? 0,
    dropGatewayExec: narrowing.dropGatewayExec ?? [],
    expiresAt: narrowing.expiresAt && toTimestamp(narrowing.expiresAt),
  };
}

function agentFromRaw(raw: Raw | undefined): AgentSpec | undefined {
  if (raw === undefined) {
    return undefined;
  }
  const env = message(raw.env) ?? {};
  return {
    argv: strings(raw.argv),
    env: Object.fromEntries(Object.entries(env).map(([k, v]) => [k, String(v)])),
    workdir: str(raw.workdir),
  };
}

function limitsFromRaw(raw: Raw | undefined): Limits {
  const r = raw ?? {};
  return {
    memoryBytes: num(r.memoryBytes),
    pids: num(r.pids),
    cpuMillicores: num(r.cpuMillicores),
    outputBytes: num(r.outputBytes),
    tmpfsBytes: num(r.tmpfsBytes),
    toolCalls: num(r.toolCalls),
    tokens: num(r.tokens),
    files: num(r.files),
    egressConnections: num(r.egressConnections),
    egressBytes: num(r.egressBytes),
    egressIdleSeconds: num(r.egressIdleSeconds),
  };
}

function routeFromRaw(raw: Raw): RouteGrant {
  return { name: str(raw.name), maxSensitivity: str(raw.maxSensitivity) as Sensitivity };
}

export function receiptFromRaw(raw: Raw | undefined): Receipt {
  const r = raw ?? {};
  const delegate = message(r.delegate);
  return {
    receiptId: str(r.receiptId),
    issuer: str(r.issuer),
    keyId: str(r.keyId),
    owner: str(r.owner),
    subject: str(r.subject),
    audience: strings(r.audience),
    issuedAt: fromTimestamp(r.issuedAt) ?? new Date(0),
    notBefore: fromTimestamp(r.notBefore) ?? new Date(0),
    expiresAt: fromTimestamp(r.expiresAt) ?? new Date(0),
    policyVersion: str(r.policyVersion),
    parentReceiptId: str(r.parentReceiptId),
    depth: num(r.depth),
    agent: agentFromRaw(message(r.agent)),
    limits: limitsFromRaw(message(r.limits)),
    fs: list(r.fs).map(fsGrantFromRaw),
    exec: strings(r.exec),
    routes: list(r.routes).map(routeFromRaw),
    egress: list(r.egress).map((g) => ({
      host: str(g.host),
      ports: list(g.ports).map((p) => num(p)),
      maxSensitivity: str(g.maxSensitivity) as Sensitivity,
      inject: str(g.inject),
      methods: strings(g.methods),
      paths: strings(g.paths),
      inspect: Boolean(g.inspect),
    })),
    network: (str(r.network) || "NETWORK_ACCESS_LOOPBACK_ONLY") as NetworkAccess,
    delegate: delegate && { maxDepth: num(delegate.maxDepth) },
    gatewayExec: list(r.gatewayExec).map((g) => ({ program: str(g.program), ask: g.ask === true })),
    approvalTimeoutSeconds: num(r.approvalTimeoutSeconds),
  };
}

function signedFromRaw(raw: Raw | undefined): SignedReceipt {
  const r = raw ?? {};
  return { receipt: buffer(r.receipt), keyId: str(r.keyId), signature: buffer(r.signature) };
}

/** MintReceiptResponse or GetReceiptResponse. */
export function mintedFromRaw(raw: Raw): MintedReceipt {
  return { signed: signedFromRaw(message(raw.signed)), receipt: receiptFromRaw(message(raw.receipt)), text: str(raw.text) };
}

export function revocationFromRaw(raw: Raw | undefined): Revocation {
  const r = raw ?? {};
  return {
    seq: num(r.seq),
    receiptId: str(r.receiptId),
    revokedAt: fromTimestamp(r.revokedAt),
    reason: str(r.reason),
    revokedBy: str(r.revokedBy),
    receiptExpiresAt: fromTimestamp(r.receiptExpiresAt),
  };
}

function publicKeyFromRaw(raw: Raw): PublicKey {
  return {
    keyId: str(raw.keyId),
    publicKey: buffer(raw.publicKey),
    createdAt: fromTimestamp(raw.createdAt),
    active: raw.active === true,
    retiredAt: fromTimestamp(raw.retiredAt),
    verifyUntil: fromTimestamp(raw.verifyUntil),
  };
}

export function keySetFromRaw(raw: Raw): KeySet {
  return { issuer: str(raw.issuer), keys: list(raw.keys).map(publicKeyFromRaw) };
}

export function supervisorInfoFromRaw(raw: Raw): SupervisorInfo {
  return {
    supervisorId: str(raw.supervisorId),
    trustedKeyIds: strings(raw.trustedKeyIds),
    version: str(raw.version),
    cgroupMode: str(raw.cgroupMode),
    lastRevocationSeq: num(raw.lastRevocationSeq),
  };
}

function reportFromRaw(raw: Raw | undefined): TeardownReport | undefined {
  if (raw === undefined) {
    return undefined;
  }
  return {
    reason: str(raw.reason),
    durationMs: num(raw.durationMs),
    exitCode: optNum(raw.exitCode),
    signal: optNum(raw.signal),
    peakMemoryBytes: optNum(raw.peakMemoryBytes),
    lastToolCallId: str(raw.lastToolCallId),
    routesUsed: strings(raw.routesUsed),
    outputTruncated: raw.outputTruncated === true,
    cleanupErrors: strings(raw.cleanupErrors),
    landlockAbi: num(raw.landlockAbi),
    workspace: str(raw.workspace),
    workspaceKeptUntil:
      num(raw.workspaceKeptUntil) > 0
        ? new Date(num(raw.workspaceKeptUntil) * 1000)
        : undefined,
  };
}

export function runFromRaw(raw: Raw | undefined): Run {
  const r = raw ?? {};
  return {
    runId: str(r.runId),
    owner: str(r.owner),
    subject: str(r.subject),
    state: (str(r.state) || "RUN_STATE_UNSPECIFIED") as RunState,
    createdAt: fromTimestamp(r.createdAt),
    endedAt: fromTimestamp(r.endedAt),
    expiresAt: fromTimestamp(r.expiresAt),
    report: reportFromRaw(message(r.report)),
    parentRunId: str(r.parentRunId),
    depth: num(r.depth),
    workspaceKeepSeconds: num(r.workspaceKeepSeconds),
  };
}

export function runTreeFromRaw(raw: Raw): RunTree {
  const runs = Array.isArray(raw.runs) ? (raw.runs as Raw[]) : [];
  const pending = Array.isArray(raw.pending) ? (raw.pending as Raw[]) : [];
  return {
    runs: runs.map(runFromRaw),
    pending: pending.map((p) => ({
      receiptId: str(p.receiptId),
      parentRunId: str(p.parentRunId),
      subject: str(p.subject),
      expiresAt: fromTimestamp(p.expiresAt),
    })),
  };
}

/** A RunEvent, or undefined for an event this client does not know (a newer server). */
export function runEventFromRaw(raw: Raw): RunEvent | undefined {
  const output = message(raw.output);
  if (raw.event === "output" && output !== undefined) {
    const stream: OutputStream = output.stream === "OUTPUT_STREAM_STDERR" ? "stderr" : "stdout";
    return { type: "output", stream, data: buffer(output.data) };
  }
  if (raw.event === "ended") {
    return { type: "ended", run: runFromRaw(message(raw.ended)) };
  }
  return undefined;
}

function pendingCallFromRaw(raw: Raw | undefined): PendingCall {
  const r = raw ?? {};
  return {
    runId: str(r.runId),
    callId: str(r.callId),
    owner: str(r.owner),
    subject: str(r.subject),
    tool: str(r.tool),
    path: str(r.path),
    bytes: num(r.bytes),
    mode: str(r.mode),
    askedAt: fromTimestamp(r.askedAt),
    deadline: fromTimestamp(r.deadline),
    sensitivity: str(r.sensitivity),
    reasons: strings(r.reasons),
    argv: strings(r.argv),
    cwd: str(r.cwd),
    stdinSha256: str(r.stdinSha256),
  };
}

/** A DecidedCall; the outcome's enum name without its prefix, lower case ("APPROVAL_OUTCOME_TIMED_OUT" → "timed_out"). */
export function decidedCallFromRaw(raw: Raw | undefined): DecidedCall {
  const r = raw ?? {};
  return {
    runId: str(r.runId),
    callId: str(r.callId),
    outcome: str(r.outcome).replace(/^APPROVAL_OUTCOME_/, "").toLowerCase() as ApprovalOutcome,
    decidedBy: str(r.decidedBy),
    reason: str(r.reason),
    remember: r.remember === true,
  };
}

/** An ApprovalEvent, or undefined for an event this client does not know (a newer server). */
export function approvalEventFromRaw(raw: Raw): ApprovalEvent | undefined {
  switch (raw.event) {
    case "pending":
      return { type: "pending", call: pendingCallFromRaw(message(raw.pending)) };
    case "decided":
      return { type: "decided", decided: decidedCallFromRaw(message(raw.decided)) };
    case "caughtUp":
    case "caught_up":
      return { type: "caughtUp" };
    default:
      return undefined;
  }
}

/** An AmendRunResponse. */
export function runEnvelopeFromRaw(raw: Raw): RunEnvelope {
  return {
    fs: list(raw.fs).map(fsGrantFromRaw),
    toolCalls: num(raw.toolCalls),
    tokens: num(raw.tokens),
    outputBytes: num(raw.outputBytes),
    egressBytes: num(raw.egressBytes),
    gatewayExec: list(raw.gatewayExec).map((g) => ({ program: str(g.program), ask: g.ask === true })),
    expiresAt: fromTimestamp(raw.expiresAt) ?? new Date(0),
  };
}

/** An AmendReceiptResponse: the decoded amendment with its signed envelope. */
export function amendmentFromRaw(raw: Raw): Amendment {
  const a = message(raw.amendment) ?? {};
  const s = message(raw.signed) ?? {};
  const signed: SignedAmendment = { amendment: buffer(s.amendment), keyId: str(s.keyId), signature: buffer(s.signature) };
  return {
    amendmentId: str(a.amendmentId),
    receiptId: str(a.receiptId),
    issuer: str(a.issuer),
    keyId: str(a.keyId),
    owner: str(a.owner),
    issuedAt: fromTimestamp(a.issuedAt),
    addFs: list(a.addFs).map(fsGrantFromRaw),
    toolCalls: num(a.toolCalls),
    tokens: num(a.tokens),
    outputBytes: num(a.outputBytes),
    egressBytes: num(a.egressBytes),
    addGatewayExec: list(a.addGatewayExec).map((g) => ({ program: str(g.program), ask: g.ask === true })),
    expiresAt: fromTimestamp(a.expiresAt),
    amendedBy: str(a.amendedBy),
    forChildren: a.forChildren === true,
    signed,
  };
}
