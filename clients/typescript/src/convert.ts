// Between the public shapes (types.ts) and what @grpc/proto-loader encodes and decodes (camelCase
// plain objects; Timestamps as {seconds, nanos}). Decoding is defensive: unset message fields
// arrive as null, unset proto3 `optional` fields as undefined.

import type {
  AgentSpec,
  FsAccess,
  KeySet,
  Limits,
  MintedReceipt,
  MintRequest,
  NetworkAccess,
  OutputStream,
  PublicKey,
  Receipt,
  Revocation,
  RouteGrant,
  Run,
  RunEvent,
  RunState,
  RunTree,
  Sensitivity,
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
    fs: (request.fs ?? []).map((grant) => ({ path: grant.path, access: grant.access, mount: grant.mount ?? "" })),
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
    fs: list(r.fs).map((g) => ({ path: str(g.path), access: str(g.access) as FsAccess, mount: str(g.mount) })),
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
