//! Profiles: `tollgate profiles`, `tollgate profile show`, and what `tollgate mint` mints from
//! (a spec file, which may name a profile, or `--profile NAME`), expanded here into the
//! explicit run spec the authority signs.
//!
//! A profile is found by name in `$TOLLGATE_PROFILES_DIR`, the user's
//! `~/.config/tollgate/profiles/`, the host's `/etc/tollgate/profiles/`, then among the
//! built-in ones (the repository's `profiles/`), the first found winning: an operator copies a
//! built-in one to change it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use tollgate_proto::v1 as pb;
use tollgate_receipt::profile::{self, Profile};
use tollgate_receipt::spec::RunSpec;

use crate::args::ProfileValues;
use crate::error::CliError;
use crate::files::read_input;

/// The profiles that ship with Tollgate (`profiles/` in the repository), built in.
const BUILT_IN: [(&str, &str); 7] = [
    ("aider", include_str!("../../../profiles/aider.toml")),
    (
        "claude-code",
        include_str!("../../../profiles/claude-code.toml"),
    ),
    ("codex", include_str!("../../../profiles/codex.toml")),
    ("node", include_str!("../../../profiles/node.toml")),
    ("opencode", include_str!("../../../profiles/opencode.toml")),
    ("python", include_str!("../../../profiles/python.toml")),
    ("shell", include_str!("../../../profiles/shell.toml")),
];

/// The invoking user's home, which no run spec's `[home]` may be (nor hold).
pub(crate) fn operator_home() -> Option<String> {
    std::env::var("HOME").ok().filter(|home| !home.is_empty())
}

/// Where a profile was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// One of [`BUILT_IN`].
    BuiltIn,
    /// A file of the operator's or the host's.
    File(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BuiltIn => f.write_str("built-in"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A profile's text, and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    name: String,
    source: Source,
    text: String,
}

impl Found {
    fn parse(&self) -> Result<Profile, CliError> {
        Profile::parse(&self.name, &self.text).map_err(|e| match &self.source {
            Source::BuiltIn => CliError::Input(e.to_string()),
            Source::File(path) => CliError::Input(format!("{}: {e}", path.display())),
        })
    }
}

/// The directories searched, in order of precedence.
fn search_dirs() -> Vec<PathBuf> {
    let env_dir = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut dirs = Vec::new();
    dirs.extend(env_dir("TOLLGATE_PROFILES_DIR"));
    let config =
        env_dir("XDG_CONFIG_HOME").or_else(|| env_dir("HOME").map(|home| home.join(".config")));
    dirs.extend(config.map(|c| c.join("tollgate/profiles")));
    dirs.push(PathBuf::from("/etc/tollgate/profiles"));
    dirs
}

/// Profile `name`: the first file `<dir>/<name>.toml` of the search directories, else the
/// built-in one.
pub(crate) fn find(name: &str) -> Result<Found, CliError> {
    if !profile::is_name(name) {
        return Err(CliError::Input(format!(
            "{name:?} is not a profile name: `tollgate profiles` lists them"
        )));
    }
    for dir in search_dirs() {
        let path = dir.join(format!("{name}.toml"));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                return Ok(Found {
                    name: name.into(),
                    source: Source::File(path),
                    text,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(CliError::Input(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        }
    }
    BUILT_IN
        .iter()
        .find(|(built_in, _)| *built_in == name)
        .map(|(_, text)| Found {
            name: name.into(),
            source: Source::BuiltIn,
            text: (*text).into(),
        })
        .ok_or_else(|| {
            CliError::Input(format!(
                "no profile named {name:?}: `tollgate profiles` lists them (built in: {})",
                BUILT_IN.map(|(n, _)| n).join(", ")
            ))
        })
}

/// Every profile by name, each the one [`find`] would return.
fn all() -> Vec<Found> {
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for dir in search_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".toml"))
                .filter(|n| profile::is_name(n))
            else {
                continue;
            };
            if found.contains_key(name) {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&path) {
                let name = name.to_owned();
                found.insert(
                    name.clone(),
                    Found {
                        name,
                        source: Source::File(path),
                        text,
                    },
                );
            }
        }
    }
    for (name, text) in BUILT_IN {
        found.entry(name.into()).or_insert_with(|| Found {
            name: name.into(),
            source: Source::BuiltIn,
            text: text.into(),
        });
    }
    found.into_values().collect()
}

/// `tollgate profiles`.
pub(crate) fn list(json: bool) -> Result<(), CliError> {
    let rows: Vec<(Found, Result<Profile, CliError>)> = all()
        .into_iter()
        .map(|found| {
            let parsed = found.parse();
            (found, parsed)
        })
        .collect();
    if json {
        for (found, parsed) in &rows {
            let mut row = json!({"name": found.name, "source": found.source.to_string()});
            match parsed {
                Ok(profile) => {
                    row["description"] = json!(profile.description);
                    row["variables"] = json!(profile.used);
                }
                Err(e) => row["error"] = json!(e.to_string()),
            }
            out!("{row}")?;
        }
        return Ok(());
    }
    let width = rows.iter().map(|(f, _)| f.name.len()).max().unwrap_or(4);
    say!("{:width$}  {:10}  DESCRIPTION", "NAME", "SOURCE")?;
    for (found, parsed) in &rows {
        let source = match &found.source {
            Source::BuiltIn => "built-in".to_owned(),
            Source::File(_) => "file".to_owned(),
        };
        let description = match parsed {
            Ok(profile) => profile.description.clone(),
            Err(e) => format!("unusable: {e}"),
        };
        say!("{:width$}  {source:10}  {description}", found.name)?;
    }
    let files: Vec<&Found> = rows
        .iter()
        .map(|(f, _)| f)
        .filter(|f| f.source != Source::BuiltIn)
        .collect();
    for found in files {
        say!("{}: {}", found.name, found.source)?;
    }
    say!("`tollgate profile show NAME` prints one; copy it to ~/.config/tollgate/profiles/NAME.toml to change it")?;
    Ok(())
}

/// `tollgate profile show NAME [--expanded]`.
pub(crate) fn show(name: &str, expanded: bool, values: &ProfileValues) -> Result<(), CliError> {
    let found = find(name)?;
    let profile = found.parse()?;
    if !expanded {
        if values.is_given() {
            return Err(CliError::Input(
                "--project, --task and --var fill the profile's variables: add --expanded to see what they make".into(),
            ));
        }
        return crate::out::bytes(found.text.as_bytes());
    }
    let spec = RunSpec {
        profile: Some(name.into()),
        ..RunSpec::default()
    };
    let label = format!("profile {name}");
    let spec = expand_with(spec, &profile, values, Home::Show)?;
    // The same checks a mint makes on this host (links, the home), nothing sent.
    spec.to_request_for(operator_home().as_deref())
        .map_err(|e| CliError::Input(e.in_file(&label)))?;
    let text = toml::to_string(&spec)
        .map_err(|e| CliError::Other(format!("cannot print the expanded spec: {e}")))?;
    out!(
        "# profile {name} ({}), expanded: the run spec `tollgate mint` signs",
        found.source
    )?;
    crate::out::bytes(text.as_bytes())
}

impl ProfileValues {
    /// Whether any value was given.
    pub(crate) fn is_given(&self) -> bool {
        self.project.is_some() || self.task.is_some() || !self.vars.is_empty()
    }

    /// The values by variable name: `--var NAME=VALUE`s, then `--project` (absolute, an
    /// existing directory) and `--task`.
    fn to_map(&self) -> Result<BTreeMap<String, String>, CliError> {
        let mut map = BTreeMap::new();
        for pair in &self.vars {
            let Some((name, value)) = pair.split_once('=').filter(|(n, _)| profile::is_name(n))
            else {
                return Err(CliError::Input(format!(
                    "--var {pair:?}: write NAME=VALUE, NAME in lowercase letters, digits, '-' and '_'"
                )));
            };
            map.insert(name.to_owned(), value.to_owned());
        }
        if let Some(project) = &self.project {
            let absolute = std::fs::canonicalize(project)
                .ok()
                .filter(|p| p.is_dir())
                .ok_or_else(|| {
                    CliError::Input(format!(
                        "--project {}: no such directory",
                        project.display()
                    ))
                })?;
            let absolute = absolute.to_str().ok_or_else(|| {
                CliError::Input(format!(
                    "--project {}: the path is not UTF-8",
                    project.display()
                ))
            })?;
            map.insert("project".into(), absolute.into());
        }
        if let Some(task) = &self.task {
            map.insert("task".into(), task.clone());
        }
        Ok(map)
    }
}

/// What a mint starts from: a spec file (which may name a profile) or a profile.
#[derive(Debug)]
pub(crate) struct MintSource {
    from: MintFrom,
    values: ProfileValues,
}

/// Where a mint's spec comes from.
#[derive(Debug)]
enum MintFrom {
    /// A run spec file (`-` for stdin), which may name a profile itself.
    Spec(PathBuf),
    /// A profile by name, filled from the command line's values.
    Profile(String),
}

impl MintSource {
    /// `--spec FILE` or `--profile NAME` (clap makes it exactly one: a spec wins if both
    /// came), with the variables.
    pub(crate) fn new(
        spec: Option<PathBuf>,
        profile: Option<String>,
        values: ProfileValues,
    ) -> Result<Self, CliError> {
        let from = match (spec, profile) {
            (Some(spec), _) => MintFrom::Spec(spec),
            (None, Some(name)) => MintFrom::Profile(name),
            (None, None) => {
                return Err(CliError::Input(
                    "give --spec FILE or --profile NAME (`tollgate profiles` lists them)".into(),
                ))
            }
        };
        Ok(Self { from, values })
    }

    /// How messages name it: the spec file, or `profile NAME`.
    pub(crate) fn label(&self) -> String {
        match &self.from {
            MintFrom::Spec(spec) => spec.display().to_string(),
            MintFrom::Profile(name) => format!("profile {name}"),
        }
    }

    /// How to mint it once the dry run passes.
    pub(crate) fn mint_command(&self) -> String {
        match &self.from {
            MintFrom::Spec(spec) => format!("tollgate mint --spec {}", spec.display()),
            MintFrom::Profile(name) => format!("tollgate mint --profile {name} …"),
        }
    }

    /// The mint request: the spec read, its profile expanded (making a default home that
    /// does not exist yet when `make_home`), checked on this host.
    pub(crate) fn request(&self, make_home: bool) -> Result<pb::MintReceiptRequest, CliError> {
        let label = self.label();
        let spec = match &self.from {
            MintFrom::Spec(path) => RunSpec::parse(&read_input(path)?)
                .map_err(|e| CliError::Input(e.in_file(&label)))?,
            MintFrom::Profile(name) => RunSpec {
                profile: Some(name.clone()),
                ..RunSpec::default()
            },
        };
        let spec = match spec.profile.clone() {
            Some(name) => {
                let profile = find(&name)?.parse()?;
                let home = if make_home { Home::Make } else { Home::Show };
                expand_with(spec, &profile, &self.values, home)
                    .map_err(|e| in_source(e, &label))?
            }
            None if self.values.is_given() => {
                return Err(CliError::Input(format!(
                    "{label}: names no profile, so --project, --task and --var have nothing to fill: add profile = \"NAME\" to it, or drop them"
                )))
            }
            None => spec,
        };
        spec.to_request_for(operator_home().as_deref())
            .map_err(|e| CliError::Input(e.in_file(&label)))
    }
}

fn in_source(error: CliError, label: &str) -> CliError {
    match error {
        CliError::Input(message) if !label.starts_with("profile ") => {
            CliError::Input(format!("{label}: {message}"))
        }
        other => other,
    }
}

/// What to do with a profile's default home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    /// Show its path only.
    Show,
    /// Make it (0700, the invoking user's) when it does not exist: a mint.
    Make,
}

/// `spec` with `profile` applied, the values from the command line over the spec's own. A
/// profile that uses `home`, is given none and has no default of its own gets the default
/// home of its name.
fn expand_with(
    spec: RunSpec,
    profile: &Profile,
    values: &ProfileValues,
    home: Home,
) -> Result<RunSpec, CliError> {
    let mut given = values.to_map()?;
    let default_home = (profile.used.contains("home")
        && !given.contains_key("home")
        && !spec.vars.contains_key("home")
        && !profile.defaults.contains_key("home"))
    .then(|| default_home(&profile.name))
    .transpose()?;
    if let Some(path) = &default_home {
        given.insert("home".into(), path.display().to_string());
    }
    let expanded =
        profile::apply(spec, profile, &given).map_err(|e| CliError::Input(e.to_string()))?;
    if let (Some(path), Home::Make) = (&default_home, home) {
        if expanded
            .home
            .as_ref()
            .is_some_and(|h| Path::new(&h.path) == path)
        {
            make_home(&profile.name, path)?;
        }
    }
    Ok(expanded)
}

/// `~/.local/state/tollgate/homes/NAME` (or under `$XDG_STATE_HOME`): the agent's own home,
/// the invoking user's, beside no one else's files.
fn default_home(name: &str) -> Result<PathBuf, CliError> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| operator_home().map(|home| Path::new(&home).join(".local/state")))
        .ok_or_else(|| {
            CliError::Input(
                "HOME is not set, so a profile's home has no default: give --var home=DIR".into(),
            )
        })?;
    Ok(state.join("tollgate/homes").join(name))
}

/// Makes the default home when it does not exist yet: private to the invoking user, whose
/// files the sandbox shows as the agent's own (id-mapped). Root's would not be the agent's:
/// a grant owned by root is never mapped, so the agent could not write there.
fn make_home(name: &str, path: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let owner = match std::fs::metadata(path) {
        Ok(meta) => meta.uid(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if nix::unistd::geteuid().is_root() {
                return Err(root_home(name, path));
            }
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|e| CliError::Output {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })?;
            return Ok(());
        }
        Err(e) => {
            return Err(CliError::Input(format!(
                "cannot read the home {}: {e}",
                path.display()
            )))
        }
    };
    if owner == 0 {
        return Err(root_home(name, path));
    }
    Ok(())
}

fn root_home(name: &str, path: &Path) -> CliError {
    CliError::Input(format!(
        "profile {name}: its home {} would belong to root, and an agent never writes as root: mint as the user whose agent it is, or give --var home=DIR for a directory that user owns",
        path.display()
    ))
}
