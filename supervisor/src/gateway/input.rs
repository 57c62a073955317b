//! What an agent may send and get back: every bound on a request's fields, checked once per
//! call before anything checks, uses or audits them, and the sizes of what a tool returns.

use tollgate_proto::v1 as pb;
use tollgate_proto::v1::call_tool_request::Tool;

/// Most bytes one `fs.read` returns (read on with `offset`).
pub const MAX_READ: u64 = 1 << 20;
/// Most entries one `fs.list` returns.
pub const MAX_LIST: usize = 10_000;
/// Most bytes one `fs.write` carries (one atomic change).
pub const MAX_WRITE: usize = tollgate_shim_protocol::plan::MAX_WRITE_BYTES;
/// Most bytes of stdin one `exec` carries.
pub const MAX_STDIN: usize = (4 << 20) - 4096;
/// Longest path (a host path, a `cwd`, a mount target, a workdir) an agent may send:
/// `PATH_MAX`. A longer one is refused as such, before anything looks at it.
pub const MAX_PATH: usize = 4096;
/// Most items of an argv (or of an exec list, a child's grants, its environment).
pub const MAX_ITEMS: usize = 256;
/// Most bytes of an argv (or an environment) altogether.
pub const MAX_ARGV_BYTES: usize = 64 << 10;
/// Longest name or id an agent may send (route names, run and receipt ids, a subject).
pub const MAX_NAME: usize = 256;
/// Longest free text an agent may send (a stop reason).
pub const MAX_REASON: usize = 1024;

/// The audit name of a `CallTool` request's tool (`none` when it names none).
pub fn tool_name(tool: Option<&Tool>) -> &'static str {
    match tool {
        Some(Tool::FsRead(_)) => "fs.read",
        Some(Tool::FsList(_)) => "fs.list",
        Some(Tool::FsStat(_)) => "fs.stat",
        Some(Tool::FsWrite(_)) => "fs.write",
        Some(Tool::FsDelete(_)) => "fs.delete",
        Some(Tool::Exec(_)) => "exec",
        None => "none",
    }
}

/// What an agent sends, bounded field by field before anything checks, uses or audits it.
pub trait AgentInput {
    /// The first field over its bound, as a one-line reason.
    fn bound(&self) -> Result<(), String>;
}

fn text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        return Err(format!(
            "{field} is {} bytes; at most {max} are accepted",
            value.len()
        ));
    }
    Ok(())
}

fn list<'a>(
    field: &str,
    values: impl ExactSizeIterator<Item = &'a str>,
    each: usize,
) -> Result<(), String> {
    if values.len() > MAX_ITEMS {
        return Err(format!(
            "{field} has {} items; at most {MAX_ITEMS} are accepted",
            values.len()
        ));
    }
    let mut total = 0;
    for (i, value) in values.enumerate() {
        text(&format!("{field}[{i}]"), value, each)?;
        total += value.len();
    }
    if total > MAX_ARGV_BYTES {
        return Err(format!(
            "{field} is {total} bytes in all; at most {MAX_ARGV_BYTES} are accepted"
        ));
    }
    Ok(())
}

impl AgentInput for pb::CallToolRequest {
    fn bound(&self) -> Result<(), String> {
        match &self.tool {
            Some(Tool::FsRead(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsList(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsStat(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsWrite(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::FsDelete(r)) => text("path", &r.path, MAX_PATH),
            Some(Tool::Exec(r)) => {
                list("argv", r.argv.iter().map(String::as_str), MAX_ARGV_BYTES)?;
                text("cwd", &r.cwd, MAX_PATH)
            }
            None => Ok(()),
        }
    }
}

impl AgentInput for pb::DelegateRequest {
    fn bound(&self) -> Result<(), String> {
        let Some(spec) = &self.child else {
            return Ok(());
        };
        text("child.subject", &spec.subject, MAX_NAME)?;
        if let Some(agent) = &spec.agent {
            list(
                "child.agent.argv",
                agent.argv.iter().map(String::as_str),
                MAX_ARGV_BYTES,
            )?;
            let env: Vec<&str> = agent
                .env
                .iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()])
                .collect();
            list("child.agent.env", env.into_iter(), MAX_ARGV_BYTES)?;
            text("child.agent.workdir", &agent.workdir, MAX_PATH)?;
        }
        list(
            "child.fs",
            spec.fs
                .iter()
                .flat_map(|g| [g.path.as_str(), g.mount.as_str()])
                .collect::<Vec<_>>()
                .into_iter(),
            MAX_PATH,
        )?;
        list("child.exec", spec.exec.iter().map(String::as_str), MAX_PATH)?;
        list(
            "child.routes",
            spec.routes.iter().map(|r| r.name.as_str()),
            MAX_NAME,
        )
    }
}

impl AgentInput for pb::StartChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("receipt_id", &self.receipt_id, MAX_NAME)?;
        list("argv", self.argv.iter().map(String::as_str), MAX_ARGV_BYTES)
    }
}

impl AgentInput for pb::WatchChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)
    }
}

impl AgentInput for pb::StopChildRequest {
    fn bound(&self) -> Result<(), String> {
        text("run_id", &self.run_id, MAX_NAME)?;
        text("reason", &self.reason, MAX_REASON)
    }
}

impl AgentInput for pb::CompleteRequest {
    fn bound(&self) -> Result<(), String> {
        text("route", &self.route, MAX_NAME)?;
        // Message text is bounded by the call's own limits and never audited.
        for (i, message) in self.messages.iter().enumerate() {
            text(&format!("messages[{i}].role"), &message.role, MAX_NAME)?;
        }
        Ok(())
    }
}
