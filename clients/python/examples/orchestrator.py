#!/usr/bin/env python3
"""An orchestrator fanning work out to three sandboxed agents with the tollgate client.

It writes a few small input files for each agent under a data directory, mints one receipt per
agent scoped to that agent alone (a read grant on its own directory, and its own short exec
list), starts the three runs at once on the supervisor, streams their output prefixed with the
agent's name as it arrives, and prints each run's final state, exit code and duration.

Each agent reads its input through the gateway (``tollgate-shim tool read``), runs the one
tool its receipt lets it execute, and shows that it is refused a sibling's file and a sibling's
tool.

    python examples/orchestrator.py \\
        --authority /var/lib/tollgate/authority/authority.addr \\
        --authority-token-file /var/lib/tollgate/authority/admin.token \\
        --supervisor /var/lib/tollgate/supervisor/supervisor.addr \\
        --supervisor-token-file /var/lib/tollgate/supervisor/admin.token

Every option has an environment variable: TOLLGATE_AUTHORITY, TOLLGATE_AUTHORITY_TOKEN_FILE,
TOLLGATE_SUPERVISOR, TOLLGATE_SUPERVISOR_TOKEN_FILE. The supervisor must run on this host:
the grants name paths here. Exit status: 0 when every agent exited 0, 1 when one did not,
2 when the orchestration itself failed (the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from tollgate import Authority, FsGrant, MintedReceipt, OutputChunk, Run, Supervisor, TollgateError


@dataclass
class Agent:
    """One sub-agent: its name, its input files, the tool it may run, and its script."""

    name: str
    files: Dict[str, str]
    tool: str
    script: str
    run_id: str = ""
    lines: List[str] = field(default_factory=list)
    final: Optional[Run] = None
    error: str = ""
    started: float = 0.0  # time.monotonic() once the supervisor said the agent runs
    ended: float = 0.0  # time.monotonic() when the ended run arrived


SHARED_EXEC = ["/bin/sh", "/usr/bin/sleep"]

AGENTS = [
    Agent(
        name="counter",
        files={"notes.txt": "receipts are signed statements of what one run may do\n"},
        tool="/usr/bin/wc",
        script='echo "words in notes.txt: $(tollgate-shim tool read {dir}/notes.txt | /usr/bin/wc -w)"',
    ),
    Agent(
        name="sorter",
        files={"names.txt": "mallory\nalice\ncarol\nbob\n"},
        tool="/usr/bin/sort",
        script="echo \"sorted: $(tollgate-shim tool read {dir}/names.txt | /usr/bin/sort"
        " | while read -r n; do printf '%s ' \"$n\"; done)\"",
    ),
    Agent(
        name="searcher",
        files={"log.txt": "ok start\nwarn disk 91%\nok tick\nwarn temp high\n"},
        tool="/usr/bin/grep",
        script='echo "warnings in log.txt: $(tollgate-shim tool read {dir}/log.txt | /usr/bin/grep -c warn)"',
    ),
]

# Every agent: say hello, do its work, show two refusals, work a little longer (so the three
# runs visibly overlap), say goodbye.
TEMPLATE = """\
echo "hello: {name} here, with one read grant and {tool_count} executables"
{work}
if tollgate-shim tool read {sibling_file} >/dev/null 2>&1; then
  echo "read {sibling_file}: allowed?!"
else
  echo "read of a sibling's file: refused"
fi
if {sibling_tool} --version >/dev/null 2>&1; then
  echo "exec {sibling_tool}: allowed?!"
else
  echo "exec of a sibling's tool: refused"
fi
/usr/bin/sleep {pause}
echo "done"
"""


def env_default(name: str, fallback: Optional[str] = None) -> Optional[str]:
    value = os.environ.get(name, "").strip()
    return value or fallback


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--authority", default=env_default("TOLLGATE_AUTHORITY", "127.0.0.1:7700"),
                   help="authority address or authority.addr file [TOLLGATE_AUTHORITY]")
    p.add_argument("--authority-token-file", default=env_default("TOLLGATE_AUTHORITY_TOKEN_FILE"),
                   help="operator token of the authority [TOLLGATE_AUTHORITY_TOKEN_FILE]")
    p.add_argument("--supervisor", default=env_default("TOLLGATE_SUPERVISOR", "127.0.0.1:7701"),
                   help="supervisor address or supervisor.addr file [TOLLGATE_SUPERVISOR]")
    p.add_argument("--supervisor-token-file", default=env_default("TOLLGATE_SUPERVISOR_TOKEN_FILE"),
                   help="admin token of the supervisor [TOLLGATE_SUPERVISOR_TOKEN_FILE]")
    p.add_argument("--data-dir", help="where to write the agents' inputs (default: a temporary directory, removed after)")
    p.add_argument("--ttl", default="5m", help="lifetime of each receipt (default 5m)")
    p.add_argument("--pause", type=float, default=2.0, help="seconds each agent works after its task (default 2)")
    p.add_argument("--json", action="store_true", help="end with one JSON line summarising the runs")
    args = p.parse_args(argv)
    for name in ("authority_token_file", "supervisor_token_file"):
        if not getattr(args, name):
            p.error(f"--{name.replace('_', '-')} (or TOLLGATE_{name.upper()}) is required")
    return args


class Printer:
    """Prints whole lines of several agents' output, each prefixed with its agent's name."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lock = threading.Lock()
        self.partial: Dict[str, str] = {}

    def line(self, agent: Agent, stream: str, text: str) -> None:
        tag = agent.name if stream == "stdout" else f"{agent.name}!"
        with self.lock:
            agent.lines.append(text)
            print(f"[{tag:<{self.width + 1}}] {text}", flush=True)

    def chunk(self, agent: Agent, chunk: OutputChunk) -> None:
        key = f"{agent.name}/{chunk.stream}"
        text = self.partial.pop(key, "") + chunk.text
        *complete, rest = text.split("\n")
        for line in complete:
            self.line(agent, chunk.stream, line)
        if rest:
            self.partial[key] = rest

    def flush(self, agent: Agent) -> None:
        for stream in ("stdout", "stderr"):
            rest = self.partial.pop(f"{agent.name}/{stream}", "")
            if rest:
                self.line(agent, stream, rest)


def mint_for(authority: Authority, agent: Agent, data_dir: str, audience: str, args: argparse.Namespace) -> MintedReceipt:
    """A receipt for one agent: its own directory, read-only and through the gateway only,
    and its own tool."""
    own = os.path.join(data_dir, agent.name)
    siblings = [a for a in AGENTS if a is not agent]
    sibling_file = os.path.join(data_dir, siblings[0].name, next(iter(siblings[0].files)))
    script = TEMPLATE.format(
        name=agent.name,
        tool_count=len(SHARED_EXEC) + 1,
        work=agent.script.format(dir=own),
        sibling_file=sibling_file,
        sibling_tool=siblings[1].tool,
        pause=args.pause,
    )
    return authority.mint(
        agent.name,
        audience=audience,
        ttl=args.ttl,
        argv=["/bin/sh", "-c", script],
        exec=SHARED_EXEC + [agent.tool],
        fs=[FsGrant.read(own)],
        limits={"memory_bytes": "128MiB", "pids": 32, "output_bytes": "1MiB"},
    )


def run_agent(supervisor: Supervisor, agent: Agent, minted: MintedReceipt, printer: Printer, gate: threading.Barrier) -> None:
    try:
        gate.wait(timeout=30)  # start the three together
        agent.run_id = supervisor.start(minted.text)
        agent.started = time.monotonic()
        agent.final = supervisor.wait(agent.run_id, on_output=lambda c: printer.chunk(agent, c))
        agent.ended = time.monotonic()
    except (TollgateError, threading.BrokenBarrierError) as e:
        agent.error = str(e)
    finally:
        printer.flush(agent)


def seconds(run: Optional[Run]) -> Optional[float]:
    """How long the supervisor says the run took, admission to end of teardown."""
    if run is None or run.report is None:
        return None
    return run.report.duration_ms / 1000


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    made_dir = args.data_dir is None
    data_dir = os.path.abspath(args.data_dir or tempfile.mkdtemp(prefix="tollgate-orchestrator-"))
    try:
        for agent in AGENTS:
            own = os.path.join(data_dir, agent.name)
            os.makedirs(own, exist_ok=True)
            for name, content in agent.files.items():
                with open(os.path.join(own, name), "w", encoding="utf-8") as f:
                    f.write(content)

        with Authority(args.authority, token_file=args.authority_token_file) as authority, \
                Supervisor(args.supervisor, token_file=args.supervisor_token_file) as supervisor:
            audience = supervisor.info().supervisor_id
            receipts = {a.name: mint_for(authority, a, data_dir, audience, args) for a in AGENTS}
            for agent in AGENTS:
                r = receipts[agent.name].receipt
                print(f"minted {agent.name}: receipt {r.receipt_id}, read {r.fs[0].path}, exec {', '.join(r.exec)}")

            printer = Printer(max(len(a.name) for a in AGENTS))
            gate = threading.Barrier(len(AGENTS))
            threads = [
                threading.Thread(target=run_agent, args=(supervisor, a, receipts[a.name], printer, gate), name=a.name)
                for a in AGENTS
            ]
            began = time.monotonic()
            for t in threads:
                t.start()
            try:
                while any(t.is_alive() for t in threads):
                    for t in threads:
                        t.join(timeout=0.2)
            except KeyboardInterrupt:
                print("interrupted: stopping the runs", file=sys.stderr)
                for agent in AGENTS:
                    if agent.run_id:
                        try:
                            supervisor.stop(agent.run_id, "orchestrator interrupted")
                        except TollgateError as e:
                            print(f"stop {agent.name}: {e}", file=sys.stderr)
                return 130
            wall = time.monotonic() - began
    except (TollgateError, ValueError, OSError) as e:
        print(f"orchestrator: {e}", file=sys.stderr)
        return 2
    finally:
        if made_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    print()
    for agent in AGENTS:
        run = agent.final
        if run is None:
            print(f"{agent.name:<10} failed to run: {agent.error}")
            continue
        took = seconds(run)
        print(
            f"{agent.name:<10} {run.state.value:<8} exit code {run.exit_code!s:<4} "
            f"{took if took is not None else 0:5.2f} s  run {run.run_id}"
        )
    finals = [a.final for a in AGENTS if a.final is not None]
    overlap = None
    if len(finals) == len(AGENTS):
        # As seen from here: from the last agent to start running to the first run to end.
        overlap = round(min(a.ended for a in AGENTS) - max(a.started for a in AGENTS), 3)
        total = sum(seconds(r) or 0 for r in finals)
        verdict = "ran in parallel" if overlap > 0 else "did NOT overlap"
        print(f"the {len(finals)} runs {verdict}: all live together for {max(overlap, 0):.2f} s "
              f"(wall {wall:.2f} s, runs {total:.2f} s in all)")
    ok = len(finals) == len(AGENTS) and all(r.state.value == "exited" and r.exit_code == 0 for r in finals)
    if args.json:
        print(json.dumps({
            "ok": ok,
            "overlap_s": overlap,
            "wall_s": round(wall, 3),
            "agents": [
                {
                    "name": a.name,
                    "run_id": a.run_id,
                    "state": a.final.state.value if a.final else None,
                    "exit_code": a.final.exit_code if a.final else None,
                    "duration_s": seconds(a.final),
                    "reason": a.final.report.reason if a.final and a.final.report else None,
                    "lines": a.lines,
                    "error": a.error or None,
                }
                for a in AGENTS
            ],
        }, sort_keys=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
