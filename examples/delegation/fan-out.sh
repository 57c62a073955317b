#!/bin/sh
# Fan-out orchestrator: an agent that runs inside a Tollgate sandbox and hands each file of a
# directory to a narrower child agent of its own.
#
#   usage (as the agent): /bin/sh fan-out.sh IN OUT
#
# IN and OUT are host paths its receipt grants (IN read, OUT write, both through the gateway),
# and the receipt allows delegation ([delegate] max_depth = 1; see fan-out.toml). For every
# file in IN it asks its gateway for a child receipt that may read only that one file and
# write only into OUT, with a small share of memory, pids and cpu, and runs `wc -l` on it in a
# sandbox of its own. The children run in parallel; it waits for each, lists the tree, and
# exits 1 if any child failed. Each child's tool calls are carved from this run's budget, and
# if this run ends early, every child ends with it.
set -eu
in=$1
out=$2
ids=""
tab=$(printf '\t')
for name in $(tollgate-shim tool list "$in" | while IFS="$tab" read -r kind size mode name; do
    [ "$kind" = file ] && printf '%s\n' "$name"
done); do
    # Names go into JSON and a shell command: only plain ones.
    case $name in
        *[!A-Za-z0-9._-]*) echo "skipping $name (not a plain file name)" >&2; continue ;;
    esac
    id=$(tollgate-shim child delegate <<SPEC
{"subject": "count-$name",
 "fs": [{"path": "$in/$name", "access": "read"}, {"path": "$out", "access": "write"}],
 "exec": ["/bin/sh", "/usr/bin/wc"],
 "limits": {"memory_bytes": 67108864, "pids": 16, "cpu_millicores": 250, "tool_calls": 4},
 "agent": {"argv": ["/bin/sh", "-c",
   "tollgate-shim tool read $in/$name | /usr/bin/wc -l | tollgate-shim tool write $out/$name.lines --create"]}}
SPEC
)
    tollgate-shim child start "$id" > /dev/null
    echo "started $id for $name"
    ids="$ids $id"
done
failed=0
for id in $ids; do
    tollgate-shim child watch "$id" || { echo "child $id failed" >&2; failed=1; }
done
tollgate-shim child list
exit $failed
