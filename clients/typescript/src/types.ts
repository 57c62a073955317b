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
  /** Requested file-system grants (`mount` optional). */
  fs?: Array<{ path: string; access: FsAccess; mount?: string }>;
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

/** Whether `state` is final (the run has ended and been torn down). */
export function isFinal(state: RunState): boolean {
  return state !== "RUN_STATE_STARTING" && state !== "RUN_STATE_RUNNING" && state !== "RUN_STATE_UNSPECIFIED";
}
