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
