//! Profiles: named, partial run specs (`claude-code`, `codex`, `python`…) that a run spec
//! starts from (`profile = "claude-code"`) and `tollgate mint --profile NAME` expands.
//!
//! A profile file is a run spec with a `[profile]` table: a one-line `description` and the
//! defaults of its variables (`[profile.vars]`). Its string values may name variables as
//! `${project}`; `$${` stands for a literal `${`. Expansion happens before anything is signed:
//! the receipt holds the explicit spec, never a profile name, so what a run may do never
//! depends on a file the supervisor or a later reader cannot see.
//!
//! Expansion is [`apply`]: the profile's variables are filled (the spec's `[vars]`, then the
//! caller's values, over the profile's defaults), then the spec's own settings go on top of
//! the profile's by the rules in [`merge`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::spec::{parse_toml, RunSpec, SpecError};

/// A profile could not be read or expanded. The messages are one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The profile's name is not a profile name.
    #[error(
        "{0:?} is not a profile name: use lowercase letters, digits and '-', e.g. claude-code"
    )]
    BadName(String),
    /// The profile file is not a valid profile.
    #[error("profile {profile}: {problem}")]
    Invalid {
        /// The profile's name.
        profile: String,
        /// What is wrong, naming the field.
        problem: SpecError,
    },
    /// Variables the profile uses have no value.
    #[error("profile {profile} needs a value for {}: give each on the command line (--project DIR, --task TEXT, --var NAME=VALUE) or in the run spec's [vars]", .names.join(", "))]
    MissingVars {
        /// The profile's name.
        profile: String,
        /// The variables without a value, sorted.
        names: Vec<String>,
    },
    /// Values were given for variables the profile does not use (a typo, most likely).
    #[error("profile {profile} has no variable {} (its variables: {})", .names.join(", "), .known.join(", "))]
    UnknownVars {
        /// The profile's name.
        profile: String,
        /// The unknown names, sorted.
        names: Vec<String>,
        /// The variables it does use, sorted.
        known: Vec<String>,
    },
    /// The spec with the profile applied is not a valid run spec.
    #[error("with profile {profile}: {problem}")]
    Expanded {
        /// The profile's name.
        profile: String,
        /// What is wrong, naming the field.
        problem: SpecError,
    },
}

/// `[profile]` of a profile file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    /// One line: what the profile is for.
    description: String,
    /// Defaults of its variables.
    #[serde(default)]
    vars: BTreeMap<String, String>,
}

/// A profile file: the header, and the run spec settings around it.
#[derive(Debug, Deserialize)]
struct ProfileFile {
    profile: Header,
    #[serde(flatten)]
    settings: toml::Table,
}

/// A parsed profile.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Its name (the file's, without `.toml`).
    pub name: String,
    /// One line: what it is for.
    pub description: String,
    /// Default values of its variables.
    pub defaults: BTreeMap<String, String>,
    /// Every variable its settings use, sorted.
    pub used: BTreeSet<String>,
    /// The run spec settings, variables not yet filled.
    settings: toml::Table,
}

/// Whether `name` is a profile (or variable) name: lowercase letters, digits, `-` and `_`,
/// starting with a letter, at most 64 characters.
pub fn is_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Profile {
    /// Parses profile `name` from `text`, checking that its settings are a run spec (with
    /// its variables as placeholders) and that its variables are well formed.
    pub fn parse(name: &str, text: &str) -> Result<Self, ProfileError> {
        if !is_name(name) {
            return Err(ProfileError::BadName(name.into()));
        }
        let problem = |problem: SpecError| ProfileError::Invalid {
            profile: name.into(),
            problem,
        };
        let file: ProfileFile = parse_toml(text).map_err(|mut e| {
            // TOML puts every key below a table header in that table.
            if e.key.starts_with("profile.") && e.message.starts_with("unknown field") {
                e.message.push_str(
                    " (keys below [profile] belong to it: put subject, ttl and audience above it)",
                );
            }
            problem(SpecError::Syntax(e))
        })?;
        if file.settings.contains_key("vars") {
            return Err(problem(invalid(
                "vars",
                "a profile's variables and their defaults are [profile.vars]",
            )));
        }
        let mut used = BTreeSet::new();
        collect_table(&file.settings, "", &mut used).map_err(problem)?;
        for (var, value) in &file.profile.vars {
            if !is_name(var) {
                return Err(problem(invalid(
                    format!("profile.vars.{var}"),
                    "a variable name is lowercase letters, digits, '-' and '_'",
                )));
            }
            if !used.contains(var) {
                return Err(problem(invalid(
                    format!("profile.vars.{var}"),
                    "no setting uses it: write ${NAME} in a value, or drop the default",
                )));
            }
            if value.contains("${") {
                return Err(problem(invalid(
                    format!("profile.vars.{var}"),
                    "a default cannot name another variable",
                )));
            }
        }
        if file.profile.description.contains('\n') || file.profile.description.trim().is_empty() {
            return Err(problem(invalid(
                "profile.description",
                "must be one line saying what the profile is for",
            )));
        }
        // The settings must be a run spec as they stand; filled variables only change text.
        let spec: RunSpec = toml::Value::Table(file.settings.clone())
            .try_into()
            .map_err(|e: toml::de::Error| problem(invalid("", one_line(e.message()))))?;
        if spec.profile.is_some() {
            return Err(problem(invalid(
                "profile",
                "a profile cannot start from another profile",
            )));
        }
        Ok(Self {
            name: name.into(),
            description: file.profile.description.trim().into(),
            defaults: file.profile.vars,
            used,
            settings: file.settings,
        })
    }

    /// The profile's run spec with `values` (over its defaults) filled in. Every variable it
    /// uses must have a value, and every value given must be one it uses.
    pub fn expand(&self, values: &BTreeMap<String, String>) -> Result<RunSpec, ProfileError> {
        let unknown: Vec<String> = values
            .keys()
            .filter(|name| !self.used.contains(*name))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(ProfileError::UnknownVars {
                profile: self.name.clone(),
                names: unknown,
                known: self.used.iter().cloned().collect(),
            });
        }
        let mut filled = self.defaults.clone();
        filled.extend(values.iter().map(|(k, v)| (k.clone(), v.clone())));
        let missing: Vec<String> = self
            .used
            .iter()
            .filter(|name| !filled.contains_key(*name))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ProfileError::MissingVars {
                profile: self.name.clone(),
                names: missing,
            });
        }
        let mut settings = toml::Value::Table(self.settings.clone());
        fill_value(&mut settings, &filled);
        settings
            .try_into()
            .map_err(|e: toml::de::Error| ProfileError::Expanded {
                profile: self.name.clone(),
                problem: invalid("", one_line(e.message())),
            })
    }
}

/// `spec` (which names `profile`) expanded: the profile's variables filled from `values`
/// over the spec's `[vars]` over the profile's defaults, then the spec's settings merged on
/// top. The result names no profile and has no variables.
pub fn apply(
    spec: RunSpec,
    profile: &Profile,
    values: &BTreeMap<String, String>,
) -> Result<RunSpec, ProfileError> {
    let mut filled = spec.vars.clone();
    filled.extend(values.iter().map(|(k, v)| (k.clone(), v.clone())));
    let base = profile.expand(&filled)?;
    Ok(merge(
        base,
        RunSpec {
            profile: None,
            vars: BTreeMap::new(),
            ..spec
        },
    ))
}

/// `over` on top of `base`, key by key:
/// - `subject`, `ttl`, `audience`, `routes`, and the sections `[delegate]`, `[rootfs]`,
///   `[workspace]`, `[home]` and `[approvals]`: `over`'s when it gives them (routes name the
///   supervisor's own, so a spec that lists any lists all);
/// - `[agent]`: `argv` and `workdir` are `over`'s when given; `env` is both, `over`'s value
///   winning for a name in both;
/// - `[limits]`: each limit `over` sets;
/// - `[[fs]]` and `[[egress]]`: both, an entry of `over` replacing `base`'s for the same host
///   path and mount (fs) or the same host (egress);
/// - `[exec]` lists: both, without repeats; `interpreters` is `over`'s when given.
pub fn merge(base: RunSpec, over: RunSpec) -> RunSpec {
    let agent = match (base.agent, over.agent) {
        (Some(base), Some(over)) => {
            let mut env = base.env;
            env.extend(over.env);
            Some(crate::spec::AgentSection {
                argv: if over.argv.is_empty() {
                    base.argv
                } else {
                    over.argv
                },
                env,
                workdir: over.workdir.or(base.workdir),
            })
        }
        (base, over) => over.or(base),
    };
    let limits = {
        let (b, o) = (base.limits, over.limits);
        crate::spec::LimitsSpec {
            memory: o.memory.or(b.memory),
            pids: o.pids.or(b.pids),
            cpu: o.cpu.or(b.cpu),
            output: o.output.or(b.output),
            tmpfs: o.tmpfs.or(b.tmpfs),
            tool_calls: o.tool_calls.or(b.tool_calls),
            tokens: o.tokens.or(b.tokens),
            files: o.files.or(b.files),
            egress_connections: o.egress_connections.or(b.egress_connections),
            egress_bytes: o.egress_bytes.or(b.egress_bytes),
            egress_idle: o.egress_idle.or(b.egress_idle),
        }
    };
    let exec = {
        let (b, o) = (base.exec, over.exec);
        crate::spec::ExecSection {
            allow: union(b.allow, o.allow),
            gateway: union(b.gateway, o.gateway),
            ask: union(b.ask, o.ask),
            interpreters: o.interpreters.or(b.interpreters),
        }
    };
    RunSpec {
        profile: None,
        vars: BTreeMap::new(),
        subject: if over.subject.is_empty() {
            base.subject
        } else {
            over.subject
        },
        ttl: if over.ttl.is_empty() {
            base.ttl
        } else {
            over.ttl
        },
        audience: if over.audience.is_empty() {
            base.audience
        } else {
            over.audience
        },
        agent,
        limits,
        fs: replace_by(base.fs, over.fs, |a, b| {
            a.path == b.path && a.mount == b.mount
        }),
        exec,
        routes: if over.routes.is_empty() {
            base.routes
        } else {
            over.routes
        },
        delegate: over.delegate.or(base.delegate),
        rootfs: over.rootfs.or(base.rootfs),
        workspace: over.workspace.or(base.workspace),
        home: over.home.or(base.home),
        egress: replace_by(base.egress, over.egress, |a, b| a.host == b.host),
        approvals: over.approvals.or(base.approvals),
    }
}

fn union(mut base: Vec<String>, over: Vec<String>) -> Vec<String> {
    for item in over {
        if !base.contains(&item) {
            base.push(item);
        }
    }
    base
}

/// `base`'s entries that no entry of `over` replaces (`same`), then `over`'s.
fn replace_by<T>(base: Vec<T>, over: Vec<T>, same: impl Fn(&T, &T) -> bool) -> Vec<T> {
    let mut merged: Vec<T> = base
        .into_iter()
        .filter(|b| !over.iter().any(|o| same(b, o)))
        .collect();
    merged.extend(over);
    merged
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A piece of a profile's string value: text as it stands, or a variable to fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece<'a> {
    /// Kept as it is (`$${` already turned into `${`).
    Text(&'a str),
    /// `${NAME}`: the variable's name.
    Var(&'a str),
}

/// `text` split at its `${NAME}`s (`$${` stands for a literal `${`), or why one is malformed.
/// The one reading of the syntax: what a profile uses and how it is filled both come from it.
fn pieces(text: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        if let Some(escaped) = after.strip_prefix("${") {
            pieces.push(Piece::Text(&rest[..at]));
            pieces.push(Piece::Text("${"));
            rest = escaped;
            continue;
        }
        let Some(open) = after.strip_prefix('{') else {
            pieces.push(Piece::Text(&rest[..=at]));
            rest = after;
            continue;
        };
        let Some(end) = open.find('}') else {
            return Err("a ${ is not closed: write ${NAME}, or $${ for a literal ${".into());
        };
        let name = &open[..end];
        if !is_name(name) {
            return Err(format!(
                "${{{name}}} is not a variable: names are lowercase letters, digits, '-' and '_'"
            ));
        }
        pieces.push(Piece::Text(&rest[..at]));
        pieces.push(Piece::Var(name));
        rest = &open[end + 1..];
    }
    pieces.push(Piece::Text(rest));
    Ok(pieces)
}

/// The variables `text` names, or why its `${…}` are malformed.
fn variables_in(text: &str) -> Result<Vec<String>, String> {
    Ok(pieces(text)?
        .into_iter()
        .filter_map(|piece| match piece {
            Piece::Var(name) => Some(name.to_owned()),
            Piece::Text(_) => None,
        })
        .collect())
}

/// `text` with each `${NAME}` replaced by its value and `$${` by `${`. Every string was
/// checked when the profile was parsed, and every name has a value (checked by the caller).
fn fill(text: &str, values: &BTreeMap<String, String>) -> String {
    match pieces(text) {
        Ok(pieces) => pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => text,
                Piece::Var(name) => values.get(name).map_or("", String::as_str),
            })
            .collect(),
        Err(_) => text.to_owned(),
    }
}

fn collect_table(
    table: &toml::Table,
    path: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), SpecError> {
    for (key, value) in table {
        let path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        collect_value(value, &path, used)?;
    }
    Ok(())
}

fn collect_value(
    value: &toml::Value,
    path: &str,
    used: &mut BTreeSet<String>,
) -> Result<(), SpecError> {
    match value {
        toml::Value::String(text) => {
            used.extend(variables_in(text).map_err(|reason| invalid(path, reason))?);
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_value(item, &format!("{path}[{i}]"), used)?;
            }
        }
        toml::Value::Table(table) => collect_table(table, path, used)?,
        _ => {}
    }
    Ok(())
}

fn fill_value(value: &mut toml::Value, values: &BTreeMap<String, String>) {
    match value {
        toml::Value::String(text) => *text = fill(text, values),
        toml::Value::Array(items) => items.iter_mut().for_each(|item| fill_value(item, values)),
        toml::Value::Table(table) => table
            .iter_mut()
            .for_each(|(_, item)| fill_value(item, values)),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
