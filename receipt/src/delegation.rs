//! Delegation's one rule: a child receipt is never wider and never longer than its parent.
//!
//! [`check_within`] compares a child receipt (as it would be minted) with its parent, grant by
//! grant: every fs grant lies beneath a parent grant giving at least its access; every
//! executable is in the parent's exec list; a child mount that covers one of its executables
//! is exactly one of the parent's (path, mount) pairs, so no other binary can appear behind an
//! allowed name; every route is granted by the parent for at least its sensitivity; each limit
//! is at most the parent's; it expires no later than the parent; and it may delegate fewer
//! levels than its parent. The first wider grant is named in the refusal. Pure: the authority
//! runs it before minting a child, the supervisor again before starting one.

use std::fmt;

use tollgate_proto::v1 as pb;

use crate::paths::path_within;

/// The first grant of a child that its parent does not cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wider {
    /// The parent receipt.
    pub parent_id: String,
    /// The child's grant, as `fs[1] = /home/me/p/out (write)`.
    pub grant: String,
    /// Why the parent does not cover it.
    pub detail: String,
}

impl fmt::Display for Wider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is above parent receipt {}'s grants ({})",
            self.grant, self.parent_id, self.detail
        )
    }
}

impl std::error::Error for Wider {}

fn access_name(access: i32) -> &'static str {
    match pb::FsAccess::try_from(access) {
        Ok(pb::FsAccess::Read) => "read",
        Ok(pb::FsAccess::Write) => "write",
        _ => "no access",
    }
}

fn sensitivity_name(sensitivity: i32) -> &'static str {
    match pb::Sensitivity::try_from(sensitivity) {
        Ok(pb::Sensitivity::Low) => "low",
        Ok(pb::Sensitivity::Medium) => "medium",
        Ok(pb::Sensitivity::High) => "high",
        _ => "nothing",
    }
}

/// Whether `child` is within `parent` (see the module docs); the first grant that is not.
pub fn check_within(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), Wider> {
    let checks = [
        check_fs,
        check_exec,
        check_exec_sources,
        check_routes,
        check_limits,
        check_window,
        check_depth,
        check_rootfs,
        check_egress,
    ];
    for check in checks {
        check(parent, child).map_err(|(grant, detail)| Wider {
            parent_id: parent.receipt_id.clone(),
            grant,
            detail,
        })?;
    }
    Ok(())
}

/// Every fs grant lies beneath one of the parent's, with no more access, and is mounted only
/// where the parent's is.
fn check_fs(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    for (i, grant) in child.fs.iter().enumerate() {
        let name = format!("fs[{i}] = {} ({})", grant.path, access_name(grant.access));
        let covering: Vec<&pb::FsGrant> = parent
            .fs
            .iter()
            .filter(|p| path_within(&grant.path, &p.path))
            .collect();
        if covering.is_empty() {
            return Err((name, "no parent fs grant covers it".into()));
        }
        // Unspecified access never counts as granted.
        let enough = covering
            .iter()
            .any(|p| p.access >= grant.access && grant.access > 0 && p.access > 0);
        if !enough {
            let best = covering
                .iter()
                .max_by_key(|p| p.access)
                .map_or_else(String::new, |p| {
                    format!("{} is granted {}", p.path, access_name(p.access))
                });
            return Err((name, best));
        }
        // A mount gives the agent the kernel's direct access, past the gateway's per-call
        // checks, counts and audit: only a parent that has it itself may hand it on.
        let mounted = covering
            .iter()
            .any(|p| !p.mount.is_empty() && p.access >= grant.access);
        // A change the parent must ask for, the child must ask for too.
        if let Some(asking) = crate::paths::ask_required(grant, &parent.fs) {
            return Err((
                format!("fs[{i}].ask = false"),
                format!(
                    "the parent asks an operator before changing files beneath {}",
                    asking.path
                ),
            ));
        }
        if let Some(asking) = crate::paths::ask_reads_required(grant, &parent.fs) {
            return Err((
                format!("fs[{i}].ask_reads = false"),
                format!(
                    "the parent asks an operator before reading files beneath {}",
                    asking.path
                ),
            ));
        }
        if !grant.mount.is_empty() && !mounted {
            return Err((
                format!("fs[{i}].mount = {}", grant.mount),
                format!(
                    "the parent reaches {} through the gateway only (no mount)",
                    grant.path
                ),
            ));
        }
    }
    Ok(())
}

/// Every egress grant lies within one of the parent's (see [`crate::egress::within`]).
fn check_egress(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    for (i, grant) in child.egress.iter().enumerate() {
        crate::egress::covered(grant, &parent.egress, false)
            .map_err(|why| (crate::egress::describe(i, grant), why))?;
    }
    Ok(())
}

/// A child runs on its parent's userland.
fn check_rootfs(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    if child.rootfs == parent.rootfs {
        return Ok(());
    }
    Err((
        format!("rootfs = {:?}", child.rootfs),
        format!("the parent runs on {:?}", parent.rootfs),
    ))
}

/// Every program is in the parent's exec list; every gateway-only program in its exec list
/// or its own gateway-only grants, asking where the parent's grant of it asks (and never in
/// the child's exec list where the parent runs it only through the gateway).
fn check_exec(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    for (i, program) in child.exec.iter().enumerate() {
        // A file the parent lists or holds beneath a directory entry; a directory the
        // parent lists, or one beneath a directory entry of its.
        let covered = parent.exec.iter().any(|p| p == program)
            || match tollgate_proto::exec_entry(program) {
                (dir, true) => parent.exec.iter().any(|p| {
                    let (parent_path, parent_dir) = tollgate_proto::exec_entry(p);
                    parent_dir && path_within(dir, parent_path)
                }),
                (file, false) => tollgate_proto::exec_allows(&parent.exec, file),
            };
        if !covered {
            return Err((
                format!("exec[{i}] = {program}"),
                "not in its exec list".into(),
            ));
        }
    }
    for (i, grant) in child.gateway_exec.iter().enumerate() {
        let program = &grant.program;
        if parent.exec.contains(program) {
            continue;
        }
        match parent.gateway_exec.iter().find(|p| p.program == *program) {
            None => {
                return Err((
                    format!("gateway_exec[{i}] = {program}"),
                    "not in its exec list or gateway_exec".into(),
                ))
            }
            Some(asking) if asking.ask && !grant.ask => {
                return Err((
                    format!("gateway_exec[{i}].ask = false"),
                    format!("the parent asks an operator before each run of {program}"),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A mount that covers a granted program, or is executable for another reason, is exactly
/// one of the parent's executable mounts (same source, same place): the child runs and loads
/// what the parent was granted to, not another file at that path.
fn check_exec_sources(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    for (i, grant) in child.fs.iter().enumerate() {
        if !grant.is_executable(&child.exec) {
            continue;
        }
        let same = parent.fs.iter().any(|p| {
            p.path == grant.path && p.mount == grant.mount && p.is_executable(&parent.exec)
        });
        if !same {
            let program = child
                .exec
                .iter()
                .find(|program| path_within(program, &grant.mount));
            return Err((
                format!("fs[{i}].mount = {}", grant.mount),
                match program {
                    Some(program) => format!(
                        "it covers exec {program}, which the parent runs from another source"
                    ),
                    None => "it is executable, and the parent's mount of it is not".into(),
                },
            ));
        }
    }
    Ok(())
}

/// Every route is the parent's, for text no more sensitive.
fn check_routes(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    for (i, route) in child.routes.iter().enumerate() {
        let name = format!("routes[{i}] = {}", route.name);
        match parent.routes.iter().find(|p| p.name == route.name) {
            None => return Err((name, "route not granted".into())),
            Some(p)
                if p.max_sensitivity < route.max_sensitivity
                    || p.max_sensitivity == 0
                    || route.max_sensitivity == 0 =>
            {
                return Err((
                    format!("{name} up to {}", sensitivity_name(route.max_sensitivity)),
                    format!(
                        "{} is granted up to {}",
                        p.name,
                        sensitivity_name(p.max_sensitivity)
                    ),
                ))
            }
            Some(p) if p.ask && !route.ask => {
                return Err((
                    format!("{name} without ask"),
                    format!("the parent asks an operator before each call on {}", p.name),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// No limit is above the parent's.
fn check_limits(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    let (p, c) = (
        parent.limits.unwrap_or_default(),
        child.limits.unwrap_or_default(),
    );
    let limits = [
        ("memory_bytes", c.memory_bytes, p.memory_bytes),
        ("pids", c.pids.into(), p.pids.into()),
        (
            "cpu_millicores",
            c.cpu_millicores.into(),
            p.cpu_millicores.into(),
        ),
        ("output_bytes", c.output_bytes, p.output_bytes),
        ("tmpfs_bytes", c.tmpfs_bytes, p.tmpfs_bytes),
        ("tool_calls", c.tool_calls, p.tool_calls),
        ("tokens", c.tokens, p.tokens),
        // 0 is the default: compare what each sandbox gets.
        (
            "files",
            tollgate_proto::effective_files(c.files).into(),
            tollgate_proto::effective_files(p.files).into(),
        ),
        (
            "egress_connections",
            tollgate_proto::effective_egress(&c).0.into(),
            tollgate_proto::effective_egress(&p).0.into(),
        ),
        (
            "egress_bytes",
            tollgate_proto::effective_egress(&c).1,
            tollgate_proto::effective_egress(&p).1,
        ),
        (
            "egress_idle_seconds",
            tollgate_proto::effective_egress(&c).2.into(),
            tollgate_proto::effective_egress(&p).2.into(),
        ),
    ];
    for (name, child_value, parent_value) in limits {
        if child_value > parent_value {
            return Err((
                format!("limits.{name} = {child_value}"),
                format!("{parent_value}"),
            ));
        }
    }
    Ok(())
}

/// Valid no earlier and no longer than the parent.
fn check_window(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    let start = |r: &pb::Receipt| {
        r.not_before
            .as_ref()
            .map_or((0, 0), |t| (t.seconds, t.nanos))
    };
    if start(child) < start(parent) {
        return Err((
            format!("not_before = {}", crate::rfc3339(start(child).0)),
            format!("it is valid from {}", crate::rfc3339(start(parent).0)),
        ));
    }
    let expiry = |r: &pb::Receipt| r.expires_at.as_ref().map_or(0, |t| t.seconds);
    let expiry_ns = |r: &pb::Receipt| {
        r.expires_at
            .as_ref()
            .map_or((0, 0), |t| (t.seconds, t.nanos))
    };
    if expiry_ns(child) > expiry_ns(parent) {
        return Err((
            format!("expires_at = {}", crate::rfc3339(expiry(child))),
            format!("it expires at {}", crate::rfc3339(expiry(parent))),
        ));
    }
    Ok(())
}

/// The parent may delegate, and the child fewer levels than it.
fn check_depth(parent: &pb::Receipt, child: &pb::Receipt) -> Result<(), (String, String)> {
    let asks = |r: &pb::Receipt| r.delegate.is_some_and(|d| d.ask);
    if asks(parent) && child.delegate.is_some_and(|d| d.max_depth > 0) && !asks(child) {
        return Err((
            "delegate.ask = false".into(),
            "the parent asks an operator before each delegation; so must the child".into(),
        ));
    }
    let parent_depth = parent.delegate.as_ref().map_or(0, |d| d.max_depth);
    if parent_depth == 0 {
        return Err((
            "a child receipt".into(),
            "delegate.max_depth = 0: it may not delegate".into(),
        ));
    }
    let child_depth = child.delegate.as_ref().map_or(0, |d| d.max_depth);
    if child_depth > parent_depth - 1 {
        return Err((
            format!("delegate.max_depth = {child_depth}"),
            format!(
                "its children may delegate at most {} levels",
                parent_depth - 1
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn parent() -> pb::Receipt {
        pb::Receipt {
            receipt_id: "P".into(),
            expires_at: Some(prost_types::Timestamp {
                seconds: 2_000,
                nanos: 0,
            }),
            fs: vec![
                grant("/home/me/p", pb::FsAccess::Read, "/project"),
                grant("/home/me/p/out", pb::FsAccess::Write, ""),
                grant("/opt/tools", pb::FsAccess::Read, "/opt"),
            ],
            exec: vec!["/bin/sh".into(), "/opt/run".into()],
            routes: vec![pb::RouteGrant {
                name: "claude".into(),
                max_sensitivity: pb::Sensitivity::Low as i32,
                ask: false,
            }],
            limits: Some(pb::Limits {
                memory_bytes: 512 << 20,
                pids: 64,
                cpu_millicores: 1000,
                output_bytes: 1 << 20,
                tmpfs_bytes: 8 << 20,
                tool_calls: 100,
                tokens: 1000,
                files: 0,
                ..Default::default()
            }),
            delegate: Some(pb::Delegation {
                max_depth: 2,
                ask: false,
            }),
            ..Default::default()
        }
    }

    fn narrower() -> pb::Receipt {
        pb::Receipt {
            receipt_id: "C".into(),
            expires_at: Some(prost_types::Timestamp {
                seconds: 1_500,
                nanos: 0,
            }),
            fs: vec![
                grant("/home/me/p/src", pb::FsAccess::Read, "/src"),
                grant("/home/me/p/out/c1", pb::FsAccess::Write, ""),
            ],
            exec: vec!["/bin/sh".into()],
            routes: vec![pb::RouteGrant {
                name: "claude".into(),
                max_sensitivity: pb::Sensitivity::Low as i32,
                ask: false,
            }],
            limits: Some(pb::Limits {
                memory_bytes: 256 << 20,
                tool_calls: 10,
                tokens: 100,
                ..Default::default()
            }),
            delegate: Some(pb::Delegation {
                max_depth: 1,
                ask: false,
            }),
            ..Default::default()
        }
    }

    fn refused(child: pb::Receipt) -> String {
        check_within(&parent(), &child).unwrap_err().to_string()
    }

    #[test]
    fn gateway_only_programs_narrow_and_keep_asking() {
        let gateway = |program: &str, ask: bool| pb::GatewayExecGrant {
            program: program.into(),
            ask,
        };
        let mut p = parent();
        p.gateway_exec = vec![
            gateway("/usr/bin/git", true),
            gateway("/usr/bin/make", false),
        ];
        let within = |gateway_exec: Vec<pb::GatewayExecGrant>| {
            let child = pb::Receipt {
                gateway_exec,
                ..narrower()
            };
            check_within(&p, &child).map_err(|e| e.to_string())
        };
        // The parent's exec list and gateway-only programs reach children gateway-only.
        within(vec![
            gateway("/bin/sh", false),
            gateway("/usr/bin/make", true),
        ])
        .unwrap();
        within(vec![gateway("/usr/bin/git", true)]).unwrap();
        assert!(within(vec![gateway("/usr/bin/git", false)])
            .unwrap_err()
            .contains("gateway_exec[0].ask = false"));
        assert!(within(vec![gateway("/usr/bin/curl", true)])
            .unwrap_err()
            .contains("not in its exec list or gateway_exec"));
        // A program the parent runs only through the gateway never becomes the child's own.
        let child = pb::Receipt {
            exec: vec!["/usr/bin/git".into()],
            ..narrower()
        };
        assert!(check_within(&p, &child).is_err());
    }

    #[test]
    fn a_narrower_child_is_within() {
        assert_eq!(check_within(&parent(), &narrower()), Ok(()));
    }

    #[test]
    fn open_files_compare_with_zero_as_the_default() {
        // The parent leaves files at 0 (1024): a child may ask up to 1024, not more.
        let mut c = narrower();
        c.limits.as_mut().unwrap().files = 1024;
        assert_eq!(check_within(&parent(), &c), Ok(()));
        c.limits.as_mut().unwrap().files = 1025;
        assert!(refused(c).contains("limits.files = 1025"));
        let mut p = parent();
        p.limits.as_mut().unwrap().files = 64;
        assert!(
            check_within(&p, &narrower()).is_err(),
            "0 (1024) is above 64"
        );
    }

    #[test]
    fn egress_only_narrows() {
        let egress = |host: &str, ports: Vec<u32>| pb::EgressGrant {
            host: host.into(),
            ports,
            max_sensitivity: pb::Sensitivity::Low as i32,
            ..Default::default()
        };
        let mut p = parent();
        p.egress = vec![egress("*.example.com", vec![443, 8443])];
        let mut c = narrower();
        c.egress = vec![egress("api.example.com", vec![443])];
        assert_eq!(check_within(&p, &c), Ok(()));
        c.egress = vec![egress("api.example.com", vec![80])];
        assert!(check_within(&p, &c).unwrap_err().to_string().contains(
            "egress[0] = api.example.com:80 is above parent receipt P's grants (port 80"
        ));
        c.egress = vec![egress("example.org", vec![443])];
        assert!(check_within(&p, &c).is_err());
        c.egress = vec![egress("api.example.com", vec![443])];
        assert!(
            check_within(&parent(), &c).is_err(),
            "a parent without egress"
        );
    }

    #[test]
    fn every_wider_grant_is_named() {
        let mut c = narrower();
        c.fs[0].access = pb::FsAccess::Write as i32;
        assert_eq!(
            refused(c),
            "fs[0] = /home/me/p/src (write) is above parent receipt P's grants (/home/me/p is granted read)"
        );
        let mut c = narrower();
        c.fs.push(grant("/etc", pb::FsAccess::Read, ""));
        assert!(refused(c).contains(
            "fs[2] = /etc (read) is above parent receipt P's grants (no parent fs grant covers it)"
        ));
        let mut c = narrower();
        c.exec.push("/usr/bin/curl".into());
        assert!(refused(c).contains(
            "exec[1] = /usr/bin/curl is above parent receipt P's grants (not in its exec list)"
        ));
        let mut c = narrower();
        c.exec.push("/opt/run".into());
        c.fs.push(grant("/home/me/p/out", pb::FsAccess::Read, "/opt"));
        assert!(refused(c).contains(
            "fs[2].mount = /opt is above parent receipt P's grants (it covers exec /opt/run"
        ));
        let mut c = narrower();
        c.exec.push("/opt/run".into());
        c.fs.push(grant("/opt/tools", pb::FsAccess::Read, "/opt"));
        assert_eq!(
            check_within(&parent(), &c),
            Ok(()),
            "the parent's own (path, mount)"
        );
        // exec = true on a mount the parent has without it: the child would load code the
        // parent could not.
        let mut c = narrower();
        c.fs[0].exec = true;
        assert!(refused(c).contains(
            "fs[0].mount = /src is above parent receipt P's grants (it is executable, and the parent's mount of it is not)"
        ));
        let mut c = narrower();
        c.fs[1].mount = "/out".into();
        assert!(refused(c).contains(
            "fs[1].mount = /out is above parent receipt P's grants (the parent reaches /home/me/p/out/c1 through the gateway only (no mount))"
        ));
        let mut c = narrower();
        c.not_before = Some(prost_types::Timestamp {
            seconds: 99,
            nanos: 0,
        });
        let mut p = parent();
        p.not_before = Some(prost_types::Timestamp {
            seconds: 100,
            nanos: 0,
        });
        assert!(check_within(&p, &c).unwrap_err().to_string().contains(
            "not_before = 1970-01-01T00:01:39Z is above parent receipt P's grants (it is valid from 1970-01-01T00:01:40Z)"
        ));
        let mut c = narrower();
        c.routes[0].max_sensitivity = pb::Sensitivity::Unspecified as i32;
        assert!(refused(c).contains("routes[0] = claude up to nothing"));
        let mut c = narrower();
        c.routes[0].max_sensitivity = pb::Sensitivity::High as i32;
        assert!(refused(c).contains("routes[0] = claude up to high is above parent receipt P's grants (claude is granted up to low)"));
        let mut c = narrower();
        c.routes.push(pb::RouteGrant {
            name: "local".into(),
            max_sensitivity: pb::Sensitivity::Low as i32,
            ask: false,
        });
        assert!(refused(c).contains("route not granted"));
        let mut c = narrower();
        c.limits.as_mut().unwrap().tokens = 1001;
        assert!(
            refused(c).contains("limits.tokens = 1001 is above parent receipt P's grants (1000)")
        );
        let mut c = narrower();
        c.expires_at = Some(prost_types::Timestamp {
            seconds: 2_001,
            nanos: 0,
        });
        assert!(refused(c).contains("it expires at 1970-01-01T00:33:20Z"));
        let mut c = narrower();
        c.delegate = Some(pb::Delegation {
            max_depth: 2,
            ask: false,
        });
        assert!(refused(c).contains("its children may delegate at most 1 levels"));
        let mut p = parent();
        p.delegate = None;
        assert!(check_within(&p, &narrower())
            .unwrap_err()
            .to_string()
            .contains("may not delegate"));
    }
}
