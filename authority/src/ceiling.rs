//! Request validation and operator ceilings: what an operator may ask the authority to sign.
//!
//! Validation failures are `INVALID_ARGUMENT` naming the field; anything above the ceiling is
//! `PERMISSION_DENIED` naming the grant. Both are checked before anything is signed or stored.

use tollgate_proto::v1 as pb;

use tollgate_receipt::paths::{check_mounts, is_normal_absolute, path_within};
use tollgate_receipt::spec::{access_name, sensitivity_name};

use crate::error::CallError;

/// Longest lifetime any receipt or ceiling may have (366 days). Keeps every timestamp well
/// inside protobuf's range and makes "never expires" impossible to ask for.
pub const MAX_TTL_SECONDS: u64 = 366 * 24 * 3600;

/// Latest instant a protobuf `Timestamp` may hold (9999-12-31T23:59:59Z).
const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

fn check_path(field: &str, path: &str) -> Result<(), CallError> {
    if is_normal_absolute(path) {
        Ok(())
    } else {
        Err(CallError::invalid(
            field,
            format!("{path:?} must be an absolute path without '.', '..', '//' or a trailing '/'"),
        ))
    }
}

fn check_fs_grants(fs: &[pb::FsGrant], prefix: &str) -> Result<(), CallError> {
    for (i, grant) in fs.iter().enumerate() {
        check_path(&format!("{prefix}fs[{i}].path"), &grant.path)?;
        if !matches!(
            pb::FsAccess::try_from(grant.access),
            Ok(pb::FsAccess::Read | pb::FsAccess::Write)
        ) {
            return Err(CallError::invalid(
                format!("{prefix}fs[{i}].access"),
                "must be READ or WRITE",
            ));
        }
        if !grant.mount.is_empty() {
            check_path(&format!("{prefix}fs[{i}].mount"), &grant.mount)?;
        }
    }
    Ok(())
}

fn check_routes(routes: &[pb::RouteGrant], prefix: &str) -> Result<(), CallError> {
    for (i, route) in routes.iter().enumerate() {
        if route.name.trim().is_empty()
            || route.name.len() > 128
            || route.name.chars().any(char::is_control)
        {
            return Err(CallError::invalid(
                format!("{prefix}routes[{i}].name"),
                "must be 1 to 128 characters, none of them control characters",
            ));
        }
        // "*" means "any route" in a ceiling; in a receipt it would be ambiguous.
        if prefix.is_empty() && route.name == "*" {
            return Err(CallError::invalid(
                format!("routes[{i}].name"),
                "\"*\" is a ceiling wildcard; name the route",
            ));
        }
        if !matches!(
            pb::Sensitivity::try_from(route.max_sensitivity),
            Ok(pb::Sensitivity::Low | pb::Sensitivity::Medium | pb::Sensitivity::High)
        ) {
            return Err(CallError::invalid(
                format!("{prefix}routes[{i}].max_sensitivity"),
                "must be LOW, MEDIUM or HIGH",
            ));
        }
    }
    Ok(())
}

fn check_name_list(field: &str, values: &[String]) -> Result<(), CallError> {
    for (i, value) in values.iter().enumerate() {
        if value.trim().is_empty() || value.len() > 128 {
            return Err(CallError::invalid(
                format!("{field}[{i}]"),
                "must be 1 to 128 characters",
            ));
        }
    }
    Ok(())
}

/// Mounted grants must pass the receipt crate's mount rules (the ones every supervisor
/// applies again: nothing is signed that no supervisor would start): mount targets, W^X of
/// executable grants, the `exec` list (files and directories, none beneath a writable mount
/// that is not executable: the agent would replace it) and the home.
fn check_mount_targets(request: &pb::MintReceiptRequest) -> Result<(), CallError> {
    use tollgate_receipt::paths::{check_exec_grants, check_exec_list, check_home};
    if let Err(e) = check_mounts(&request.fs) {
        return Err(CallError::invalid(e.field(), e.to_string()));
    }
    if let Err(e) = check_exec_grants(&request.fs, &request.exec) {
        return Err(CallError::invalid(e.field(), e.to_string()));
    }
    if let Err(e) = check_exec_list(&request.exec, &request.fs) {
        return Err(CallError::invalid(e.field(), e.to_string()));
    }
    // The operator's own home is refused where the spec is read (the authority does not know
    // it); everything else about a home is checked here.
    if let Err(e) = check_home(&request.home, &request.fs, None) {
        return Err(CallError::invalid("home", e.to_string()));
    }
    Ok(())
}

/// An open-file limit above what `setrlimit` accepts would sign a receipt no sandbox starts.
fn check_files(field: &str, limits: Option<&pb::Limits>) -> Result<(), CallError> {
    match limits {
        Some(limits) if limits.files > tollgate_proto::MAX_FILES => Err(CallError::invalid(
            field,
            format!("{} is above {}", limits.files, tollgate_proto::MAX_FILES),
        )),
        _ => Ok(()),
    }
}

/// Egress grants checked and completed as a receipt carries them (ports, sensitivity and
/// `inspect` filled in; see `tollgate_receipt::egress::normalise`); `prefix` names where
/// they are (`""`, `"ceiling."`).
pub fn normalised_egress(
    egress: &[pb::EgressGrant],
    prefix: &str,
    ceiling: bool,
) -> Result<Vec<pb::EgressGrant>, CallError> {
    let mut egress = egress.to_vec();
    tollgate_receipt::egress::normalise(&mut egress, prefix, ceiling)
        .map_err(|e| CallError::invalid(e.field, e.reason))?;
    Ok(egress)
}

/// Checks the shape of a mint request (not the ceiling).
pub fn validate_mint(request: &pb::MintReceiptRequest) -> Result<(), CallError> {
    if request.subject.trim().is_empty() || request.subject.len() > 128 {
        return Err(CallError::invalid("subject", "must be 1 to 128 characters"));
    }
    if request.ttl_seconds == 0 || request.ttl_seconds > MAX_TTL_SECONDS {
        return Err(CallError::invalid(
            "ttl_seconds",
            format!("must be between 1 and {MAX_TTL_SECONDS} (366 days)"),
        ));
    }
    if let Some(not_before) = &request.not_before {
        if !(0..=MAX_TIMESTAMP_SECONDS).contains(&not_before.seconds) {
            return Err(CallError::invalid("not_before", "is outside 1970..9999"));
        }
    }
    if request.audience.is_empty() {
        return Err(CallError::invalid(
            "audience",
            "must name at least one supervisor id",
        ));
    }
    check_name_list("audience", &request.audience)?;
    check_files("limits.files", request.limits.as_ref())?;
    check_fs_grants(&request.fs, "")?;
    check_mount_targets(request)?;
    tollgate_receipt::paths::check_gateway_exec(&request.gateway_exec, &request.fs, &request.exec)
        .map_err(|e| CallError::invalid(e.field(), e.to_string()))?;
    check_routes(&request.routes, "")?;
    normalised_egress(&request.egress, "", false)?;
    tollgate_receipt::paths::Rootfs::parse(&request.rootfs, &request.fs)
        .map_err(|e| CallError::invalid("rootfs", e.to_string()))?;
    if request.approval_timeout_seconds > tollgate_receipt::spec::MAX_APPROVAL_TIMEOUT.as_secs() {
        return Err(CallError::invalid(
            "approval_timeout_seconds",
            "must be at most 86400 (1 day); 0 means the default, 300",
        ));
    }
    if request.workspace_keep_seconds > tollgate_receipt::spec::MAX_WORKSPACE_KEEP.as_secs() {
        return Err(CallError::invalid(
            "workspace_keep_seconds",
            "must be at most 2592000 (30 days)",
        ));
    }
    if let Some(agent) = &request.agent {
        if !agent.workdir.is_empty() {
            check_path("agent.workdir", &agent.workdir)?;
        }
        // No argv: the command is given when the run starts (the supervisor checks it
        // against exec then); env and workdir still apply.
        let Some(program) = agent.argv.first() else {
            return Ok(());
        };
        if !tollgate_proto::exec_allows(&request.exec, program) {
            return Err(CallError::invalid(
                "agent.argv[0]",
                format!("{program:?} must also be listed in exec"),
            ));
        }
        if !tollgate_receipt::paths::executable_in_sandbox(program, &request.fs, &request.exec) {
            return Err(CallError::invalid(
                "agent.argv[0]",
                format!(
                    "{program:?} cannot run in a sandbox: only programs under {} or beneath a read grant's mount or a write grant with exec = true are executable there (other write grants, /work and /tmp are mounted noexec); mount its directory read-only, say exec = true on its write grant, or pin an interpreter, e.g. [\"/usr/bin/python3\", \"/project/agent.py\"]",
                    tollgate_receipt::paths::SYSTEM_PATHS.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Checks the shape of a ceiling given to AddOperator.
pub fn validate_ceiling(ceiling: &pb::Ceiling) -> Result<(), CallError> {
    if ceiling.max_ttl_seconds == 0 || ceiling.max_ttl_seconds > MAX_TTL_SECONDS {
        return Err(CallError::invalid(
            "ceiling.max_ttl_seconds",
            format!("must be between 1 and {MAX_TTL_SECONDS} (366 days)"),
        ));
    }
    check_fs_grants(&ceiling.fs, "ceiling.")?;
    if let Some(i) = ceiling
        .fs
        .iter()
        .position(|grant| grant.exec && grant.access != pb::FsAccess::Write as i32)
    {
        return Err(CallError::invalid(
            format!("ceiling.fs[{i}].exec"),
            "exec = true in a ceiling is only for a write entry (write grants beneath it may be executable); its exec list says where executable read grants may be mounted (an entry ending in '/' covering the mount)",
        ));
    }
    for (list, entries) in [("exec", &ceiling.exec), ("exec_ask", &ceiling.exec_ask)] {
        for (i, exec) in entries.iter().enumerate() {
            let path = exec
                .strip_suffix('/')
                .filter(|p| !p.is_empty())
                .unwrap_or(exec);
            if !is_normal_absolute(path) {
                return Err(CallError::invalid(
                    format!("ceiling.{list}[{i}]"),
                    format!("{exec:?} must be an absolute path, or a directory ending in '/'"),
                ));
            }
        }
    }
    check_routes(&ceiling.routes, "ceiling.")?;
    normalised_egress(&ceiling.egress, "ceiling.", true)?;
    check_name_list("ceiling.audience", &ceiling.audience)?;
    check_files("ceiling.limits.files", ceiling.limits.as_ref())?;
    Ok(())
}

/// Limits used for fields a request leaves at zero (before capping by the ceiling).
pub fn default_limits() -> pb::Limits {
    pb::Limits {
        memory_bytes: 512 << 20,
        pids: 64,
        cpu_millicores: 1000,
        output_bytes: 5 << 20,
        tmpfs_bytes: 64 << 20,
        tool_calls: 1000,
        tokens: 200_000,
        files: tollgate_proto::DEFAULT_FILES,
        egress_connections: tollgate_proto::DEFAULT_EGRESS_CONNECTIONS,
        egress_bytes: tollgate_proto::DEFAULT_EGRESS_BYTES,
        egress_idle_seconds: tollgate_proto::DEFAULT_EGRESS_IDLE_SECONDS,
    }
}

/// An operator's request measured against its ceiling.
pub struct CeilingCheck<'a> {
    /// The operator's name, for messages.
    pub operator: &'a str,
    /// Its ceiling.
    pub ceiling: &'a pb::Ceiling,
    /// Limits for unset fields.
    pub defaults: &'a pb::Limits,
}

impl CeilingCheck<'_> {
    fn denied(&self, grant: String) -> CallError {
        CallError::PermissionDenied(format!(
            "{grant} is above operator {:?}'s ceiling",
            self.operator
        ))
    }

    /// The receipt's limits: each requested limit must be within the ceiling; unset ones
    /// take the default capped by the ceiling.
    pub fn resolve_limits(&self, requested: Option<&pb::Limits>) -> Result<pb::Limits, CallError> {
        let requested = requested.copied().unwrap_or_default();
        let cap = self.ceiling.limits.unwrap_or_default();
        let resolve = |name: &str, asked: u64, default: u64, cap: u64| -> Result<u64, CallError> {
            if asked == 0 {
                return Ok(if cap == 0 { default } else { default.min(cap) });
            }
            if cap != 0 && asked > cap {
                return Err(self.denied(format!("limits.{name} = {asked} (ceiling {cap})")));
            }
            Ok(asked)
        };
        let d = self.defaults;
        Ok(pb::Limits {
            memory_bytes: resolve(
                "memory_bytes",
                requested.memory_bytes,
                d.memory_bytes,
                cap.memory_bytes,
            )?,
            pids: resolve(
                "pids",
                requested.pids.into(),
                d.pids.into(),
                cap.pids.into(),
            )? as u32,
            cpu_millicores: resolve(
                "cpu_millicores",
                requested.cpu_millicores.into(),
                d.cpu_millicores.into(),
                cap.cpu_millicores.into(),
            )? as u32,
            output_bytes: resolve(
                "output_bytes",
                requested.output_bytes,
                d.output_bytes,
                cap.output_bytes,
            )?,
            tmpfs_bytes: resolve(
                "tmpfs_bytes",
                requested.tmpfs_bytes,
                d.tmpfs_bytes,
                cap.tmpfs_bytes,
            )?,
            tool_calls: resolve(
                "tool_calls",
                requested.tool_calls,
                d.tool_calls,
                cap.tool_calls,
            )?,
            tokens: resolve("tokens", requested.tokens, d.tokens, cap.tokens)?,
            files: resolve(
                "files",
                requested.files.into(),
                d.files.into(),
                cap.files.into(),
            )? as u32,
            egress_connections: resolve(
                "egress_connections",
                requested.egress_connections.into(),
                d.egress_connections.into(),
                cap.egress_connections.into(),
            )? as u32,
            egress_bytes: resolve(
                "egress_bytes",
                requested.egress_bytes,
                d.egress_bytes,
                cap.egress_bytes,
            )?,
            egress_idle_seconds: resolve(
                "egress_idle_seconds",
                requested.egress_idle_seconds.into(),
                d.egress_idle_seconds.into(),
                cap.egress_idle_seconds.into(),
            )? as u32,
        })
    }

    /// Every way a (validated) request goes past the ceiling: its grants, its limits and how
    /// far ahead it starts, one line each (empty: within the ceiling).
    pub fn violations(&self, request: &pb::MintReceiptRequest, now: i64) -> Vec<String> {
        let mut found = self.grant_violations(request);
        let requested = request.limits.unwrap_or_default();
        let cap = self.ceiling.limits.unwrap_or_default();
        for (name, asked, cap) in [
            ("memory_bytes", requested.memory_bytes, cap.memory_bytes),
            ("pids", requested.pids.into(), cap.pids.into()),
            (
                "cpu_millicores",
                requested.cpu_millicores.into(),
                cap.cpu_millicores.into(),
            ),
            ("output_bytes", requested.output_bytes, cap.output_bytes),
            ("tmpfs_bytes", requested.tmpfs_bytes, cap.tmpfs_bytes),
            ("tool_calls", requested.tool_calls, cap.tool_calls),
            ("tokens", requested.tokens, cap.tokens),
            ("files", requested.files.into(), cap.files.into()),
            (
                "egress_connections",
                requested.egress_connections.into(),
                cap.egress_connections.into(),
            ),
            ("egress_bytes", requested.egress_bytes, cap.egress_bytes),
            (
                "egress_idle_seconds",
                requested.egress_idle_seconds.into(),
                cap.egress_idle_seconds.into(),
            ),
        ] {
            if asked != 0 && cap != 0 && asked > cap {
                found.push(format!("limits.{name} = {asked} (ceiling {cap})"));
            }
        }
        let not_before = request.not_before.map_or(now, |t| t.seconds.max(now));
        let max_ttl = i64::try_from(self.ceiling.max_ttl_seconds).unwrap_or(i64::MAX);
        if not_before - now > max_ttl {
            found.push(format!("not_before more than {max_ttl}s ahead"));
        }
        found
    }

    /// Every grant of a (validated) request must be covered by the ceiling.
    pub fn check_grants(&self, request: &pb::MintReceiptRequest) -> Result<(), CallError> {
        match self.grant_violations(request).into_iter().next() {
            Some(first) => Err(self.denied(first)),
            None => Ok(()),
        }
    }

    /// The grants of a (validated) request the ceiling does not cover, one line each.
    fn grant_violations(&self, request: &pb::MintReceiptRequest) -> Vec<String> {
        let mut found = Vec::new();
        let ceiling = self.ceiling;
        if request.ttl_seconds > ceiling.max_ttl_seconds {
            found.push(format!(
                "ttl_seconds = {} (ceiling {})",
                request.ttl_seconds, ceiling.max_ttl_seconds
            ));
        }
        if !ceiling.audience.is_empty() {
            for (i, audience) in request.audience.iter().enumerate() {
                if !ceiling.audience.contains(audience) {
                    found.push(format!("audience[{i}] = {audience:?}"));
                }
            }
        }
        let exec_covered = |path: &str, directory: bool| {
            ceiling
                .exec
                .iter()
                .any(|allowed| match allowed.strip_suffix('/') {
                    Some(dir) => path_within(path, if dir.is_empty() { "/" } else { dir }),
                    None => !directory && allowed == path,
                })
        };
        for (i, grant) in request.fs.iter().enumerate() {
            let covered = ceiling.fs.iter().any(|allowed| {
                path_within(&grant.path, &allowed.path) && allowed.access >= grant.access
            });
            if !covered {
                found.push(format!(
                    "fs[{i}] = {} ({})",
                    grant.path,
                    access_name(grant.access)
                ));
            } else if let Some(asking) = tollgate_receipt::paths::ask_required(grant, &ceiling.fs) {
                // The ceiling says a person approves each change there: no grant skips it.
                found.push(format!(
                    "fs[{i}] = {} without ask (the ceiling asks before changes beneath {})",
                    grant.path, asking.path
                ));
            } else if let Some(asking) =
                tollgate_receipt::paths::ask_reads_required(grant, &ceiling.fs)
            {
                found.push(format!(
                    "fs[{i}] = {} without ask_reads (the ceiling asks before reads beneath {})",
                    grant.path, asking.path
                ));
            }
            // An executable grant lets the agent load (and, for the listed programs, run)
            // anything its mount holds: the ceiling's exec list must cover the whole mount,
            // as a directory.
            if grant.is_executable(&request.exec) && !exec_covered(&grant.mount, true) {
                found.push(format!("fs[{i}].mount = {} (executable)", grant.mount));
            }
            // W^X lifted for a write grant: the operator's ceiling must say so for that host
            // path (a write entry with exec = true covering it).
            if grant.is_writable_executable()
                && !ceiling.fs.iter().any(|allowed| {
                    allowed.exec
                        && allowed.access == pb::FsAccess::Write as i32
                        && path_within(&grant.path, &allowed.path)
                })
            {
                found.push(format!(
                    "fs[{i}] = {} (write, exec = true: no ceiling write entry with exec = true covers it)",
                    grant.path
                ));
            }
        }
        if request.workspace_exec && !exec_covered("/work", true) {
            found.push("workspace.exec = true (the ceiling's exec must cover \"/work/\")".into());
        }
        // A root file system given as a path is a host directory the sandbox runs programs
        // from: the ceiling must grant it (a registered name is the supervisor admin's).
        if let Ok(tollgate_receipt::paths::Rootfs::Path(path)) =
            tollgate_receipt::paths::Rootfs::parse(&request.rootfs, &[])
        {
            if !ceiling
                .fs
                .iter()
                .any(|allowed| path_within(path, &allowed.path))
            {
                found.push(format!("rootfs = {path}"));
            }
        }
        let asks = |path: &str| {
            ceiling
                .exec_ask
                .iter()
                .any(|asking| match asking.strip_suffix('/') {
                    Some(dir) => path_within(path, if dir.is_empty() { "/" } else { dir }),
                    None => asking == path,
                })
        };
        for (i, exec) in request.exec.iter().enumerate() {
            if asks(exec) {
                // The agent would run it directly: no one could be asked.
                found.push(format!(
                    "exec[{i}] = {exec} (the ceiling asks before each run of it: grant it in gateway_exec with ask)"
                ));
            } else {
                let (path, directory) = tollgate_proto::exec_entry(exec);
                if !exec_covered(path, directory) {
                    found.push(format!("exec[{i}] = {exec}"));
                } else if let Some(asking) = ceiling.exec_ask.iter().find(|asking| {
                    // A directory entry reaches the programs beneath it, unless they are
                    // covered for the gateway's use alone.
                    let (asked, _) = tollgate_proto::exec_entry(asking);
                    directory
                        && path_within(asked, path)
                        && !request.gateway_exec.iter().any(|g| g.program == asked)
                }) {
                    found.push(format!(
                        "exec[{i}] = {exec} (it holds {asking}, which the ceiling asks before each run of: grant that in gateway_exec with ask)"
                    ));
                }
            }
        }
        for (i, grant) in request.gateway_exec.iter().enumerate() {
            let program = &grant.program;
            if asks(program) {
                if !grant.ask {
                    found.push(format!(
                        "gateway_exec[{i}] = {program} without ask (the ceiling asks before each run of it)"
                    ));
                }
            } else if !exec_covered(program, false) {
                found.push(format!("gateway_exec[{i}] = {program}"));
            }
        }
        for (i, route) in request.routes.iter().enumerate() {
            let covered = ceiling.routes.iter().any(|allowed| {
                (allowed.name == route.name || allowed.name == "*")
                    && allowed.max_sensitivity >= route.max_sensitivity
            });
            if !covered {
                found.push(format!(
                    "routes[{i}] = {} ({})",
                    route.name,
                    sensitivity_name(route.max_sensitivity)
                ));
            } else if !route.ask
                && ceiling.routes.iter().any(|allowed| {
                    allowed.ask && (allowed.name == route.name || allowed.name == "*")
                })
            {
                found.push(format!(
                    "routes[{i}] = {} without ask (the ceiling asks before each call on it)",
                    route.name
                ));
            }
        }
        // Requests are compared as a receipt would carry them (default ports filled in).
        let requested = normalised_egress(&request.egress, "", false).unwrap_or_default();
        let allowed = normalised_egress(&ceiling.egress, "ceiling.", true).unwrap_or_default();
        for (i, grant) in requested.iter().enumerate() {
            if let Err(why) = tollgate_receipt::egress::covered(grant, &allowed, true) {
                found.push(format!(
                    "{} ({why})",
                    tollgate_receipt::egress::describe(i, grant)
                ));
            }
        }
        if let Some(delegate) = &request.delegate {
            if delegate.max_depth > ceiling.max_delegate_depth {
                found.push(format!(
                    "delegate.max_depth = {} (ceiling {})",
                    delegate.max_depth, ceiling.max_delegate_depth
                ));
            }
            if ceiling.delegate_ask && delegate.max_depth > 0 && !delegate.ask {
                found.push("delegate without ask (the ceiling asks before each delegation)".into());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    mod exec;

    use super::*;

    fn ceiling() -> pb::Ceiling {
        pb::Ceiling {
            fs: vec![
                pb::FsGrant {
                    path: "/home/me".into(),
                    access: pb::FsAccess::Write as i32,
                    mount: String::new(),
                    exec: false,
                    ask: false,
                    ask_reads: false,
                },
                pb::FsGrant {
                    path: "/srv/data".into(),
                    access: pb::FsAccess::Read as i32,
                    mount: String::new(),
                    exec: false,
                    ask: false,
                    ask_reads: false,
                },
            ],
            exec: vec!["/usr/bin/python3".into(), "/opt/tools/".into()],
            routes: vec![pb::RouteGrant {
                name: "local".into(),
                max_sensitivity: pb::Sensitivity::High as i32,
                ask: false,
            }],
            limits: Some(pb::Limits {
                memory_bytes: 1 << 30,
                ..Default::default()
            }),
            max_ttl_seconds: 3600,
            audience: vec!["workstation".into()],
            max_delegate_depth: 1,
            egress: vec![pb::EgressGrant {
                host: "*.example.com".into(),
                ports: vec![443],
                max_sensitivity: pb::Sensitivity::Medium as i32,
                ..Default::default()
            }],
            delegate_ask: false,
            exec_ask: Vec::new(),
        }
    }

    fn request() -> pb::MintReceiptRequest {
        pb::MintReceiptRequest {
            subject: "agent".into(),
            ttl_seconds: 600,
            audience: vec!["workstation".into()],
            ..Default::default()
        }
    }

    fn denial(request: &pb::MintReceiptRequest) -> String {
        let ceiling = ceiling();
        let check = CeilingCheck {
            operator: "bob",
            ceiling: &ceiling,
            defaults: &default_limits(),
        };
        match check.check_grants(request) {
            Err(CallError::PermissionDenied(message)) => message,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn each_grant_above_the_ceiling_is_named() {
        let mut r = request();
        r.ttl_seconds = 7200;
        assert!(denial(&r).contains("ttl_seconds = 7200"));

        let mut r = request();
        r.audience.push("laptop".into());
        assert!(denial(&r).contains("audience[1] = \"laptop\""));

        let mut r = request();
        r.fs.push(pb::FsGrant {
            path: "/srv/data/x".into(),
            access: pb::FsAccess::Write as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        });
        assert!(denial(&r).contains("fs[0] = /srv/data/x (write)"));

        let mut r = request();
        r.fs.push(pb::FsGrant {
            path: "/home/meow".into(),
            access: pb::FsAccess::Read as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        });
        assert!(denial(&r).contains("fs[0] = /home/meow"));

        let mut r = request();
        r.exec = vec!["/opt/tools/x".into(), "/usr/bin/bash".into()];
        assert!(denial(&r).contains("exec[1] = /usr/bin/bash"));

        let mut r = request();
        r.routes.push(pb::RouteGrant {
            name: "claude".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        });
        assert!(denial(&r).contains("routes[0] = claude (low)"));

        let mut r = request();
        r.delegate = Some(pb::Delegation {
            max_depth: 2,
            ask: false,
        });
        assert!(denial(&r).contains("delegate.max_depth = 2"));

        let egress = |host: &str, ports: Vec<u32>, sensitivity: pb::Sensitivity| {
            let mut r = request();
            r.egress.push(pb::EgressGrant {
                host: host.into(),
                ports,
                max_sensitivity: sensitivity as i32,
                ..Default::default()
            });
            r
        };
        let within = egress("api.example.com", Vec::new(), pb::Sensitivity::Unspecified);
        let check = CeilingCheck {
            operator: "alice",
            ceiling: &ceiling(),
            defaults: &default_limits(),
        };
        assert!(
            check.check_grants(&within).is_ok(),
            "default port and sensitivity fit"
        );
        assert!(
            denial(&egress("example.com", vec![443], pb::Sensitivity::Low))
                .contains("egress[0] = example.com:443 (nothing grants egress to example.com)")
        );
        assert!(
            denial(&egress("api.example.com", vec![22], pb::Sensitivity::Low))
                .contains("port 22 is not among")
        );
        assert!(
            denial(&egress("api.example.com", vec![443], pb::Sensitivity::High))
                .contains("may carry text up to medium")
        );
    }

    #[test]
    fn limits_default_cap_and_deny() {
        let ceiling = ceiling();
        let defaults = pb::Limits {
            memory_bytes: 2 << 30,
            ..default_limits()
        };
        let check = CeilingCheck {
            operator: "bob",
            ceiling: &ceiling,
            defaults: &defaults,
        };
        let resolved = check.resolve_limits(None).unwrap();
        assert_eq!(
            resolved.memory_bytes,
            1 << 30,
            "default capped by the ceiling"
        );
        assert_eq!(resolved.pids, 64, "uncapped limit takes the default");
        let asked = pb::Limits {
            memory_bytes: (1 << 30) + 1,
            ..Default::default()
        };
        match check.resolve_limits(Some(&asked)) {
            Err(CallError::PermissionDenied(m)) => assert!(m.contains("limits.memory_bytes")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_requests_name_the_field() {
        let field = |r: &pb::MintReceiptRequest| match validate_mint(r) {
            Err(CallError::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut r = request();
        r.subject.clear();
        assert_eq!(field(&r), "subject");
        let mut r = request();
        r.ttl_seconds = 0;
        assert_eq!(field(&r), "ttl_seconds");
        let mut r = request();
        r.audience.clear();
        assert_eq!(field(&r), "audience");
        let mut r = request();
        r.fs.push(pb::FsGrant {
            path: "/a/../etc".into(),
            access: pb::FsAccess::Read as i32,
            mount: String::new(),
            exec: false,
            ask: false,
            ask_reads: false,
        });
        assert_eq!(field(&r), "fs[0].path");
        let mut r = request();
        r.exec.push("python3".into());
        assert_eq!(field(&r), "exec[0]");
        let mut r = request();
        r.agent = Some(pb::AgentSpec {
            argv: vec!["/usr/bin/python3".into()],
            ..Default::default()
        });
        assert_eq!(field(&r), "agent.argv[0]");
        // Listed, but where nothing can execute in a sandbox: it could never start.
        let mut r = request();
        r.exec.push("/work/agent".into());
        r.agent = Some(pb::AgentSpec {
            argv: vec!["/work/agent".into()],
            ..Default::default()
        });
        assert_eq!(field(&r), "agent.argv[0]");
        assert!(validate_mint(&r)
            .unwrap_err()
            .to_string()
            .contains("cannot run in a sandbox"));
        // No argv: the command comes at start; the env and workdir are still checked.
        let mut r = request();
        r.agent = Some(pb::AgentSpec {
            env: [("A".to_owned(), "1".to_owned())].into(),
            workdir: "/project".into(),
            ..Default::default()
        });
        validate_mint(&r).unwrap();
        r.agent.as_mut().unwrap().workdir = "project/../x".into();
        assert_eq!(field(&r), "agent.workdir");
        let mut r = request();
        r.routes.push(pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: 0,
            ask: false,
        });
        assert_eq!(field(&r), "routes[0].max_sensitivity");
        let mut r = request();
        r.routes.push(pb::RouteGrant {
            name: "*".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        });
        assert_eq!(field(&r), "routes[0].name");
        let mut r = request();
        r.ttl_seconds = MAX_TTL_SECONDS + 1;
        assert_eq!(field(&r), "ttl_seconds");
        let mut r = request();
        r.not_before = Some(prost_types::Timestamp {
            seconds: i64::MAX,
            nanos: 0,
        });
        assert_eq!(field(&r), "not_before");
    }

    fn grant(path: &str, access: pb::FsAccess, mount: &str) -> pb::FsGrant {
        pb::FsGrant {
            path: path.into(),
            access: access as i32,
            mount: mount.into(),
            exec: false,
            ask: false,
            ask_reads: false,
        }
    }

    /// The field and reason `validate_mint` refuses `r` for.
    fn reason(r: &pb::MintReceiptRequest) -> String {
        match validate_mint(r) {
            Err(CallError::InvalidArgument { field, reason }) => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mount_targets_are_checked() {
        for reserved in [
            "/",
            "/proc",
            "/dev/x",
            "/tmp",
            "/work/sub",
            "/etc",
            "/usr/lib",
            "/lib64",
        ] {
            let mut r = request();
            r.fs.push(grant("/srv", pb::FsAccess::Read, reserved));
            assert!(reason(&r).starts_with("fs[0].mount"), "{reserved}");
        }
        let mut r = request();
        r.fs.push(grant("/srv/a", pb::FsAccess::Read, "/data"));
        r.fs.push(grant("/srv/b", pb::FsAccess::Read, "/data/b"));
        assert!(reason(&r).contains("overlaps"));
        let mut r = request();
        r.exec.push("/opt/tools/run".into());
        r.fs.push(grant("/home/me", pb::FsAccess::Write, "/opt"));
        assert!(reason(&r).contains("replace exec[0]"));
        assert!(reason(&r).contains("exec = true"), "names the setting");
        // Unless the receipt says so explicitly: the write grant's exec = true.
        r.fs[0].exec = true;
        assert!(validate_mint(&r).is_ok(), "{:?}", validate_mint(&r));
        // Read-only over an executable, and disjoint mounts, are fine.
        let mut r = request();
        r.exec.push("/opt/tools/run".into());
        r.fs.push(grant("/home/me", pb::FsAccess::Read, "/opt"));
        r.fs.push(grant("/srv", pb::FsAccess::Write, "/data"));
        assert!(validate_mint(&r).is_ok());
    }

    #[test]
    fn executable_grants_keep_w_xor_x_and_stay_within_the_ceiling() {
        // A virtualenv's interpreter pinned from its read-only mount: signed.
        let venv = || {
            let mut r = request();
            r.fs.push(grant("/home/me/p", pb::FsAccess::Read, "/opt/tools"));
            r.exec.push("/opt/tools/.venv/bin/python".into());
            r.agent = Some(pb::AgentSpec {
                argv: vec!["/opt/tools/.venv/bin/python".into()],
                ..Default::default()
            });
            r
        };
        assert!(validate_mint(&venv()).is_ok());
        // The program outside every executable grant: refused, saying how to fix it.
        let mut r = venv();
        r.fs[0].mount = "/elsewhere".into();
        assert!(reason(&r).starts_with("agent.argv[0]"), "{}", reason(&r));
        // A write grant reaching the executable one, gateway-only or not.
        for path in ["/home/me", "/home/me/p/.venv/lib"] {
            let mut r = venv();
            r.fs.push(grant(path, pb::FsAccess::Write, ""));
            let why = reason(&r);
            assert!(
                why.starts_with("fs[1].path") && why.contains("W^X"),
                "{why}"
            );
        }
        // exec = true on a gateway-only grant.
        let mut r = request();
        r.fs.push(pb::FsGrant {
            exec: true,
            ..grant("/home/me/out", pb::FsAccess::Write, "")
        });
        assert!(reason(&r).starts_with("fs[0].exec"));
        // The ceiling's exec list must cover the whole executable mount, as a directory:
        // "/opt/tools/" does; a mount at /bin2 is named.
        assert!(CeilingCheck {
            operator: "bob",
            ceiling: &ceiling(),
            defaults: &default_limits(),
        }
        .check_grants(&{
            let mut r = venv();
            r.exec = vec!["/usr/bin/python3".into()];
            r.agent = None;
            r.fs[0].exec = true;
            r
        })
        .is_ok());
        let mut r = request();
        r.fs.push(pb::FsGrant {
            exec: true,
            ..grant("/home/me/bin", pb::FsAccess::Read, "/bin2")
        });
        assert!(
            denial(&r).contains("fs[0].mount = /bin2 (executable)"),
            "{}",
            denial(&r)
        );
        // A ceiling's read entries never say exec themselves.
        let mut c = ceiling();
        c.fs[1].exec = true;
        assert!(matches!(
            validate_ceiling(&c),
            Err(CallError::InvalidArgument { field, .. }) if field == "ceiling.fs[1].exec"
        ));
    }

    #[test]
    fn ceilings_are_validated() {
        let field = |c: &pb::Ceiling| match validate_ceiling(c) {
            Err(CallError::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(validate_ceiling(&ceiling()).is_ok());
        let mut c = ceiling();
        c.max_ttl_seconds = 0;
        assert_eq!(field(&c), "ceiling.max_ttl_seconds");
        c.max_ttl_seconds = u64::MAX;
        assert_eq!(field(&c), "ceiling.max_ttl_seconds");
        let mut c = ceiling();
        c.fs[0].path = "relative".into();
        assert_eq!(field(&c), "ceiling.fs[0].path");
        let mut c = ceiling();
        c.exec.push("bin/".into());
        assert_eq!(field(&c), "ceiling.exec[2]");
        let mut c = ceiling();
        c.routes[0].max_sensitivity = 0;
        assert_eq!(field(&c), "ceiling.routes[0].max_sensitivity");
    }
}
