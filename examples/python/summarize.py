"""An agent for examples/run.toml: summarises its project with a local model.

It runs in a Tollgate sandbox from the project's own virtualenv, with nothing but the
standard library: the project is mounted read-only at /project, /work is its scratch space,
and the sandbox's model endpoint (OpenAI-compatible) is at $OPENAI_BASE_URL. The model keys
never enter the sandbox; the supervisor holds them and checks every call against the receipt.

Copy it into your project as agent.py, then mint and start examples/run.toml.
"""

import json
import os
import subprocess
import sys
import urllib.request

PROJECT = "/project"


def main() -> int:
    names = sorted(
        name
        for name in os.listdir(PROJECT)
        if name.endswith((".md", ".txt", ".py")) and os.path.isfile(os.path.join(PROJECT, name))
    )
    # A granted program (the receipt's [exec] lists /usr/bin/grep): lines per file.
    counted = subprocess.run(
        ["/usr/bin/grep", "-c", "", *names], cwd=PROJECT, capture_output=True, text=True, check=True
    ).stdout.split()
    text = "\n\n".join(open(os.path.join(PROJECT, name)).read()[:4000] for name in names)
    body = {
        "model": "local",
        "messages": [{"role": "user", "content": "Summarise this project in one line:\n\n" + text}],
    }
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        summary = json.load(response)["choices"][0]["message"]["content"].strip()
    with open("/work/summary.txt", "w") as out:
        out.write(summary + "\n")
    print("python:", sys.prefix)
    print("lines:", ", ".join(counted))
    print("summary:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
