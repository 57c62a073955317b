/**
 * `@tollgate/client`: a TypeScript client of Tollgate's daemons over gRPC.
 *
 * - {@link Authority}: mint, fetch and revoke signed run receipts; fetch the key set; sign
 *   amendments that widen a live run.
 * - {@link Supervisor}: start a run from a receipt, watch its output to the end, get, list and stop runs;
 *   watch and decide the calls waiting for an operator's approval; narrow a live run, or widen it
 *   with a signed amendment.
 * - {@link TollgateError}: how every failed call rejects (gRPC code and the server's message).
 *
 * The wire contract (proto package `tollgate.v1`, bearer-token auth, readiness files) is the
 * repository's DESIGN and `proto/tollgate/v1/*.proto`.
 */

export { Authority } from "./authority";
export { Supervisor } from "./supervisor";
export type { DecideOptions, StartOptions } from "./supervisor";
export { TollgateError } from "./errors";
export { readTokenFile, resolveAddress, tlsCredentials } from "./connection";
export type { CallOptions, ClientOptions } from "./connection";
export { defaultProtoRoot } from "./proto";
export { isFinal } from "./types";
export type * from "./types";
/** gRPC status codes, to compare with {@link TollgateError.code}. */
export { status as Status } from "@grpc/grpc-js";
