// Tests of @tollgate/client against real daemons (node --test dist/test/).
//
//   TOLLGATE_AUTHORITY              authority address (host:port or its authority.addr file)
//   TOLLGATE_AUTHORITY_TOKEN_FILE   an operator token file (the authority's admin.token)
//   TOLLGATE_SUPERVISOR             supervisor address; without it the run tests are skipped
//   TOLLGATE_SUPERVISOR_TOKEN_FILE  the supervisor's admin.token
//   TOLLGATE_AUDIENCE               the supervisor's id (default "workstation")
//   TOLLGATE_CA, TOLLGATE_CERT, TOLLGATE_KEY
//                                   TLS: the daemons' CA, and this client's certificate and key
//
// tests/tests/typescript_client.rs starts the daemons and runs this file.

import assert from "node:assert/strict";
import { createHash, createPublicKey, verify } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  Authority,
  DecidedCall,
  KeySet,
  MintRequest,
  PendingCall,
  Status,
  Supervisor,
  TollgateError,
  isFinal,
} from "@tollgate/client";

const env = process.env;
const authorityAddr = env.TOLLGATE_AUTHORITY;
const authorityTokenFile = env.TOLLGATE_AUTHORITY_TOKEN_FILE ?? env.TOLLGATE_TOKEN_FILE;
const supervisorAddr = env.TOLLGATE_SUPERVISOR;
const supervisorTokenFile = env.TOLLGATE_SUPERVISOR_TOKEN_FILE;
const audience = env.TOLLGATE_AUDIENCE ?? "workstation";

const noAuthority = authorityAddr && authorityTokenFile ? false : "TOLLGATE_AUTHORITY / TOLLGATE_AUTHORITY_TOKEN_FILE not set";
const noSupervisor =
  noAuthority || (supervisorAddr && supervisorTokenFile ? false : "TOLLGATE_SUPERVISOR / TOLLGATE_SUPERVISOR_TOKEN_FILE not set");

const tls = { caFile: env.TOLLGATE_CA, certFile: env.TOLLGATE_CERT, keyFile: env.TOLLGATE_KEY };

function authority(): Authority {
  return new Authority({ address: authorityAddr ?? "", tokenFile: authorityTokenFile, ...tls });
}

function supervisor(): Supervisor {
  return new Supervisor({ address: supervisorAddr ?? "", tokenFile: supervisorTokenFile, ...tls });
}

function shSpec(subject: string, script: string): MintRequest {
  return {
    subject,
    ttlSeconds: 60,
    audience: [audience],
    agent: { argv: ["/bin/sh", "-c", script] },
    exec: ["/bin/sh", "/usr/bin/sleep"],
    limits: { memoryBytes: 64 * 1024 * 1024, pids: 16 },
  };
}

/** Whether `signature` is the key set's Ed25519 signature by `keyId` over `domain` || `bytes`. */
function signatureVerifies(keys: KeySet, keyId: string, domain: string, bytes: Buffer, signature: Buffer): boolean {
  const key = keys.keys.find((k) => k.keyId === keyId);
  assert.ok(key, `key ${keyId} not in the key set`);
  const publicKey = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: key.publicKey.toString("base64url") }, format: "jwk" });
  return verify(null, Buffer.concat([Buffer.from(domain), bytes]), publicKey, signature);
}

/** The rejection of `promise`, which must be a TollgateError. */
async function refusal(promise: Promise<unknown>): Promise<TollgateError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof TollgateError, `expected a TollgateError, got ${String(error)}`);
    return error;
  }
  assert.fail("expected the call to be refused");
}

describe("authority", { skip: noAuthority }, () => {
  test("mint returns a signed receipt that verifies with the key set", async () => {
    const client = authority();
    try {
      const minted = await client.mint({
        ...shSpec("ts-minter", "exit 0"),
        fs: [{ path: "/usr/share", access: "FS_ACCESS_READ" }],
        routes: [{ name: "local", maxSensitivity: "SENSITIVITY_HIGH" }],
        egress: [{ host: "pypi.org" }, { host: "api.example.com", ports: [8443], methods: ["GET"] }],
        delegate: { maxDepth: 1 },
      });
      const r = minted.receipt;
      assert.match(minted.text, /^tgr1\.[A-Za-z0-9_-]+$/);
      assert.match(r.receiptId, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/);
      assert.equal(r.subject, "ts-minter");
      assert.deepEqual(r.audience, [audience]);
      assert.deepEqual(r.agent?.argv, ["/bin/sh", "-c", "exit 0"]);
      assert.deepEqual(r.exec, ["/bin/sh", "/usr/bin/sleep"]);
      assert.equal(r.limits.memoryBytes, 64 * 1024 * 1024);
      assert.equal(r.limits.pids, 16);
      assert.ok(r.limits.outputBytes > 0, "unset limits take the authority's defaults");
      assert.deepEqual(r.fs, [{ path: "/usr/share", access: "FS_ACCESS_READ", mount: "", ask: false, askReads: false }]);
      assert.deepEqual(r.gatewayExec, []);
      // Unasked, the default (300 s), never past the receipt's 60 s lifetime.
      assert.ok(r.approvalTimeoutSeconds > 0 && r.approvalTimeoutSeconds <= 60, `${r.approvalTimeoutSeconds}`);
      assert.deepEqual(r.routes, [{ name: "local", maxSensitivity: "SENSITIVITY_HIGH" }]);
      assert.deepEqual(r.delegate, { maxDepth: 1 });
      assert.deepEqual(r.egress[0], {
        host: "pypi.org",
        ports: [443],
        maxSensitivity: "SENSITIVITY_LOW",
        inject: "",
        methods: [],
        paths: [],
        inspect: false,
      });
      assert.deepEqual(r.egress[1].methods, ["GET"]);
      assert.equal(r.egress[1].inspect, true);
      assert.equal(r.limits.egressConnections, 16);
      assert.equal(r.depth, 0);
      const ttl = (r.expiresAt.getTime() - r.notBefore.getTime()) / 1000;
      assert.ok(Math.abs(ttl - 60) <= 1, `ttl ${ttl}`);
      assert.equal(r.keyId, minted.signed.keyId);

      // DESIGN.md's signing rule, checked against the public key set.
      const keys = await client.keySet();
      assert.equal(keys.issuer, r.issuer);
      const key = keys.keys.find((k) => k.keyId === minted.signed.keyId);
      assert.ok(key, `key ${minted.signed.keyId} not in the key set`);
      assert.equal(key.active, true);
      assert.equal(key.publicKey.length, 32);
      assert.equal(createHash("sha256").update(key.publicKey).digest().subarray(0, 8).toString("hex"), key.keyId);
      const publicKey = createPublicKey({
        key: { kty: "OKP", crv: "Ed25519", x: key.publicKey.toString("base64url") },
        format: "jwk",
      });
      const signed = Buffer.concat([Buffer.from("tollgate.receipt.v1\n"), minted.signed.receipt]);
      assert.ok(verify(null, signed, publicKey, minted.signed.signature), "signature verifies");
      const tampered = Buffer.from(signed);
      tampered[tampered.length - 1] ^= 1;
      assert.ok(!verify(null, tampered, publicKey, minted.signed.signature), "a tampered receipt does not verify");

      const fetched = await client.get(r.receiptId);
      assert.equal(fetched.text, minted.text);
      assert.equal(fetched.revocation, undefined);
    } finally {
      client.close();
    }
  });

  test("refusals reject with TollgateError and the gRPC code", async () => {
    const client = authority();
    try {
      // Above the admin's ceiling (7 days by default) but a valid ttl: the ceiling refuses it.
      const tooLong = await refusal(client.mint({ ...shSpec("ts-refused", "exit 0"), ttlSeconds: 30 * 24 * 3600 }));
      assert.ok(
        tooLong.code === Status.PERMISSION_DENIED || tooLong.code === Status.INVALID_ARGUMENT,
        `${tooLong.codeName}: ${tooLong.details}`,
      );
      assert.match(tooLong.details, /ttl/i);
      assert.equal(tooLong.method, "Authority/MintReceipt");
      assert.match(tooLong.message, /^Authority\/MintReceipt: (PERMISSION_DENIED|INVALID_ARGUMENT): /);

      const noAudience = await refusal(client.mint({ ...shSpec("ts-refused", "exit 0"), audience: [] }));
      assert.equal(noAudience.code, Status.INVALID_ARGUMENT, noAudience.message);
      assert.equal(noAudience.codeName, "INVALID_ARGUMENT");
      assert.match(noAudience.details, /audience/);

      const notFound = await refusal(client.get("0190a0b0-0000-7000-8000-000000000000"));
      assert.equal(notFound.code, Status.NOT_FOUND, notFound.message);
    } finally {
      client.close();
    }
    const stranger = new Authority({ address: authorityAddr ?? "", token: "not-a-token", ...tls });
    try {
      const unknown = await refusal(stranger.mint(shSpec("ts-refused", "exit 0")));
      assert.equal(unknown.code, Status.UNAUTHENTICATED, unknown.message);
      // The key set is public.
      assert.ok((await stranger.keySet()).keys.length >= 1);
    } finally {
      stranger.close();
    }
  });

  test("revoke is recorded and idempotent", async () => {
    const client = authority();
    try {
      const minted = await client.mint(shSpec("ts-revoked", "exit 0"));
      const first = await client.revoke(minted.receipt.receiptId, "test");
      assert.equal(first.alreadyRevoked, false);
      assert.equal(first.revocation.receiptId, minted.receipt.receiptId);
      assert.equal(first.revocation.reason, "test");
      assert.ok(first.revocation.seq >= 1);
      const again = await client.revoke(minted.receipt.receiptId, "again");
      assert.equal(again.alreadyRevoked, true);
      assert.equal(again.revocation.seq, first.revocation.seq);
      const fetched = await client.get(minted.receipt.receiptId);
      assert.equal(fetched.revocation?.seq, first.revocation.seq);
    } finally {
      client.close();
    }
  });

  test("an unreachable daemon rejects with UNAVAILABLE", async () => {
    const client = new Authority({ address: "127.0.0.1:1", tokenFile: authorityTokenFile, timeoutMs: 5_000 });
    try {
      const error = await refusal(client.keySet());
      assert.equal(error.code, Status.UNAVAILABLE, error.message);
    } finally {
      client.close();
    }
  });
});

describe("supervisor", { skip: noSupervisor }, () => {
  test("start and watch a run to completion", async () => {
    const a = authority();
    const s = supervisor();
    try {
      const info = await s.info();
      assert.equal(info.supervisorId, audience);
      const minted = await a.mint(shSpec("ts-agent", "echo out; sleep 0.2; echo err >&2; echo more; exit 7"));
      assert.ok(info.trustedKeyIds.includes(minted.signed.keyId), "the supervisor trusts the minting key");

      const runId = await s.start(minted);
      assert.equal(runId, minted.receipt.receiptId);
      const output = { stdout: "", stderr: "" };
      let ended;
      let events = 0;
      for await (const event of s.watch(runId)) {
        events += 1;
        if (event.type === "output") {
          assert.equal(ended, undefined, "no output after the final event");
          output[event.stream] += event.data.toString("utf8");
        } else {
          ended = event.run;
        }
      }
      assert.ok(events >= 2);
      assert.deepEqual(output, { stdout: "out\nmore\n", stderr: "err\n" });
      assert.ok(ended, "watch ends with the ended run");
      assert.equal(ended.runId, runId);
      assert.equal(ended.subject, "ts-agent");
      assert.equal(ended.state, "RUN_STATE_EXITED");
      assert.equal(ended.report?.exitCode, 7);
      assert.equal(ended.report?.signal, undefined);
      assert.deepEqual(ended.report?.cleanupErrors, []);
      assert.ok(ended.endedAt instanceof Date);

      const run = await s.get(runId);
      assert.equal(run.state, "RUN_STATE_EXITED");
      assert.equal(run.report?.exitCode, 7);
      assert.ok((await s.list()).some((r) => r.runId === runId));

      // Watching an ended run replays its output and the final event.
      const replay = await s.wait(runId);
      assert.equal(replay.report?.exitCode, 7);

      // A receipt starts at most one run.
      const reused = await refusal(s.start(minted.text));
      assert.equal(reused.code, Status.ALREADY_EXISTS, reused.message);
    } finally {
      a.close();
      s.close();
    }
  });

  test("tree shows a delegated child that ends with its parent", async () => {
    const a = authority();
    const s = supervisor();
    try {
      const child = '{"subject": "ts-child", "exec": ["/usr/bin/sleep"], "agent": {"argv": ["/usr/bin/sleep", "30"]}}';
      const script =
        `echo '${child}' | tollgate-shim child delegate > /tmp/id || exit 11; ` +
        "read id < /tmp/id; tollgate-shim child start $id > /dev/null || exit 12; echo started; exec sleep 30";
      const spec = shSpec("ts-parent", script);
      const minted = await a.mint({
        ...spec,
        limits: { memoryBytes: 256 * 1024 * 1024, pids: 32, toolCalls: 20 },
        delegate: { maxDepth: 1 },
      });
      const runId = await s.start(minted);
      // "started" on stdout once the child runs (the shim notes the delegation on stderr).
      for await (const event of s.watch(runId)) {
        if (event.type === "output" && event.stream === "stdout") {
          assert.equal(event.data.toString(), "started\n");
          break;
        }
      }
      const tree = await s.tree(runId);
      assert.deepEqual(
        tree.runs.map((r) => r.depth),
        [0, 1],
      );
      const [, kid] = tree.runs;
      assert.equal(kid.parentRunId, runId);
      assert.equal(kid.state, "RUN_STATE_RUNNING");
      await s.stop(runId, "ts tree stop");
      const deadline = Date.now() + 10_000;
      let ended = await s.get(kid.runId);
      while (!isFinal(ended.state)) {
        assert.ok(Date.now() < deadline, "the child outlived its parent");
        await new Promise((resolve) => setTimeout(resolve, 20));
        ended = await s.get(kid.runId);
      }
      assert.equal(ended.state, "RUN_STATE_PARENT_ENDED");
      assert.match(ended.report?.reason ?? "", new RegExp(runId));
      const missing = await refusal(s.tree("0190a0b0-0000-7000-8000-000000000000"));
      assert.equal(missing.code, Status.NOT_FOUND, missing.message);
    } finally {
      a.close();
      s.close();
    }
  });

  test("approvals are watched and decided, and live runs amended", async () => {
    const a = authority();
    const s = supervisor();
    // Written through the gateway, as the agent's user: a fresh directory it may enter.
    const dir = mkdtempSync(join(tmpdir(), "tollgate-ts-approvals-"));
    chmodSync(dir, 0o755);
    try {
      const script =
        `printf hi | tollgate-shim tool write ${dir}/x.txt --create; echo write rc=$?; ` +
        "tollgate-shim tool exec -- /usr/bin/id -u 2>&1; echo exec rc=$?";
      const minted = await a.mint({
        ...shSpec("ts-asker", script),
        ttlSeconds: 120,
        fs: [{ path: dir, access: "FS_ACCESS_WRITE", ask: true }],
        gatewayExec: [{ program: "/usr/bin/id", ask: true }],
        approvalTimeoutSeconds: 60,
      });
      assert.deepEqual(minted.receipt.fs, [{ path: dir, access: "FS_ACCESS_WRITE", mount: "", ask: true, askReads: false }]);
      assert.deepEqual(minted.receipt.gatewayExec, [{ program: "/usr/bin/id", ask: true }]);
      assert.equal(minted.receipt.approvalTimeoutSeconds, 60);
      const runId = await s.start(minted);

      // Approve the write, deny the command; each decision comes back on the watch as well.
      const asked: PendingCall[] = [];
      const answers: DecidedCall[] = [];
      const decided: DecidedCall[] = [];
      let caughtUp = 0;
      for await (const event of s.approvals(runId, { timeoutMs: 30_000 })) {
        if (event.type === "pending") {
          asked.push(event.call);
          answers.push(
            event.call.tool === "fs.write"
              ? await s.approve(runId, event.call.callId)
              : await s.deny(runId, event.call.callId, "not this command"),
          );
        } else if (event.type === "decided") {
          decided.push(event.decided);
          if (decided.length === 2) {
            break;
          }
        } else {
          caughtUp += 1;
        }
      }
      assert.equal(caughtUp, 1, "one caughtUp, between the calls waiting then and the live ones");
      assert.deepEqual(
        asked.map((c) => [c.runId, c.subject, c.tool, c.path]),
        [
          [runId, "ts-asker", "fs.write", `${dir}/x.txt`],
          [runId, "ts-asker", "exec", "/usr/bin/id"],
        ],
      );
      const [write, exec] = asked;
      assert.equal(write.bytes, 2);
      assert.equal(write.mode, "WRITE_MODE_CREATE");
      assert.deepEqual(exec.argv, ["/usr/bin/id", "-u"]);
      assert.notEqual(write.callId, exec.callId);
      for (const call of asked) {
        assert.ok(call.askedAt instanceof Date && call.deadline instanceof Date, `${JSON.stringify(call)}`);
        const wait = (call.deadline.getTime() - call.askedAt.getTime()) / 1000;
        assert.ok(Math.abs(wait - 60) <= 1, `waits the receipt's approval timeout, not ${wait} s`);
      }
      assert.deepEqual(decided, answers, "the watch reports each decision as decide returned it");
      assert.deepEqual(
        decided.map((d) => [d.callId, d.outcome, d.decidedBy, d.remember]),
        [
          [write.callId, "approved", "admin", false],
          [exec.callId, "denied", "admin", false],
        ],
      );
      assert.equal(decided[1].reason, "not this command");

      let stdout = "";
      let ended;
      for await (const event of s.watch(runId, { timeoutMs: 30_000 })) {
        if (event.type === "output") {
          stdout += event.stream === "stdout" ? event.data.toString("utf8") : "";
        } else {
          ended = event.run;
        }
      }
      assert.match(stdout, /write rc=0\n/);
      assert.match(stdout, /not this command/, "the agent is told the reason");
      assert.match(stdout, /exec rc=1\n/);
      assert.doesNotMatch(stdout, /^\d+$/m, "the denied command never printed a uid");
      assert.equal(ended?.state, "RUN_STATE_EXITED");
      assert.equal(readFileSync(join(dir, "x.txt"), "utf8"), "hi");
      // A call decided is no longer waiting.
      const again = await refusal(s.approve(runId, write.callId));
      assert.equal(again.code, Status.NOT_FOUND, again.message);

      // A live run: narrowed without a signature, widened with the authority's.
      const [readA, readB] = [join(dir, "a"), join(dir, "b")];
      mkdirSync(readA);
      mkdirSync(readB);
      const spec = shSpec("ts-amended", "echo started; exec /usr/bin/sleep 60");
      const live = await a.mint({
        ...spec,
        ttlSeconds: 120,
        limits: { ...spec.limits, toolCalls: 100 },
        fs: [{ path: readA, access: "FS_ACCESS_READ" }],
      });
      const liveId = await s.start(live);
      const narrowed = await s.narrow(liveId, { dropFs: [readA], toolCalls: 50 });
      assert.deepEqual(narrowed.fs, []);
      assert.equal(narrowed.toolCalls, 50);
      assert.equal(narrowed.expiresAt.getTime(), live.receipt.expiresAt.getTime());
      const wider = await refusal(s.narrow(liveId, { toolCalls: 500 }));
      assert.equal(wider.code, Status.FAILED_PRECONDITION, wider.message);

      const amendment = await a.amend(liveId, {
        addFs: [{ path: readB, access: "FS_ACCESS_READ" }],
        addGatewayExec: [{ program: "/usr/bin/id", ask: true }],
        extendSeconds: 60,
      });
      assert.deepEqual(amendment.addGatewayExec, [{ program: "/usr/bin/id", ask: true }]);
      assert.equal(amendment.receiptId, liveId);
      assert.deepEqual(amendment.addFs, [{ path: readB, access: "FS_ACCESS_READ", mount: "", ask: false, askReads: false }]);
      assert.equal(amendment.toolCalls, 0);
      assert.equal(amendment.expiresAt?.getTime(), live.receipt.expiresAt.getTime() + 60_000);
      assert.equal(amendment.signed.keyId, amendment.keyId);
      const { amendment: bytes, signature } = amendment.signed;
      const keys = await a.keySet();
      assert.ok(signatureVerifies(keys, amendment.keyId, "tollgate.amendment.v1\n", bytes, signature), "the amendment verifies");
      const widened = await s.amend(liveId, amendment);
      assert.deepEqual(
        widened.fs.map((g) => [g.path, g.access, g.mount]),
        [[readB, "FS_ACCESS_READ", ""]],
      );
      assert.equal(widened.toolCalls, 50, "an amendment that names no budget leaves the narrowed one");
      assert.equal(widened.expiresAt.getTime() - narrowed.expiresAt.getTime(), 60_000);
      assert.deepEqual(widened.gatewayExec, [{ program: "/usr/bin/id", ask: true }]);
      const dropped = await s.narrow(liveId, { dropGatewayExec: ["/usr/bin/id"] });
      assert.deepEqual(dropped.gatewayExec, []);
      const stopped = await s.stop(liveId, "ts amend stop");
      assert.equal(stopped.state, "RUN_STATE_STOPPED");
    } finally {
      a.close();
      s.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("stop ends a live run; refused receipts reject with PERMISSION_DENIED", async () => {
    const a = authority();
    const s = supervisor();
    try {
      const minted = await a.mint({ ...shSpec("ts-sleeper", "echo ready; sleep 30"), workspaceKeepSeconds: 600 });
      const runId = await s.start(minted);
      // Leave the watch as soon as the agent is up: the call is cancelled, the run goes on.
      for await (const event of s.watch(runId)) {
        assert.equal(event.type, "output");
        break;
      }
      assert.equal((await s.get(runId)).state, "RUN_STATE_RUNNING");
      const stopped = await s.stop(runId, "test stop");
      assert.equal(stopped.state, "RUN_STATE_STOPPED");
      assert.match(stopped.report?.reason ?? "", /test stop/);
      // Its /work is kept (a stop is no exception), and the run says where and until when.
      assert.equal(stopped.workspaceKeepSeconds, 600);
      assert.ok(stopped.report?.workspace, "no workspace kept");
      const keptFor = (stopped.report?.workspaceKeptUntil?.getTime() ?? 0) - Date.now();
      assert.ok(keptFor > 540_000 && keptFor <= 600_000, `kept for ${keptFor} ms`);

      const wrong = await a.mint({ ...shSpec("ts-wrong-audience", "exit 0"), audience: ["elsewhere"] });
      const refused = await refusal(s.start(wrong));
      assert.equal(refused.code, Status.PERMISSION_DENIED, refused.message);
      assert.match(refused.details, /audience/);

      const garbage = await refusal(s.start("tgr1.garbage"));
      assert.equal(garbage.code, Status.INVALID_ARGUMENT, garbage.message);

      const missing = await refusal(s.get("0190a0b0-0000-7000-8000-000000000000"));
      assert.equal(missing.code, Status.NOT_FOUND, missing.message);
    } finally {
      a.close();
      s.close();
    }
  });
});
