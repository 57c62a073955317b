# Tools for `llm --functions examples/agents/llm-tools.py` (examples/agents/llm.toml): the two
# an agent needs to change a project — write a file, run a command — as plain functions. llm
# declares them to the model from their signatures and docstrings and runs the calls it makes.
import subprocess


def write_file(path: str, content: str) -> str:
    """Write content to the file at path (relative to the working directory), replacing it."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(content)
    return f"wrote {len(content.encode())} bytes to {path}"


def run_command(command: str) -> str:
    """Run a shell command in the working directory; returns its exit status and output."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"
