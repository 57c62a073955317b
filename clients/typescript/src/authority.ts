import { CallOptions, ClientOptions, DaemonClient } from "./connection";
import {
  amendmentFromRaw,
  amendRequestToRaw,
  keySetFromRaw,
  mintedFromRaw,
  mintRequestToRaw,
  Raw,
  revocationFromRaw,
} from "./convert";
import type { AmendRequest, Amendment, KeySet, MintedReceipt, MintRequest, RevokeResult, StoredReceipt } from "./types";

/**
 * A client of the authority daemon (`tollgate-authority`, service `tollgate.v1.Authority`):
 * mints, fetches and revokes run receipts and serves the key set that verifies them.
 *
 * Authenticated calls need an operator token (`token` or `tokenFile`; the bootstrap admin's is
 * `<data-dir>/admin.token`). Every failure rejects with a {@link TollgateError}.
 *
 * @example
 * const authority = new Authority({ address: "127.0.0.1:7700", tokenFile: "/var/lib/tollgate/authority/admin.token" });
 * const minted = await authority.mint({ subject: "summarizer", ttlSeconds: 600, audience: ["workstation"],
 *   agent: { argv: ["/bin/sh", "-c", "echo hi"] }, exec: ["/bin/sh"] });
 * console.log(minted.receipt.receiptId, minted.text);
 */
export class Authority extends DaemonClient {
  constructor(options: ClientOptions) {
    super("Authority", options);
  }

  /**
   * Mints and signs a receipt within the calling operator's ceiling.
   *
   * Rejects with PERMISSION_DENIED when a grant, limit, ttl or audience is above the ceiling
   * (the details name it) and INVALID_ARGUMENT for a malformed request (the details name the field).
   */
  async mint(request: MintRequest, options?: CallOptions): Promise<MintedReceipt> {
    return mintedFromRaw(await this.unary<Raw>("MintReceipt", mintRequestToRaw(request), options));
  }

  /**
   * Fetches a receipt this authority minted (operators see their own, admins all), with its
   * revocation when it has been revoked. Rejects with NOT_FOUND for an unknown id.
   */
  async get(receiptId: string, options?: CallOptions): Promise<StoredReceipt> {
    const raw = await this.unary<Raw>("GetReceipt", { receiptId }, options);
    const revocation = raw.revocation as Raw | null | undefined;
    return { ...mintedFromRaw(raw), revocation: revocation ? revocationFromRaw(revocation) : undefined };
  }

  /**
   * Revokes a receipt (operators their own, admins any); idempotent. Supervisors following
   * this authority stop a live run of it and refuse to start it.
   */
  async revoke(receiptId: string, reason = "", options?: CallOptions): Promise<RevokeResult> {
    const raw = await this.unary<Raw>("RevokeReceipt", { receiptId, reason }, options);
    return { revocation: revocationFromRaw(raw.revocation as Raw | undefined), alreadyRevoked: raw.alreadyRevoked === true };
  }

  /**
   * Signs a widening of a live run (the receipt's owner, or an admin; within the owner's
   * ceiling): gateway-only fs grants, a bigger tool-call budget, a later expiry. Hand the result
   * to {@link Supervisor.amend} within 5 minutes.
   *
   * @param receiptId the receipt (= run) to widen.
   *
   * Rejects with PERMISSION_DENIED when a grant or the new lifetime is above the ceiling (the
   * details name it), FAILED_PRECONDITION for a revoked receipt, NOT_FOUND for an unknown one,
   * INVALID_ARGUMENT for a malformed request (e.g. a grant with a mount).
   */
  async amend(receiptId: string, request: AmendRequest, options?: CallOptions): Promise<Amendment> {
    return amendmentFromRaw(await this.unary<Raw>("AmendReceipt", amendRequestToRaw(receiptId, request), options));
  }

  /** The public keys that verify this authority's receipts (public: no token needed). */
  async keySet(options?: CallOptions): Promise<KeySet> {
    return keySetFromRaw(await this.unary<Raw>("GetKeySet", {}, options));
  }
}
