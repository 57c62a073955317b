//! The scripts the coding-agent tests play (tests/tests/coding_agents.rs), one per agent,
//! each in that agent's own tool names: write `hello.txt`, run `wc -c` on it, and answer only
//! once the command's output has come back (aider: its edit format and its test command).

use serde_json::json;

use crate::scripted_models::script::{Call, ModelScript, Turn};

/// What the task writes.
pub const CONTENT: &str = "hello from the agent\n";
/// What `wc -c` says about it.
pub const COUNTED: &str = "21 hello.txt";
/// The model's final answer.
pub const FINAL: &str = "hello.txt holds 21 bytes.";

/// Claude Code's script: its `Write` and `Bash` tools, Anthropic Messages.
pub fn claude_script(project: &str) -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "Write",
                json!({"file_path": format!("{project}/hello.txt"), "content": CONTENT}),
            )]),
            Turn::calls(vec![Call::new(
                "Bash",
                json!({"command": "wc -c hello.txt", "description": "Count the bytes of hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["claude-sonnet-4-5".into(), "claude-haiku-4-5".into()],
    }
}

/// Codex CLI's script: its `exec_command` tool (it writes files with the shell too), the
/// Responses API.
pub fn codex_script() -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "exec_command",
                json!({"cmd": "printf 'hello from the agent\\n' > hello.txt"}),
            )]),
            Turn::calls(vec![Call::new(
                "exec_command",
                json!({"cmd": "wc -c hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["gpt-5-codex".into()],
    }
}

/// opencode's script: its `write` and `bash` tools, Anthropic Messages (its built-in
/// `anthropic` provider, pointed at the endpoint).
pub fn opencode_script(project: &str) -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "write",
                json!({"filePath": format!("{project}/hello.txt"), "content": CONTENT}),
            )]),
            Turn::calls(vec![Call::new(
                "bash",
                json!({"command": "wc -c hello.txt", "description": "Count the bytes of hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["claude-sonnet-4-5".into(), "claude-haiku-4-5".into()],
    }
}

/// llm's script: the two functions of examples/agents/llm-tools.py, chat completions.
pub fn llm_script() -> ModelScript {
    ModelScript {
        turns: vec![
            Turn::calls(vec![Call::new(
                "write_file",
                json!({"path": "hello.txt", "content": CONTENT}),
            )]),
            Turn::calls(vec![Call::new(
                "run_command",
                json!({"command": "wc -c hello.txt"}),
            )]),
            Turn::text(FINAL).expecting(COUNTED),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models: vec!["gpt-4o".into()],
    }
}

/// aider's script: its own edit format (SEARCH/REPLACE blocks, no tool calling) writes
/// `greet.py`; aider runs the project's test command, whose failure must come back to the
/// model; the second edit fixes it.
pub fn aider_script() -> ModelScript {
    let first = "I'll create greet.py.\n\ngreet.py\n```python\n<<<<<<< SEARCH\n=======\ndef greet(name):\n    return \"hello \" + name\n>>>>>>> REPLACE\n```\n";
    let second = "The test wants a capital and a comma.\n\ngreet.py\n```python\n<<<<<<< SEARCH\n    return \"hello \" + name\n=======\n    return f\"Hello, {name}!\"\n>>>>>>> REPLACE\n```\n";
    ModelScript {
        turns: vec![
            Turn::text(first),
            Turn::text(second).expecting("AssertionError: hello tollgate"),
        ],
        tools_required: false,
        side_reply: String::new(),
        models: vec!["gpt-4o".into()],
    }
}

/// The project aider works in: a test of `greet.py`, which does not exist yet.
pub const AIDER_TEST: &str = "from greet import greet\n\nassert greet(\"tollgate\") == \"Hello, tollgate!\", greet(\"tollgate\")\nprint(\"greeted\")\n";

/// The script of agent `name` (`claude-code`, `codex`, `opencode`, `aider`, `llm`), working in `project`
/// (the path as the agent sees it).
pub fn script(name: &str, project: &str) -> ModelScript {
    match name {
        "claude-code" => claude_script(project),
        "codex" => codex_script(),
        "opencode" => opencode_script(project),
        "aider" => aider_script(),
        "llm" => llm_script(),
        _ => panic!("no script for an agent named {name:?}"),
    }
}

/// A C project whose test fails: `add` subtracts. `make test` builds the test program with the
/// compiler and runs it from the project.
pub const C_PROJECT: [(&str, &str); 3] = [
    ("add.c", "int add(int a, int b) { return a - b; }\n"),
    (
        "test_add.c",
        "#include <stdio.h>\n\nint add(int a, int b);\n\nint main(void) {\n    int got = add(2, 3);\n    if (got != 5) {\n        printf(\"FAIL: add(2, 3) = %d\\n\", got);\n        return 1;\n    }\n    printf(\"ok: add(2, 3) = 5\\n\");\n    return 0;\n}\n",
    ),
    (
        "Makefile",
        "test: test_add\n\t./test_add\n\ntest_add: add.c test_add.c\n\tcc -o test_add add.c test_add.c\n\n.PHONY: test\n",
    ),
];
/// What the failing test prints.
pub const TEST_FAILS: &str = "FAIL: add(2, 3) = -1";
/// What the fixed test prints.
pub const TEST_PASSES: &str = "ok: add(2, 3) = 5";
/// How `add.c` ends once fixed (aider's first edit adds a comment above).
pub const FIXED_ADD: &str = "int add(int a, int b) { return a + b; }\n";
/// The model's final answer once the test passes.
pub const FIXED: &str = "add.c is fixed: make test passes.";

/// One shell command in `agent`'s own shell tool: Claude Code's `Bash`, opencode's `bash`,
/// Codex's `exec_command`, and `run` (the agents of tests/agents/).
fn shell(agent: &str, command: &str) -> Call {
    match agent {
        "claude-code" => Call::new(
            "Bash",
            json!({"command": command, "description": "Run a command"}),
        ),
        "opencode" => Call::new(
            "bash",
            json!({"command": command, "description": "Run a command"}),
        ),
        "codex" => Call::new("exec_command", json!({"cmd": command})),
        _ => Call::new("run", json!({"command": command})),
    }
}

/// The fix loop, in `agent`'s own tools: run `make test` (it fails, and its output must come
/// back), fix `add.c`, run `make test` again (it must pass), then answer. aider, which has no
/// shell tool, edits in its own format and runs the test command itself after each edit: a
/// first edit that fixes nothing, whose failing test must come back; then the fix.
pub fn fix_script(agent: &str) -> ModelScript {
    if agent == "aider" {
        let first = "I'll document add first.\n\nadd.c\n```c\n<<<<<<< SEARCH\nint add(int a, int b) { return a - b; }\n=======\n/* The sum of a and b. */\nint add(int a, int b) { return a - b; }\n>>>>>>> REPLACE\n```\n";
        let second = "The test wants a sum.\n\nadd.c\n```c\n<<<<<<< SEARCH\nint add(int a, int b) { return a - b; }\n=======\nint add(int a, int b) { return a + b; }\n>>>>>>> REPLACE\n```\n";
        return ModelScript {
            turns: vec![Turn::text(first), Turn::text(second).expecting(TEST_FAILS)],
            tools_required: false,
            side_reply: String::new(),
            models: vec!["gpt-4o".into()],
        };
    }
    let models = match agent {
        "claude-code" | "opencode" | "node" => {
            vec!["claude-sonnet-4-5".into(), "claude-haiku-4-5".into()]
        }
        "codex" => vec!["gpt-5-codex".into()],
        _ => vec!["gpt-4o".into()],
    };
    ModelScript {
        turns: vec![
            Turn::calls(vec![shell(agent, "make test")]),
            Turn::calls(vec![shell(agent, "sed -i 's/a - b/a + b/' add.c")]).expecting(TEST_FAILS),
            Turn::calls(vec![shell(agent, "make test")]),
            Turn::text(FIXED).expecting(TEST_PASSES),
        ],
        tools_required: true,
        side_reply: "ok".into(),
        models,
    }
}
