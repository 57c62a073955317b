// What the Authority and Supervisor clients share: addresses, the bearer token, deadlines,
// cancellation, and turning gRPC failures into TollgateError.

import { readFileSync } from "node:fs";
import * as grpc from "@grpc/grpc-js";

import { TollgateError } from "./errors";
import { defaultProtoRoot, Method, serviceMethods } from "./proto";

/** How to reach and authenticate to a daemon. */
export interface ClientOptions {
  /**
   * The daemon's address: `host:port`, `http://host:port`, `unix:/path`, or the path of its
   * readiness file (`<data-dir>/authority.addr`, `<data-dir>/supervisor.addr`).
   */
  address: string;
  /** The bearer token, sent as `authorization: Bearer <token>`. */
  token?: string;
  /** A file holding the token (e.g. `<data-dir>/admin.token`); read once, trimmed. */
  tokenFile?: string;
  /** Channel credentials; default plaintext (`https://` addresses default to TLS). */
  credentials?: grpc.ChannelCredentials;
  /** PEM of the CA the daemon's certificate must chain to: connect with TLS (`tollgate pki init` makes one). */
  caFile?: string;
  /** This client's certificate (PEM), for a daemon that requires one; with `keyFile`. */
  certFile?: string;
  /** The private key of `certFile` (PEM). */
  keyFile?: string;
  /** Extra grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
  /** Deadline of each unary call in milliseconds unless the call says otherwise; default 30000, 0 for none. */
  timeoutMs?: number;
  /** Directory holding `tollgate/v1/*.proto`; default the copy the package was built with. */
  protoRoot?: string;
}

/** Per-call options. */
export interface CallOptions {
  /** Deadline in milliseconds; 0 for none. Unary calls default to the client's `timeoutMs`; `watch` to none. */
  timeoutMs?: number;
  /** Cancels the call (it then rejects with CANCELLED). */
  signal?: AbortSignal;
}

/**
 * Turns `host:port`, `http://host:port`, `https://host:port`, `unix:/path` or the path of a
 * daemon's `.addr` readiness file into a grpc-js target, and says whether it asked for TLS.
 */
export function resolveAddress(address: string): { target: string; tls: boolean } {
  let addr = address.trim();
  if (addr.startsWith("/") || addr.startsWith("./") || addr.endsWith(".addr")) {
    addr = readFileSync(addr, "utf8").trim();
    if (addr === "") {
      throw new Error(`address file ${address} is empty (is the daemon ready?)`);
    }
  }
  if (addr.startsWith("https://")) {
    return { target: addr.slice("https://".length).replace(/\/+$/, ""), tls: true };
  }
  if (addr.startsWith("http://")) {
    return { target: addr.slice("http://".length).replace(/\/+$/, ""), tls: false };
  }
  return { target: addr, tls: false };
}

/**
 * TLS credentials from PEM files, as the CLI's `--ca`, `--cert` and `--key` take them;
 * `undefined` when no CA is given (plaintext).
 */
export function tlsCredentials(options: Pick<ClientOptions, "caFile" | "certFile" | "keyFile">): grpc.ChannelCredentials | undefined {
  const { caFile, certFile, keyFile } = options;
  if ((certFile === undefined) !== (keyFile === undefined)) {
    throw new Error("give certFile and keyFile together");
  }
  if (caFile === undefined) {
    if (certFile !== undefined) {
      throw new Error("certFile needs caFile: a client certificate is presented over TLS");
    }
    return undefined;
  }
  const read = (what: string, file: string): Buffer => {
    try {
      return readFileSync(file);
    } catch (e) {
      throw new Error(`cannot read ${what} ${file}: ${(e as Error).message}`);
    }
  };
  return grpc.credentials.createSsl(
    read("caFile", caFile),
    keyFile !== undefined ? read("keyFile", keyFile) : null,
    certFile !== undefined ? read("certFile", certFile) : null,
  );
}

/** Reads a token file: its trimmed contents, which must not be empty. */
export function readTokenFile(file: string): string {
  const token = readFileSync(file, "utf8").trim();
  if (token === "") {
    throw new Error(`token file ${file} is empty`);
  }
  return token;
}

/** The base of the service clients. */
export abstract class DaemonClient {
  /** The grpc-js client (for advanced use: interceptors, channel state). */
  readonly grpcClient: grpc.Client;
  /** The resolved target, e.g. "127.0.0.1:7700". */
  readonly target: string;
  private readonly token: string | undefined;
  private readonly timeoutMs: number;
  protected readonly methods: Record<string, Method<unknown, unknown>>;
  private readonly service: string;

  protected constructor(service: "Authority" | "Supervisor", options: ClientOptions) {
    const { target, tls } = resolveAddress(options.address);
    this.target = target;
    this.service = service;
    this.token = options.token?.trim() || (options.tokenFile !== undefined ? readTokenFile(options.tokenFile) : undefined);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.methods = serviceMethods(options.protoRoot ?? defaultProtoRoot(), service);
    const credentials =
      options.credentials ?? tlsCredentials(options) ?? (tls ? grpc.credentials.createSsl() : grpc.credentials.createInsecure());
    this.grpcClient = new grpc.Client(target, credentials, options.channelOptions);
  }

  /** Waits until the channel is connected (rejects with UNAVAILABLE after `timeoutMs`, default 5000). */
  ready(timeoutMs = 5_000): Promise<void> {
    return new Promise((resolve, reject) => {
      this.grpcClient.waitForReady(Date.now() + timeoutMs, (error) => {
        if (error) {
          reject(new TollgateError(grpc.status.UNAVAILABLE, `${this.target} not ready: ${error.message}`, `${this.service}/connect`));
        } else {
          resolve();
        }
      });
    });
  }

  /** Closes the channel; calls in flight fail with CANCELLED or UNAVAILABLE. */
  close(): void {
    this.grpcClient.close();
  }

  private method(name: string): Method<unknown, unknown> {
    const method = this.methods[name];
    if (method === undefined) {
      throw new Error(`tollgate.v1.${this.service} has no method ${name}`);
    }
    return method;
  }

  private metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.token !== undefined) {
      metadata.set("authorization", `Bearer ${this.token}`);
    }
    return metadata;
  }

  private callOptions(timeoutMs: number): grpc.CallOptions {
    return timeoutMs > 0 ? { deadline: Date.now() + timeoutMs } : {};
  }

  /** One unary call; resolves with the decoded response or rejects with a TollgateError. */
  protected unary<Res>(name: string, request: object, options: CallOptions = {}): Promise<Res> {
    const method = this.method(name);
    const label = `${this.service}/${name}`;
    return new Promise<Res>((resolve, reject) => {
      const { signal } = options;
      if (signal?.aborted) {
        reject(new TollgateError(grpc.status.CANCELLED, "cancelled before it started", label));
        return;
      }
      let call: grpc.ClientUnaryCall | undefined;
      const onAbort = (): void => call?.cancel();
      call = this.grpcClient.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        this.metadata(),
        this.callOptions(options.timeoutMs ?? this.timeoutMs),
        (error, response) => {
          signal?.removeEventListener("abort", onAbort);
          if (error) {
            reject(TollgateError.from(error, label));
          } else {
            resolve(response as Res);
          }
        },
      );
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * A server-streaming call as an async iterator of decoded messages. Leaving the loop early
   * (break, return, throw) cancels the call.
   */
  protected async *serverStream<Res>(name: string, request: object, options: CallOptions = {}): AsyncGenerator<Res, void, undefined> {
    const method = this.method(name);
    const label = `${this.service}/${name}`;
    const { signal } = options;
    if (signal?.aborted) {
      throw new TollgateError(grpc.status.CANCELLED, "cancelled before it started", label);
    }
    const call = this.grpcClient.makeServerStreamRequest(
      method.path,
      method.requestSerialize,
      method.responseDeserialize,
      request,
      this.metadata(),
      this.callOptions(options.timeoutMs ?? 0),
    );
    const onAbort = (): void => call.cancel();
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const message of call) {
        yield message as Res;
      }
    } catch (error) {
      throw TollgateError.from(error, label);
    } finally {
      signal?.removeEventListener("abort", onAbort);
      // A consumer that stopped early: end the call; its CANCELLED status is nobody's error.
      call.on("error", () => undefined);
      call.cancel();
    }
  }
}
