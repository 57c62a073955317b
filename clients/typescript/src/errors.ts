import { Metadata, status as Status } from "@grpc/grpc-js";

/**
 * A failed call to a Tollgate daemon: the gRPC status code and the server's message.
 *
 * The daemons use the codes as documented in the proto files, e.g. UNAUTHENTICATED (missing or
 * unknown token), PERMISSION_DENIED (outside the operator's ceiling, or a receipt refused by the
 * supervisor; the message names the grant or the reason), INVALID_ARGUMENT (malformed request;
 * the message names the field), ALREADY_EXISTS (a receipt used before), NOT_FOUND,
 * UNAVAILABLE (daemon unreachable, or no sandbox slot).
 */
export class TollgateError extends Error {
  /** The gRPC status code (compare with `Status.PERMISSION_DENIED` etc.). */
  readonly code: Status;
  /** The code's name, e.g. "PERMISSION_DENIED". */
  readonly codeName: string;
  /** The server's message (gRPC status details), e.g. naming the refused grant. */
  readonly details: string;
  /** The call that failed, e.g. "Authority/MintReceipt". */
  readonly method: string;
  /** Trailing metadata the server sent with the status. */
  readonly metadata: Metadata;

  constructor(code: Status, details: string, method: string, metadata: Metadata = new Metadata(), options?: { cause?: unknown }) {
    const codeName = Status[code] ?? `CODE_${code}`;
    super(`${method}: ${codeName}: ${details}`, options);
    this.name = "TollgateError";
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.method = method;
    this.metadata = metadata;
  }

  /** Wraps whatever a gRPC call failed with (a grpc-js ServiceError or anything else). */
  static from(error: unknown, method: string): TollgateError {
    if (error instanceof TollgateError) {
      return error;
    }
    if (isServiceError(error)) {
      return new TollgateError(error.code, error.details, method, error.metadata ?? new Metadata(), { cause: error });
    }
    const details = error instanceof Error ? error.message : String(error);
    return new TollgateError(Status.UNKNOWN, details, method, new Metadata(), { cause: error });
  }
}

interface ServiceErrorLike {
  code: number;
  details: string;
  metadata?: Metadata;
}

function isServiceError(error: unknown): error is ServiceErrorLike {
  return (
    typeof error === "object" &&
    error !== null &&
    typeof (error as { code?: unknown }).code === "number" &&
    typeof (error as { details?: unknown }).details === "string"
  );
}
