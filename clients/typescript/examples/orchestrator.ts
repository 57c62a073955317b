// An orchestrator: mints three scoped receipts at the authority, runs the three agents in
// parallel on a supervisor, prints each agent's output prefixed with its name as it arrives,
// and each run's final state and exit code.
//
//   node dist/examples/orchestrator.js \
//     --authority 127.0.0.1:7700 --authority-token-file /var/lib/tollgate/authority/admin.token \
//     --supervisor 127.0.0.1:7701 --supervisor-token-file /var/lib/tollgate/supervisor/admin.token
//
// Each flag falls back to an environment variable: TOLLGATE_AUTHORITY,
// TOLLGATE_AUTHORITY_TOKEN_FILE (else TOLLGATE_TOKEN_FILE), TOLLGATE_SUPERVISOR,
// TOLLGATE_SUPERVISOR_TOKEN_FILE, TOLLGATE_AUDIENCE (the supervisor's id, default
// "workstation"). Addresses may also be the daemons' .addr readiness files.
//
// Exit status: 0 when every agent ran and exited by itself (whatever its own exit code),
// 1 when a run could not be minted or started or ended any other way, 2 for bad usage.

import { parseArgs } from "node:util";

import { Authority, MintRequest, Run, Supervisor, TollgateError } from "@tollgate/client";

/** One agent of the team: its name, what it runs, and the narrow receipt it gets. */
interface AgentPlan {
  name: string;
  script: string;
  exec: string[];
  limits: MintRequest["limits"];
}

// Each agent gets only the executables its script needs and its own small limits.
const TEAM: AgentPlan[] = [
  {
    name: "planner",
    script: 'echo "plan: split the work in two"; sleep 0.2; echo "plan: done"',
    exec: ["/bin/sh", "/usr/bin/sleep"],
    limits: { memoryBytes: 64 * 1024 * 1024, pids: 8, cpuMillicores: 500 },
  },
  {
    name: "coder",
    script: 'for i in 1 2 3; do echo "code: part $i"; sleep 0.1; done; echo "code: no tests yet" >&2',
    exec: ["/bin/sh", "/usr/bin/sleep"],
    limits: { memoryBytes: 128 * 1024 * 1024, pids: 16, cpuMillicores: 1000 },
  },
  {
    name: "reviewer",
    script: 'echo "review: 2 findings"; exit 3',
    exec: ["/bin/sh"],
    limits: { memoryBytes: 64 * 1024 * 1024, pids: 4, cpuMillicores: 250 },
  },
];

function usage(message: string): never {
  console.error(`orchestrator: ${message}`);
  console.error(
    "usage: orchestrator --authority ADDR --authority-token-file PATH --supervisor ADDR --supervisor-token-file PATH [--audience ID] [--ttl SECONDS]",
  );
  process.exit(2);
}

function settings(): {
  authority: string;
  authorityTokenFile: string;
  supervisor: string;
  supervisorTokenFile: string;
  audience: string;
  ttl: number;
} {
  const { values } = parseArgs({
    options: {
      authority: { type: "string" },
      "authority-token-file": { type: "string" },
      supervisor: { type: "string" },
      "supervisor-token-file": { type: "string" },
      audience: { type: "string" },
      ttl: { type: "string" },
    },
  });
  const env = process.env;
  const required = (value: string | undefined, what: string): string => value || usage(`missing ${what}`);
  const ttl = Number(values.ttl ?? "120");
  if (!Number.isInteger(ttl) || ttl <= 0) {
    usage(`--ttl must be a positive number of seconds, not ${values.ttl}`);
  }
  return {
    authority: required(values.authority ?? env.TOLLGATE_AUTHORITY, "--authority (or TOLLGATE_AUTHORITY)"),
    authorityTokenFile: required(
      values["authority-token-file"] ?? env.TOLLGATE_AUTHORITY_TOKEN_FILE ?? env.TOLLGATE_TOKEN_FILE,
      "--authority-token-file (or TOLLGATE_AUTHORITY_TOKEN_FILE)",
    ),
    supervisor: required(values.supervisor ?? env.TOLLGATE_SUPERVISOR, "--supervisor (or TOLLGATE_SUPERVISOR)"),
    supervisorTokenFile: required(
      values["supervisor-token-file"] ?? env.TOLLGATE_SUPERVISOR_TOKEN_FILE,
      "--supervisor-token-file (or TOLLGATE_SUPERVISOR_TOKEN_FILE)",
    ),
    audience: values.audience ?? env.TOLLGATE_AUDIENCE ?? "workstation",
    ttl,
  };
}

/** Prints a stream's output line by line, each line prefixed; holds back a partial line. */
class Prefixer {
  private pending = "";

  constructor(
    private readonly prefix: string,
    private readonly out: NodeJS.WriteStream,
  ) {}

  write(data: Buffer): void {
    const lines = (this.pending + data.toString("utf8")).split("\n");
    this.pending = lines.pop() ?? "";
    for (const line of lines) {
      this.out.write(`${this.prefix} ${line}\n`);
    }
  }

  flush(): void {
    if (this.pending !== "") {
      this.out.write(`${this.prefix} ${this.pending}\n`);
      this.pending = "";
    }
  }
}

/** Runs one agent: start its receipt, stream its output, resolve with the ended run. */
async function runAgent(supervisor: Supervisor, name: string, receiptText: string): Promise<Run> {
  const runId = await supervisor.start(receiptText);
  console.log(`[${name}] started run ${runId}`);
  const stdout = new Prefixer(`[${name}]`, process.stdout);
  const stderr = new Prefixer(`[${name}:stderr]`, process.stderr);
  for await (const event of supervisor.watch(runId)) {
    if (event.type === "output") {
      (event.stream === "stderr" ? stderr : stdout).write(event.data);
    } else {
      stdout.flush();
      stderr.flush();
      return event.run;
    }
  }
  throw new Error("unreachable: watch ends with the ended run");
}

async function main(): Promise<number> {
  const config = settings();
  const authority = new Authority({ address: config.authority, tokenFile: config.authorityTokenFile });
  const supervisor = new Supervisor({ address: config.supervisor, tokenFile: config.supervisorTokenFile });
  try {
    // 1. Mint one narrow receipt per agent: its own command, executables, limits and a short ttl.
    const minted = await Promise.all(
      TEAM.map((agent) =>
        authority.mint({
          subject: agent.name,
          ttlSeconds: config.ttl,
          audience: [config.audience],
          agent: { argv: ["/bin/sh", "-c", agent.script] },
          exec: agent.exec,
          limits: agent.limits,
        }),
      ),
    );
    for (const [i, receipt] of minted.entries()) {
      const r = receipt.receipt;
      console.log(
        `[${TEAM[i].name}] minted receipt ${r.receiptId}: exec ${r.exec.join(",")}, memory ${r.limits.memoryBytes} B, pids ${r.limits.pids}, expires ${r.expiresAt.toISOString()}`,
      );
    }

    // 2. Run the three agents in parallel; one failing to start does not stop the others.
    const outcomes = await Promise.allSettled(minted.map((m, i) => runAgent(supervisor, TEAM[i].name, m.text)));

    // 3. Report.
    let ok = true;
    for (const [i, outcome] of outcomes.entries()) {
      const name = TEAM[i].name;
      if (outcome.status === "rejected") {
        ok = false;
        const error = outcome.reason;
        console.log(`[${name}] failed: ${error instanceof TollgateError ? `${error.codeName}: ${error.details}` : String(error)}`);
        continue;
      }
      const run = outcome.value;
      const exitCode = run.report?.exitCode;
      ok &&= run.state === "RUN_STATE_EXITED";
      console.log(
        `[${name}] ended: state=${run.state.replace("RUN_STATE_", "")} exit_code=${exitCode ?? "none"} duration_ms=${run.report?.durationMs ?? 0}`,
      );
    }
    return ok ? 0 : 1;
  } finally {
    authority.close();
    supervisor.close();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(`orchestrator: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  },
);
