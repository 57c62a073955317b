#!/bin/bash
# A coding agent of a user's own, in bash with curl and jq: it asks a model (Chat Completions
# at $OPENAI_BASE_URL, the sandbox's endpoint) what to do with one tool, `run`, which runs a
# shell command in the project, until the model answers in text.
#
# Usage: bash fix_loop.sh TASK
set -eu

tools='[{"type": "function", "function": {"name": "run",
  "description": "Run a shell command in the project; returns its exit status and output.",
  "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                 "required": ["command"]}}}]'
messages=$(jq -n --arg task "$1" '[{role: "user", content: $task}]')

for _ in 1 2 3 4 5 6 7 8 9 10; do
  reply=$(jq -n --argjson m "$messages" --argjson t "$tools" \
      '{model: "gpt-4o", messages: $m, tools: $t}' |
    curl -sS --fail-with-body -H 'content-type: application/json' \
      -H "authorization: Bearer $OPENAI_API_KEY" --data-binary @- \
      "$OPENAI_BASE_URL/chat/completions" |
    jq '.choices[0].message')
  messages=$(jq --argjson r "$reply" '. + [$r]' <<<"$messages")
  calls=$(jq '.tool_calls // [] | length' <<<"$reply")
  if [ "$calls" = 0 ]; then
    jq -r '.content' <<<"$reply"
    exit 0
  fi
  for i in $(seq 0 $((calls - 1))); do
    id=$(jq -r ".tool_calls[$i].id" <<<"$reply")
    command=$(jq -r ".tool_calls[$i].function.arguments | fromjson | .command" <<<"$reply")
    status=0
    output=$(/bin/sh -c "$command" 2>&1) || status=$?
    messages=$(jq --arg id "$id" --arg out "exit $status
$output" '. + [{role: "tool", tool_call_id: $id, content: $out}]' <<<"$messages")
  done
done
echo "no answer after 10 turns" >&2
exit 1
