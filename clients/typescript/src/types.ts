// The public shapes of the client: the messages of proto/tollgate/v1/*.proto in camelCase,
// with Timestamps as Date, bytes as Buffer, 64-bit integers as number and enums as their
// proto names. The proto files are the reference for what each field means.

/** How sensitive a text is. Ordered: LOW < MEDIUM < HIGH. UNSPECIFIED is never valid in a grant. */
export type Sensitivity =
  | "SENSITIVITY_UNSPECIFIED"
  | "SENSITIVITY_LOW"
  | "SENSITIVITY_MEDIUM"
  | "SENSITIVITY_HIGH";

/** What a file-system grant allows. WRITE implies READ. UNSPECIFIED is never valid in a grant. */
export type FsAccess = "FS_ACCESS_UNSPECIFIED" | "FS_ACCESS_READ" | "FS_ACCESS_WRITE";

/** Network access of a sandbox: its own loopback only (the only mode today). */
export type NetworkAccess = "NETWORK_ACCESS_LOOPBACK_ONLY";

/** Where a run is in its life. STARTING and RUNNING are live; every other state is final. */
export type RunState =
  | "RUN_STATE_UNSPECIFIED"
  | "RUN_STATE_STARTING"
  | "RUN_STATE_RUNNING"
  | "RUN_STATE_EXITED"
  | "RUN_STATE_FAILED"
  | "RUN_STATE_STOPPED"
  | "RUN_STATE_EXPIRED"
  | "RUN_STATE_REVOKED"
  | "RUN_STATE_LIMIT_EXCEEDED"
  | "RUN_STATE_SHIM_DIED"
  | "RUN_STATE_SUPERVISOR_SHUTDOWN"
  | "RUN_STATE_LOST"
  | "RUN_STATE_PARENT_ENDED";

/** Which output stream of the agent a chunk came from. */
export type OutputStream = "stdout" | "stderr";

/** A pinned agent command: the supervisor runs exactly this. */
export interface AgentSpec {
  /** Absolute path of the executable, then its arguments. argv[0] must be in the receipt's `exec`. */
  argv: string[];
  /** Extra environment variables (no secrets: receipts are readable by whoever holds them). */
  env: Record<string, string>;
  /** Working directory inside the sandbox; empty means "/work". */
  workdir: string;
}

/**
 * Resource limits of one run. In a receipt every field is set; in a mint request a missing or
 * zero field takes the authority's default, capped by the operator's ceiling.
 */
export interface Limits {
  /** Memory limit of the run's cgroup, in bytes. */
  memoryBytes: number;
  /** Maximum processes and threads in the run's cgroup. */
  pids: number;
  /** CPU quota in thousandths of a core (1000 = one core). */
  cpuMillicores: number;
  /** Maximum bytes of agent stdout+stderr relayed, and of tool output returned. */
  outputBytes: number;
  /** Size of the sandbox's /tmp tmpfs, in bytes. */
  tmpfsBytes: number;
  /** Maximum gateway tool calls during the run. */
  toolCalls: number;
  /** Maximum model tokens (prompt plus completion) during the run. */
  tokens: number;
  /** Open file descriptors of each sandbox process (RLIMIT_NOFILE); 0 means 1024. */
  files: number;
  /** Outbound connections open at once; 0 means 16. */
  egressConnections: number;
  /** Bytes the run's outbound connections carry, each way over the run; 0 means 1 GiB. */
  egressBytes: number;
  /** Seconds an outbound connection may be idle; 0 means 60. */
  egressIdleSeconds: number;
}

/** Access to one host path. */
export interface FsGrant {
  /** Absolute, normalised host path. */
  path: string;
  /** What the run may do beneath it. */
  access: FsAccess;
  /** Where it is bind-mounted inside the sandbox; empty: reachable only through the gateway's file tools. */
  mount: string;
  /**
   * Whether each change the gateway makes beneath the path (fs.write, fs.delete) waits for an
   * operator's approval first (`Supervisor.approvals`). Only for a grant without `mount`.
   */
  ask: boolean;
  /** Whether each read through the gateway (fs.read, fs.list, fs.stat) waits for approval too. Only without `mount`. */
  askReads: boolean;
}

/**
 * A program the agent may run only through the gateway's exec tool (`tollgate-shim tool exec`),
 * never directly: each run of it is checked, counted, audited with its argv and, with `ask`,
 * approved by an operator first.
 */
export interface GatewayExecGrant {
  /** Absolute path of the program inside the sandbox; never also in the receipt's `exec`. */
  program: string;
  /** Whether each command waits for an operator's approval (who sees its argv and working directory). */
  ask: boolean;
}

/** Permission to use one model route. */
export interface RouteGrant {
  /** A route name from the supervisor's configuration, e.g. "local". */
  name: string;
  /** The most sensitive text this route may carry for the run. */
  maxSensitivity: Sensitivity;
}

/**
 * Permission to open outbound connections to one host (exact name, `*.suffix`, or an IP
 * address) through the supervisor. See docs/egress.md.
 */
export interface EgressGrant {
  /** Where: "pypi.org", "*.example.com" or an address. */
  host: string;
  /** Ports; a minted receipt always lists them (443 when the request named none). */
  ports: number[];
  /** The most sensitive text the run may send there. */
  maxSensitivity: Sensitivity;
  /** A secret of the supervisor's added as a header to each request (inspected hosts). */
  inject: string;
  /** HTTP methods allowed per request; empty: any. */
  methods: string[];
  /** Path prefixes allowed per request; empty: any. */
  paths: string[];
  /** Whether the supervisor reads each request (implied by inject, methods and paths). */
  inspect: boolean;
}

/** Permission to ask for child receipts. */
export interface Delegation {
  /** Levels of descendants the run may create; 0 forbids delegation. */
  maxDepth: number;
}

/** The signed statement of what one run may do (`tollgate.v1.Receipt`). */
export interface Receipt {
  /** UUID v7; also the run's id. */
  receiptId: string;
  /** The authority's issuer name. */
  issuer: string;
  /** key_id of the signing key. */
  keyId: string;
  /** The operator that asked for the run and owns its lifecycle. */
  owner: string;
  /** The agent's name. */
  subject: string;
  /** Supervisor ids allowed to honour it. */
  audience: string[];
  /** When the authority minted it. */
  issuedAt: Date;
  /** Not valid before this instant. */
  notBefore: Date;
  /** The receipt, and any run started from it, ends here. */
  expiresAt: Date;
  /** The policy set that produced it. */
  policyVersion: string;
  /** For a delegated receipt, its parent's id; empty for a root receipt. */
  parentReceiptId: string;
  /** Delegation depth: 0 for a root receipt. */
  depth: number;
  /** The pinned agent command, if any. */
  agent?: AgentSpec;
  /** Resource limits; every field set. */
  limits: Limits;
  /** Host paths the run may reach. */
  fs: FsGrant[];
  /** Executables (absolute paths inside the sandbox) the agent and the exec tool may run. */
  exec: string[];
  /** Model routes the run may use. */
  routes: RouteGrant[];
  /** Outbound connections the run may open through the supervisor. */
  egress: EgressGrant[];
  /** Network access. */
  network: NetworkAccess;
  /** Delegation permission, if any. */
  delegate?: Delegation;
  /** Programs the agent may run only through the gateway's exec tool. */
  gatewayExec: GatewayExecGrant[];
  /** Seconds a call waiting for an operator's approval waits before it is denied (never past the expiry). */
  approvalTimeoutSeconds: number;
}

/** The envelope that travels: the exact receipt bytes and their Ed25519 signature. */
export interface SignedReceipt {
  /** The exact protobuf encoding of the Receipt; verify over these bytes, never re-encode. */
  receipt: Buffer;
  /** Which key signed: lowercase hex of the first 8 bytes of SHA-256 of the public key. */
  keyId: string;
  /** Ed25519 signature over "tollgate.receipt.v1\n" || receipt. */
  signature: Buffer;
}

/** What to mint. Every grant must lie within the calling operator's ceiling. */
export interface MintRequest {
  /** The agent's name. Required. */
  subject: string;
  /** Lifetime in seconds from now (or from notBefore). Required; at most the ceiling's max ttl. */
  ttlSeconds: number;
  /** Supervisor ids allowed to honour the receipt. Required, non-empty. */
  audience: string[];
  /** Pin the agent command (argv[0] must be listed in `exec`). */
  agent?: { argv: string[]; env?: Record<string, string>; workdir?: string };
  /** Requested limits; a missing or zero field takes the authority's default. */
  limits?: Partial<Limits>;
  /**
   * Requested file-system grants (`mount` optional). `ask` makes each change through the
   * gateway wait for an operator, `askReads` each read too (both only without `mount`).
   */
  fs?: Array<{ path: string; access: FsAccess; mount?: string; ask?: boolean; askReads?: boolean }>;
  /** Requested executables (absolute paths). */
  exec?: string[];
  /** Requested model routes. */
  routes?: RouteGrant[];
  /** Requested outbound connections (`host` required; ports default to [443]). */
  egress?: Array<Partial<EgressGrant> & { host: string }>;
  /** Requested delegation permission. */
  delegate?: Delegation;
  /** Start of validity; absent means now. */
  notBefore?: Date;
  /**
   * Programs the agent may run only through the gateway's exec tool, each command approved by
   * an operator first with `ask`; each covered by the ceiling, none also in `exec`.
   */
  gatewayExec?: Array<{ program: string; ask?: boolean }>;
  /** Seconds a call waiting for approval waits before it is denied; absent or 0 means 300 (at most 86400). */
  approvalTimeoutSeconds?: number;
  /**
   * Seconds the run's /work is kept after it ends, however it ends (for copyOut); absent or 0:
   * removed at teardown. At most the ceiling's.
   */
  workspaceKeepSeconds?: number;
}

/** A freshly minted (or fetched) receipt. */
export interface MintedReceipt {
  /** The signed envelope. */
  signed: SignedReceipt;
  /** The receipt as signed, decoded. */
  receipt: Receipt;
  /** The text form, "tgr1." + base64url of the SignedReceipt bytes: what `Supervisor.start` takes. */
  text: string;
}

/** A receipt as stored by the authority (`Authority.get`). */
export interface StoredReceipt extends MintedReceipt {
  /** Set when the receipt has been revoked. */
  revocation?: Revocation;
}

/** A recorded revocation. */
export interface Revocation {
  /** Position in the authority's revocation log. */
  seq: number;
  /** The revoked receipt's id. */
  receiptId: string;
  /** When it was revoked. */
  revokedAt?: Date;
  /** Why, as given. */
  reason: string;
  /** The operator that revoked it. */
  revokedBy: string;
  /** The receipt's own expiry. */
  receiptExpiresAt?: Date;
}

/** The outcome of `Authority.revoke`. */
export interface RevokeResult {
  /** The revocation as recorded (the earlier one when it was already revoked). */
  revocation: Revocation;
  /** True when the receipt had been revoked before this call. */
  alreadyRevoked: boolean;
}

/** One verification key of the authority. */
export interface PublicKey {
  /** Lowercase hex of the first 8 bytes of SHA-256 over `publicKey`. */
  keyId: string;
  /** The 32-byte Ed25519 public key. */
  publicKey: Buffer;
  /** When the key was generated. */
  createdAt?: Date;
  /** True for the key that signs new receipts. */
  active: boolean;
  /** For a retired key: when it stopped signing. */
  retiredAt?: Date;
  /** For a retired key: the expiry of the last receipt it signed. */
  verifyUntil?: Date;
}

/** The public keys of one authority. */
export interface KeySet {
  /** The issuer name written in its receipts. */
  issuer: string;
  /** The active key and every retired key still needed. */
  keys: PublicKey[];
}

/** Identity of a supervisor. */
export interface SupervisorInfo {
  /** Receipts must name this id in their audience. */
  supervisorId: string;
  /** key_ids of the authority keys it trusts. */
  trustedKeyIds: string[];
  /** Software version. */
  version: string;
  /** "unified", "legacy" or "hybrid". */
  cgroupMode: string;
  /** The highest revocation seq it has received. */
  lastRevocationSeq: number;
}

/** What teardown found and did. */
export interface TeardownReport {
  /** Why the run ended, in words. */
  reason: string;
  /** Milliseconds from admission to the end of teardown. */
  durationMs: number;
  /** The agent's exit code, when it exited. */
  exitCode?: number;
  /** The signal that killed the agent, when one did. */
  signal?: number;
  /** Peak memory of the run's cgroup in bytes, when known. */
  peakMemoryBytes?: number;
  /** The last gateway tool call id; empty when there was none. */
  lastToolCallId: string;
  /** Model routes the run used. */
  routesUsed: string[];
  /** Whether output beyond the receipt's output limit was dropped. */
  outputTruncated: boolean;
  /** What teardown could not clean up (empty when all went well). */
  cleanupErrors: string[];
  /** The Landlock ABI the agent ran under (0 when it never started). */
  landlockAbi: number;
  /**
   * Where the run's /work was kept on the supervisor's host (its receipt's
   * workspace_keep_seconds, whatever ended the run), for copyOut; "" when it was removed.
   */
  workspace: string;
  /** Until when it is kept (then, or at removeWorkspace, it goes); undefined when none was. */
  workspaceKeptUntil?: Date;
}

/** One run on a supervisor. */
export interface Run {
  /** The run id (= the receipt id). */
  runId: string;
  /** The receipt's owner. */
  owner: string;
  /** The agent's name. */
  subject: string;
  /** Its state. */
  state: RunState;
  /** When it was admitted. */
  createdAt?: Date;
  /** When it ended. */
  endedAt?: Date;
  /** Its receipt's expiry. */
  expiresAt?: Date;
  /** Set once it has ended. */
  report?: TeardownReport;
  /** For a delegated (child) run, the run whose gateway started it; "" otherwise. */
  parentRunId: string;
  /** Delegation depth: 0 for a run an operator started. */
  depth: number;
  /** How long its /work is kept after it ends, in seconds (0: removed at teardown). */
  workspaceKeepSeconds: number;
}

/** A child receipt minted for a run (through its gateway) and not started yet. */
export interface PendingChild {
  /** The child receipt's id (its run id once started). */
  receiptId: string;
  /** The run that asked for it. */
  parentRunId: string;
  /** The child's name. */
  subject: string;
  /** Its expiry (never after its parent's). */
  expiresAt?: Date;
}

/** A run and every run it delegated (`Supervisor.tree`). */
export interface RunTree {
  /** The run first, then its descendants in pre-order (a parent before its children). */
  runs: Run[];
  /** Child receipts minted in the tree and not started yet. */
  pending: PendingChild[];
}

/** One event of `Supervisor.watch`: output, then exactly one final `ended`. */
export type RunEvent =
  | {
      type: "output";
      /** Which stream. */
      stream: OutputStream;
      /** The bytes as the agent wrote them (chunks do not follow line boundaries). */
      data: Buffer;
    }
  | {
      type: "ended";
      /** The run as recorded after its teardown. */
      run: Run;
    };

/**
 * How a wait for an operator's approval ended: an operator approved (the call goes on) or denied
 * it (the call fails with the reason), no one decided before its deadline (denied), the agent gave
 * the call up, or its run ended (stopped, expired, revoked) while it waited.
 */
export type ApprovalOutcome = "approved" | "denied" | "timed_out" | "cancelled" | "run_ended";

/** A gateway call waiting for an operator's approval: what it would do, never its data. */
export interface PendingCall {
  /** The run that made it. */
  runId: string;
  /** The call's id: what `Supervisor.decide` names. */
  callId: string;
  /** The run's owner (the receipt's operator). */
  owner: string;
  /** The run's agent name (the receipt's subject). */
  subject: string;
  /** "fs.write", "fs.delete", "fs.read", "fs.list", "fs.stat", "exec", "egress", "model.complete" or "delegate". */
  tool: string;
  /** What it would reach: the host path (fs), the program (exec), "host:port" (egress), the route, the child's subject. */
  path: string;
  /** fs.write: bytes it would write; exec: bytes of stdin; model.complete: bytes of text that would leave. */
  bytes: number;
  /** fs.write: "WRITE_MODE_OVERWRITE", "WRITE_MODE_APPEND" or "WRITE_MODE_CREATE". */
  mode: string;
  /** When it began to wait. */
  askedAt?: Date;
  /** When it is denied unless someone decides (the receipt's approval timeout, or its expiry). */
  deadline?: Date;
  /** model.complete: the classifier's judgement of what would leave ("low", "medium", "high"). */
  sensitivity: string;
  /** model.complete: the reasons behind `sensitivity` (detector names). */
  reasons: string[];
  /** exec: the whole command line, program first. */
  argv: string[];
  /** exec: the directory in the sandbox it runs in. */
  cwd: string;
  /** exec: lowercase hex SHA-256 of the stdin it gets (what a remembered approval matches). */
  stdinSha256: string;
}

/** The end of one wait for approval. */
export interface DecidedCall {
  /** The run. */
  runId: string;
  /** The call. */
  callId: string;
  /** How the wait ended. */
  outcome: ApprovalOutcome;
  /** Who decided: an operator's name, or "admin"; empty when no one did. */
  decidedBy: string;
  /** Why, as the decider gave it (denials) or as the supervisor says (the rest). */
  reason: string;
  /** Whether later identical calls of the run (same tool and path; for exec the same argv) pass without asking. */
  remember: boolean;
}

/**
 * One event of `Supervisor.approvals`: each call waiting when the watch began (`pending`), then
 * one `caughtUp`, then each new waiting call and each end of a wait (`decided`) as it happens.
 */
export type ApprovalEvent =
  | {
      type: "pending";
      /** The waiting call. */
      call: PendingCall;
    }
  | {
      type: "decided";
      /** How its wait ended. */
      decided: DecidedCall;
    }
  | {
      /** Every call waiting when the watch began has been sent; what follows is live. */
      type: "caughtUp";
    };

/** What a live run's gateway allows after `Supervisor.narrow` or `Supervisor.amend`. */
export interface RunEnvelope {
  /** The gateway-checked fs grants now in force. */
  fs: FsGrant[];
  /** The tool-call budget now. */
  toolCalls: number;
  /** The model-token budget now (0: the run makes no model calls). */
  tokens: number;
  /** The budget of agent output relayed, in bytes, now. */
  outputBytes: number;
  /** The budget of outbound bytes, each way, now. */
  egressBytes: number;
  /** The programs the exec tool may run only through the gateway, now. */
  gatewayExec: GatewayExecGrant[];
  /** The run's expiry now. */
  expiresAt: Date;
}

/**
 * A narrowing of a live run (`Supervisor.narrow`): every field optional, none may widen. Budgets
 * are the run's in all; 0 or absent leaves one unchanged.
 */
export interface Narrowing {
  /** Host paths of gateway-only fs grants to drop, exactly as the receipt names them. */
  dropFs?: string[];
  /** The new tool-call budget; at most the current one. */
  toolCalls?: number;
  /** The new model-token budget; at most the current one (tokens used stay used). */
  tokens?: number;
  /** The new budget of agent output relayed, in bytes; at most the current one. */
  outputBytes?: number;
  /** The new budget of outbound bytes, each way; at most the current one. */
  egressBytes?: number;
  /** Gateway-only programs to take away (the exec list is the kernel's and stays). */
  dropGatewayExec?: string[];
  /** The new expiry; no later than the current one. */
  expiresAt?: Date;
}

/** What `Authority.amend` is asked to sign: a widening of one live run, within the owner's ceiling. */
export interface AmendRequest {
  /** Gateway-only fs grants to add (no mount); `ask` / `askReads` as the ceiling requires. */
  addFs?: Array<{ path: string; access: FsAccess; ask?: boolean; askReads?: boolean }>;
  /** The new tool-call budget (0 or absent: unchanged); above the receipt's. */
  toolCalls?: number;
  /** The new model-token budget (0 or absent: unchanged); above the receipt's. */
  tokens?: number;
  /** The new budget of agent output relayed, in bytes (0 or absent: unchanged); above the receipt's. */
  outputBytes?: number;
  /** The new budget of outbound bytes, each way (0 or absent: unchanged); above the receipt's. */
  egressBytes?: number;
  /** Programs the exec tool may run too, only through the gateway (`ask`: each command approved). */
  addGatewayExec?: Array<{ program: string; ask?: boolean }>;
  /** Seconds to add to the receipt's expiry, or to now once that has passed (0 or absent: unchanged). */
  extendSeconds?: number;
  /** Whether the run's delegated children may be granted what this adds too. */
  forChildren?: boolean;
}

/** The envelope of an amendment: the exact Amendment bytes and the authority's signature over them. */
export interface SignedAmendment {
  /** The exact protobuf encoding of the Amendment; passed on unchanged, never re-encoded. */
  amendment: Buffer;
  /** Which authority key signed it. */
  keyId: string;
  /** Ed25519 signature over "tollgate.amendment.v1\n" || amendment. */
  signature: Buffer;
}

/**
 * A widening of one live run the authority signed (`Authority.amend`), decoded for display, with
 * the signed envelope to hand to `Supervisor.amend` (within 5 minutes of `issuedAt`).
 */
export interface Amendment {
  /** UUID v7 of the amendment. */
  amendmentId: string;
  /** The receipt (= run) it widens. */
  receiptId: string;
  /** The authority's issuer name. */
  issuer: string;
  /** key_id of the signing key. */
  keyId: string;
  /** The receipt's owner. */
  owner: string;
  /** When the authority signed it. */
  issuedAt?: Date;
  /** Gateway-only fs grants it adds. */
  addFs: FsGrant[];
  /** The run's new tool-call budget (0: unchanged). */
  toolCalls: number;
  /** The run's new model-token budget (0: unchanged). */
  tokens: number;
  /** The run's new budget of agent output relayed, in bytes (0: unchanged). */
  outputBytes: number;
  /** The run's new budget of outbound bytes, each way (0: unchanged). */
  egressBytes: number;
  /** Programs it lets the exec tool run, only through the gateway. */
  addGatewayExec: GatewayExecGrant[];
  /** The run's new expiry (absent: unchanged). */
  expiresAt?: Date;
  /** The operator that asked for it. */
  amendedBy: string;
  /** Whether the run's delegated children may be granted it too. */
  forChildren: boolean;
  /** The signed envelope (`tollgate.v1.SignedAmendment`): what `Supervisor.amend` sends. */
  signed: SignedAmendment;
}

/** Whether `state` is final (the run has ended and been torn down). */
export function isFinal(state: RunState): boolean {
  return state !== "RUN_STATE_STARTING" && state !== "RUN_STATE_RUNNING" && state !== "RUN_STATE_UNSPECIFIED";
}
