"""A coding agent of a user's own, in Python with nothing but the standard library: it asks a
model (Chat Completions at $OPENAI_BASE_URL, the sandbox's endpoint) what to do with one tool,
`run`, which runs a shell command in the project, until the model answers in text.

Usage: python3 fix_loop.py TASK
"""

import json
import os
import subprocess
import sys
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the project; returns its exit status and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def main(task):
    messages = [{"role": "user", "content": task}]
    for _ in range(10):
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps({"model": "gpt-4o", "messages": messages, "tools": TOOLS}).encode(),
            headers={
                "content-type": "application/json",
                "authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            },
        )
        with urllib.request.urlopen(request) as response:
            reply = json.load(response)["choices"][0]["message"]
        messages.append(reply)
        if not reply.get("tool_calls"):
            print(reply["content"])
            return 0
        for call in reply["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": f"exit {done.returncode}\n{done.stdout}{done.stderr}",
                }
            )
    print("no answer after 10 turns", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
