//! Interpreters outside the grant: a virtualenv made from a pyenv, uv or conda Python has a
//! `bin/python` that links outside the project, to a directory no sandbox shows. Checked on
//! the operator's host when a spec becomes a request (`tollgate mint`): such a link is refused,
//! naming it and its target, unless the spec asks `[exec] interpreters = "follow"`, which
//! grants the interpreter's installation read-only and executable at its own path.
//!
//! Following is the only way a link decides what a receipt grants, so it is narrow: the link
//! must lie in a read-only grant (a write grant's links may have been planted by an earlier
//! run given it, to steer a later mint into granting a directory of its choosing) and must
//! resolve to a regular file directly in an installation's `bin/` directory
//! (`<prefix>/bin/python3.11`, whose `<prefix>` is what is granted).

use std::path::{Path, PathBuf};

use tollgate_proto::v1 as pb;

use crate::paths::{is_normal_absolute, path_within, SYSTEM_PATHS};

/// A virtualenv's interpreter the spec cannot grant as asked, or a bad `interpreters` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InterpreterError {
    /// Dotted path of the field, e.g. `exec.allow[2]`.
    pub field: String,
    /// What is wrong and what to write instead.
    pub reason: String,
}

/// What to do with a program that links outside every grant (`[exec] interpreters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interpreters {
    /// Refuse the spec, naming the link and its target (the default).
    #[default]
    Refuse,
    /// Grant the target's installation directory read-only and executable, mounted at its
    /// own host path, and allow the target itself.
    Follow,
}

impl Interpreters {
    /// Parses `"refuse"` / `"follow"` (`field` names it in the error).
    pub fn parse(field: &str, text: &str) -> Result<Self, InterpreterError> {
        match text {
            "refuse" => Ok(Self::Refuse),
            "follow" => Ok(Self::Follow),
            _ => Err(InterpreterError {
                field: field.into(),
                reason: format!("{text:?} is not \"refuse\" or \"follow\""),
            }),
        }
    }
}

/// The installation directory of an interpreter at `target` (a resolved host path): the
/// parent of its `bin` directory (`/root/.pyenv/versions/3.11.7` for
/// `/root/.pyenv/versions/3.11.7/bin/python3.11`, which holds its standard library too);
/// `None` when `target` is not directly in a `bin` directory below `/`.
fn installation_of(target: &Path) -> Option<PathBuf> {
    let dir = target.parent()?;
    match (dir.file_name(), dir.parent()) {
        (Some(name), Some(parent)) if name == "bin" && parent != Path::new("/") => {
            Some(parent.to_owned())
        }
        _ => None,
    }
}

/// Why the link `program` (in `grant`) to `target` may not be followed, if it may not.
fn unfollowable(program: &str, grant: &pb::FsGrant, target: &Path) -> Option<String> {
    let shown = target.display();
    if grant.access != pb::FsAccess::Read as i32 {
        return Some(format!(
            "{program} is a link to {shown} in the write grant {}, where a run could have planted it: only links in read-only grants are followed; grant the virtualenv read-only, or make it from /usr/bin/python3",
            grant.path
        ));
    }
    if !std::fs::metadata(target).is_ok_and(|m| m.is_file()) {
        return Some(format!(
            "{program} is a link to {shown}, which is not a regular file: only an interpreter file in an installation's bin/ directory is followed"
        ));
    }
    if installation_of(target).is_none() {
        return Some(format!(
            "{program} is a link to {shown}, which is not directly in an installation's bin/ directory (<prefix>/bin/...): only such interpreters are followed"
        ));
    }
    None
}

/// Checks every program of `request` the agent runs by name (`exec` files and
/// `agent.argv[0]`) that lies beneath a mounted grant: resolved on this host, it must stay
/// within that grant or on the system paths the sandbox shows (without a `rootfs` of the
/// run's own). One that leaves is refused, naming the link and its target, or with
/// [`Interpreters::Follow`] — when it lies in a read-only grant and resolves to a regular file
/// in an installation's `bin/` (else refused, saying why) — its installation is added as a
/// read grant mounted at its own path with `exec = true`, and its resolved path to `exec`.
/// Paths that do not exist here are left alone (the supervisor's host may differ).
pub fn check_interpreters(
    request: &mut pb::MintReceiptRequest,
    mode: Interpreters,
) -> Result<(), InterpreterError> {
    let mut programs: Vec<(String, String)> = request
        .exec
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.ends_with('/'))
        .map(|(i, e)| (format!("exec[{i}]"), e.clone()))
        .collect();
    if let Some(program) = request.agent.as_ref().and_then(|a| a.argv.first()) {
        programs.push(("agent.argv[0]".into(), program.clone()));
    }
    for (field, program) in programs {
        // The innermost grant holding the program is the one the sandbox shows it from.
        let Some(grant) = request
            .fs
            .iter()
            .filter(|g| !g.mount.is_empty() && path_within(&program, &g.mount))
            .max_by_key(|g| g.mount.len())
            .cloned()
        else {
            continue;
        };
        let relative = program[grant.mount.len()..].trim_start_matches('/');
        let host = Path::new(&grant.path).join(relative);
        let Ok(target) = std::fs::canonicalize(&host) else {
            continue;
        };
        let Some(target_text) = target.to_str().filter(|t| is_normal_absolute(t)) else {
            continue;
        };
        let grant_root = std::fs::canonicalize(&grant.path)
            .ok()
            .and_then(|p| p.to_str().map(str::to_owned))
            .unwrap_or_else(|| grant.path.clone());
        let visible = path_within(target_text, &grant_root)
            || (request.rootfs.is_empty()
                && SYSTEM_PATHS.iter().any(|s| path_within(target_text, s)))
            || request
                .fs
                .iter()
                .any(|g| g.mount == g.path && path_within(target_text, &g.path));
        if visible {
            continue;
        }
        match mode {
            Interpreters::Refuse => {
                let follow = match installation_of(&target) {
                    Some(install) => format!(
                        "set [exec] interpreters = \"follow\" to grant {} read-only and executable",
                        install.display()
                    ),
                    None => "grant its target's directory read-only".into(),
                };
                return Err(InterpreterError {
                    field,
                    reason: format!(
                        "{program} is a link to {target_text}, outside every grant: the sandbox cannot reach it; make the virtualenv from /usr/bin/python3, or {follow}"
                    ),
                });
            }
            Interpreters::Follow => {
                if let Some(reason) = unfollowable(&program, &grant, &target) {
                    return Err(InterpreterError { field, reason });
                }
                let Some(install) = installation_of(&target) else {
                    // `unfollowable` refused every target without one.
                    continue;
                };
                let install = install.display().to_string();
                if !request.fs.iter().any(|g| g.mount == install) {
                    request.fs.push(pb::FsGrant {
                        path: install.clone(),
                        access: pb::FsAccess::Read as i32,
                        mount: install,
                        exec: true,
                        ask: false,
                        ask_reads: false,
                    });
                }
                if !request.exec.iter().any(|e| e == target_text) {
                    request.exec.push(target_text.to_owned());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_interpreter_outside_the_grant_is_refused_or_followed() {
        let dir = std::env::temp_dir().join(format!("tollgate-interp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let root = dir.canonicalize().unwrap();
        // A pyenv-style installation, and a project whose venv links to it.
        let install = root.join("pyenv/versions/3.11.7");
        std::fs::create_dir_all(install.join("bin")).unwrap();
        std::fs::write(install.join("bin/python3.11"), "").unwrap();
        let project = root.join("project");
        std::fs::create_dir_all(project.join(".venv/bin")).unwrap();
        std::os::unix::fs::symlink(
            install.join("bin/python3.11"),
            project.join(".venv/bin/python"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/env", project.join(".venv/bin/env")).unwrap();
        let request = || pb::MintReceiptRequest {
            fs: vec![pb::FsGrant {
                path: project.display().to_string(),
                access: pb::FsAccess::Read as i32,
                mount: "/project".into(),
                ..Default::default()
            }],
            exec: vec![
                "/project/.venv/bin/python".into(),
                "/project/.venv/bin/env".into(),
                "/usr/bin/".into(),
            ],
            ..Default::default()
        };
        let error = check_interpreters(&mut request(), Interpreters::Refuse).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("exec[0]: /project/.venv/bin/python is a link to "),
            "{text}"
        );
        assert!(
            text.contains(&format!("{}", install.join("bin/python3.11").display())),
            "{text}"
        );
        assert!(text.contains("interpreters = \"follow\""), "{text}");

        let mut followed = request();
        check_interpreters(&mut followed, Interpreters::Follow).unwrap();
        let added = followed.fs.last().unwrap();
        assert_eq!(added.path, install.display().to_string());
        assert_eq!(
            (added.mount.as_str(), added.exec),
            (added.path.as_str(), true)
        );
        assert_eq!(added.access, pb::FsAccess::Read as i32);
        assert!(followed
            .exec
            .contains(&install.join("bin/python3.11").display().to_string()));
        // Followed once is enough: a second check adds nothing and refuses nothing.
        let before = followed.clone();
        check_interpreters(&mut followed, Interpreters::Refuse).unwrap();
        assert_eq!(followed, before);
        assert_eq!(
            Interpreters::parse("exec.interpreters", "follow").unwrap(),
            Interpreters::Follow
        );
        assert!(Interpreters::parse("exec.interpreters", "yes").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A link an earlier run could have planted (in a write grant, `exec = true` or not), or
    /// one leading anywhere but a regular file in an installation's `bin/`, is not followed.
    #[test]
    fn only_links_in_read_only_grants_to_an_installations_bin_are_followed() {
        let dir = std::env::temp_dir().join(format!("tollgate-interp-w-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let root = dir.canonicalize().unwrap();
        let install = root.join("opt/python");
        std::fs::create_dir_all(install.join("bin")).unwrap();
        std::fs::write(install.join("bin/python3"), "").unwrap();
        std::fs::create_dir_all(root.join("secrets")).unwrap();
        std::fs::write(root.join("secrets/key"), "").unwrap();
        let project = root.join("project");
        std::fs::create_dir_all(project.join("bin")).unwrap();
        let link = |name: &str, target: &Path| {
            std::os::unix::fs::symlink(target, project.join("bin").join(name)).unwrap();
        };
        link("python", &install.join("bin/python3"));
        link("not-in-bin", &root.join("secrets/key"));
        link("a-directory", &install.join("bin"));
        let request = |program: &str, access: pb::FsAccess, exec: bool| pb::MintReceiptRequest {
            fs: vec![pb::FsGrant {
                path: project.display().to_string(),
                access: access as i32,
                mount: "/project".into(),
                exec,
                ..Default::default()
            }],
            exec: vec![format!("/project/bin/{program}")],
            ..Default::default()
        };
        let refused = |program: &str, access, exec| {
            check_interpreters(&mut request(program, access, exec), Interpreters::Follow)
                .unwrap_err()
                .to_string()
        };
        for exec in [true, false] {
            let text = refused("python", pb::FsAccess::Write, exec);
            assert!(
                text.starts_with(&format!(
                    "exec[0]: /project/bin/python is a link to {} in the write grant {}",
                    install.join("bin/python3").display(),
                    project.display()
                )),
                "{text}"
            );
            assert!(
                text.contains("only links in read-only grants are followed"),
                "{text}"
            );
        }
        let text = refused("not-in-bin", pb::FsAccess::Read, false);
        assert!(
            text.contains(&format!(
                "{}, which is not directly in an installation's bin/ directory",
                root.join("secrets/key").display()
            )),
            "{text}"
        );
        let text = refused("a-directory", pb::FsAccess::Read, false);
        assert!(text.contains("which is not a regular file"), "{text}");
        // The same link in a read-only grant is followed.
        let mut followed = request("python", pb::FsAccess::Read, false);
        check_interpreters(&mut followed, Interpreters::Follow).unwrap();
        assert_eq!(followed.fs[1].path, install.display().to_string());
        // An inner write grant holding the link is the grant that counts, not the read
        // grant around it.
        let mut nested = request("python", pb::FsAccess::Read, false);
        nested.fs.push(pb::FsGrant {
            path: project.join("bin").display().to_string(),
            access: pb::FsAccess::Write as i32,
            mount: "/project/bin".into(),
            ..Default::default()
        });
        assert!(check_interpreters(&mut nested, Interpreters::Follow).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
