//! The supervisor's model routes (`tollgate-supervisor --routes FILE`): where each route
//! leads, whether it is local or cloud, which model it serves and where its key comes from.
//! Parsing and validation are pure; `tollgate_router_backends`' key loading is the only step that reads the
//! environment or a file.
//!
//! ```toml
//! [policy]
//! force_local = false        # true: cloud routes are never used, even when granted
//! max_tokens_default = 1024  # completion cap when a call names none
//! max_tokens_limit = 8192    # most completion tokens one call may ask for
//! internal_suffixes = ["internal", "corp", "acme-int"]  # optional: names that are internal
//!
//! [policy.levels]            # optional: a detector's level where it differs from the default
//! email = "medium"           # (`tollgate classify --explain-policy` lists every detector)
//!
//! [[route]]
//! name = "claude"
//! kind = "cloud"
//! api = "anthropic"          # openai | anthropic | openai-responses
//! models = ["claude-*"]      # optional: model names agents ask for that this route serves
//! endpoint = "https://api.anthropic.com"
//! model = "claude-sonnet-4-5"
//! key_secret = "file:/etc/tollgate/keys/anthropic"   # or "env:ANTHROPIC_API_KEY"
//! max_sensitivity = "low"    # optional: the host's own cap, below any receipt's grant
//! redact = false             # true: detected spans are replaced before the text leaves
//!
//! [[route]]
//! name = "local"
//! kind = "local"
//! preset = "vllm"            # ollama | vllm | llamacpp | lmstudio (OpenAI-compatible)
//! endpoint = "http://127.0.0.1:8000"                 # or "unix:/run/llama/llama.sock"
//! model = "Qwen/Qwen2.5-7B-Instruct"
//! ```

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Sensitivity;

/// Names no route may take: they mean "let the router choose" or "every route".
pub const RESERVED_ROUTE_NAMES: [&str; 2] = ["auto", "*"];

/// Why a routes file is unusable: one line naming the field and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutesError {
    /// The file is not valid TOML for this format.
    #[error("{file}: {detail}")]
    Parse {
        /// The file.
        file: String,
        /// What the parser said.
        detail: String,
    },
    /// A field's value is not allowed.
    #[error("{file}: {field}: {detail}")]
    Invalid {
        /// The file.
        file: String,
        /// Which field (`route "name".endpoint`).
        field: String,
        /// Why, and what would do.
        detail: String,
    },
}

/// Whether a route's backend runs on this host or elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// On this host (loopback or a Unix socket): text sent to it stays here.
    Local,
    /// Elsewhere: text sent to it leaves the host.
    Cloud,
}

/// The wire format a route speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`).
    Openai,
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// The OpenAI Responses API (`POST /v1/responses`), `api = "openai-responses"`.
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
}

/// A known local server: how to probe its health and count tokens. All speak [`Api::Openai`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// Ollama (`GET /api/tags`; no tokenizer endpoint).
    Ollama,
    /// vLLM (`GET /health`, `POST /tokenize`).
    Vllm,
    /// llama.cpp server (`GET /health`, `POST /tokenize`).
    Llamacpp,
    /// LM Studio (`GET /v1/models`; no tokenizer endpoint).
    Lmstudio,
}

/// Where a route's backend is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// An origin (`scheme://host[:port]`), paths are appended.
    Http {
        /// Whether TLS is used.
        tls: bool,
        /// Host (an IP literal for local routes).
        host: String,
        /// Port.
        port: u16,
    },
    /// A Unix socket on this host.
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http { tls, host, port } => {
                let scheme = if *tls { "https" } else { "http" };
                if host.contains(':') {
                    write!(f, "{scheme}://[{host}]:{port}")
                } else {
                    write!(f, "{scheme}://{host}:{port}")
                }
            }
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Endpoint {
    /// Whether the endpoint is on this host: a Unix socket or a loopback IP literal.
    pub fn is_loopback(&self) -> bool {
        match self {
            Self::Unix(_) => true,
            Self::Http { host, .. } => host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
        }
    }
}

/// Where a route's key comes from; the value itself is read only by `tollgate_router_backends`' key loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The supervisor's environment variable of this name.
    Env(String),
    /// This file (root-owned, no group or other permissions).
    File(PathBuf),
}

impl KeySource {
    /// Parses `env:VARIABLE` or `file:/absolute/path`; the error never repeats the text (it
    /// may be a key pasted in by mistake).
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix("env:") {
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Ok(KeySource::Env(name.to_owned()));
            }
        } else if let Some(path) = text.strip_prefix("file:") {
            if Path::new(path).is_absolute() {
                return Ok(KeySource::File(PathBuf::from(path)));
            }
        }
        // The value is never repeated: it may be a key pasted in by mistake.
        Err(
            "name where the key is, as env:VARIABLE or file:/absolute/path (never the key itself)"
                .into(),
        )
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(name) => write!(f, "env:{name}"),
            Self::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// One route, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Its name, as receipts grant it.
    pub name: String,
    /// Local or cloud.
    pub kind: RouteKind,
    /// The wire format.
    pub api: Api,
    /// The local server it is, if a known one.
    pub preset: Option<Preset>,
    /// Where the backend is.
    pub endpoint: Endpoint,
    /// The model asked for.
    pub model: String,
    /// Where its key comes from (cloud routes always have one).
    pub key: Option<KeySource>,
    /// The host's own ceiling for this route, applied below any receipt's grant.
    pub max_sensitivity: Option<Sensitivity>,
    /// Whether detected spans are replaced before the text is sent.
    pub redact: bool,
    /// The model names this route claims (`models = ["gpt-*"]`): a call that asks for one of
    /// them (or for the route's own `model`) prefers this route. `*` matches any run of
    /// characters.
    pub models: Vec<String>,
}

impl Route {
    /// Whether a call asking for the model `name` is this route's: its own model, or a name
    /// one of its `models` patterns matches.
    pub fn claims(&self, name: &str) -> bool {
        name == self.model || self.models.iter().any(|pattern| glob_match(pattern, name))
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters (none
/// included) and everything else for itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let mut pieces = pattern.split('*');
    // Without a `*`, the one piece is the whole name.
    let first = pieces.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Most bytes of one `models` pattern.
const MAX_PATTERN: usize = 128;

/// Why `pattern` cannot be a `models` entry, if it cannot.
fn pattern_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN {
        return Some(format!("{pattern:?}: a pattern has 1-{MAX_PATTERN} bytes"));
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!(
            "{pattern:?}: a pattern has no spaces or control characters"
        ));
    }
    if pattern.chars().all(|c| c == '*') {
        return Some(format!(
            "{pattern:?} would claim every name: leave names nobody claims to `auto` instead"
        ));
    }
    if glob_match(pattern, "auto") {
        return Some(format!(
            "{pattern:?} matches \"auto\", which always lets the router choose"
        ));
    }
    None
}

/// Limits every model call is held to, and how sensitive the classifier rates what it finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Cloud routes are never used, even when granted.
    pub force_local: bool,
    /// Completion tokens asked for when a call names none.
    pub max_tokens_default: u32,
    /// Most completion tokens one call may ask for.
    pub max_tokens_limit: u32,
    /// The level each detector reports where it differs from the default, by detector id.
    pub levels: std::collections::BTreeMap<String, Sensitivity>,
    /// Names that mark internal hosts (default: the classifier's list).
    pub internal_suffixes: Option<Vec<String>>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            force_local: false,
            max_tokens_default: 1024,
            max_tokens_limit: 8192,
            levels: std::collections::BTreeMap::new(),
            internal_suffixes: None,
        }
    }
}

impl Policy {
    /// The classifier this policy asks for: the built-in detectors at its levels.
    pub fn classifier_config(&self) -> crate::ClassifierConfig {
        let defaults = crate::ClassifierConfig::default();
        crate::ClassifierConfig {
            levels: self.levels.clone(),
            internal_suffixes: self
                .internal_suffixes
                .clone()
                .unwrap_or(defaults.internal_suffixes.clone()),
            ..defaults
        }
    }
}

/// A validated routes file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Routes {
    /// The policy.
    pub policy: Policy,
    /// The routes, in the file's order (earlier ranks higher within a kind for `auto`).
    pub routes: Vec<Route>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    route: Vec<RawRoute>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    force_local: Option<bool>,
    max_tokens_default: Option<u32>,
    max_tokens_limit: Option<u32>,
    #[serde(default)]
    levels: std::collections::BTreeMap<String, String>,
    internal_suffixes: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: String,
    kind: RouteKind,
    api: Option<Api>,
    preset: Option<Preset>,
    endpoint: String,
    model: String,
    key_secret: Option<String>,
    max_sensitivity: Option<String>,
    #[serde(default)]
    redact: bool,
    /// Spanned: a bad pattern's error names its line.
    #[serde(default)]
    models: Vec<toml::Spanned<String>>,
}

/// The error for `field` of the routes file `file`.
fn invalid(file: &str, field: String, detail: String) -> RoutesError {
    RoutesError::Invalid {
        file: file.to_owned(),
        field,
        detail,
    }
}

impl RawPolicy {
    /// The policy with its defaults filled in, checked.
    fn check(self, file: &str) -> Result<Policy, RoutesError> {
        let defaults = Policy::default();
        let mut levels = std::collections::BTreeMap::new();
        for (detector, level) in self.levels {
            let level = match level.to_ascii_lowercase().as_str() {
                "low" => Sensitivity::Low,
                "medium" => Sensitivity::Medium,
                "high" => Sensitivity::High,
                _ => {
                    return Err(invalid(
                        file,
                        format!("policy.levels.{detector}"),
                        format!("{level:?} must be low, medium or high"),
                    ))
                }
            };
            levels.insert(detector, level);
        }
        let policy = Policy {
            force_local: self.force_local.unwrap_or(defaults.force_local),
            max_tokens_default: self
                .max_tokens_default
                .unwrap_or(defaults.max_tokens_default),
            max_tokens_limit: self.max_tokens_limit.unwrap_or(defaults.max_tokens_limit),
            levels,
            internal_suffixes: self.internal_suffixes,
        };
        // Unknown detector ids and bad suffixes are refused here, not at the first call.
        if let Err(e) = crate::Classifier::new(&policy.classifier_config()) {
            return Err(invalid(
                file,
                "policy".into(),
                format!("{e} (`tollgate classify --explain-policy` lists the detectors)"),
            ));
        }
        if policy.max_tokens_default == 0 || policy.max_tokens_default > policy.max_tokens_limit {
            return Err(invalid(
                file,
                "policy.max_tokens_default".into(),
                format!(
                    "{} must be between 1 and max_tokens_limit ({})",
                    policy.max_tokens_default, policy.max_tokens_limit
                ),
            ));
        }
        Ok(policy)
    }
}

impl RawRoute {
    /// The route this entry describes, checked on its own and against the routes before it
    /// (`earlier`).
    fn check(self, file: &str, text: &str, earlier: &[Route]) -> Result<Route, RoutesError> {
        let field = |name: &str| format!("route {:?}.{name}", self.name);
        if !valid_name(&self.name) || RESERVED_ROUTE_NAMES.contains(&self.name.as_str()) {
            return Err(invalid(
                file,
                field("name"),
                "use 1-64 of a-z 0-9 _ . - (\"auto\" and \"*\" are reserved)".into(),
            ));
        }
        if earlier.iter().any(|r| r.name == self.name) {
            return Err(invalid(file, field("name"), "defined twice".into()));
        }
        let (api, endpoint) = self.transport(file, &field)?;
        if self.model.trim().is_empty() {
            return Err(invalid(
                file,
                field("model"),
                "name the model to ask for".into(),
            ));
        }
        let key = self
            .key_secret
            .as_deref()
            .map(KeySource::parse)
            .transpose()
            .map_err(|detail| invalid(file, field("key_secret"), detail))?;
        if self.kind == RouteKind::Cloud && key.is_none() {
            return Err(invalid(
                file,
                field("key_secret"),
                "a cloud route needs its key: key_secret = \"env:VARIABLE\" or \"file:/path\""
                    .into(),
            ));
        }
        let max_sensitivity = match self.max_sensitivity.as_deref() {
            None => None,
            Some("low") => Some(Sensitivity::Low),
            Some("medium") => Some(Sensitivity::Medium),
            Some("high") => Some(Sensitivity::High),
            Some(other) => {
                return Err(invalid(
                    file,
                    field("max_sensitivity"),
                    format!("{other:?}: use low, medium or high"),
                ))
            }
        };
        for pattern in &self.models {
            if let Some(problem) = pattern_problem(pattern.get_ref()) {
                let line = text
                    .get(..pattern.span().start)
                    .map_or(0, |before| before.matches('\n').count() + 1);
                return Err(invalid(&format!("{file}:{line}"), field("models"), problem));
            }
        }
        Ok(Route {
            models: self
                .models
                .into_iter()
                .map(toml::Spanned::into_inner)
                .collect(),
            name: self.name,
            kind: self.kind,
            api,
            preset: self.preset,
            endpoint,
            model: self.model,
            key,
            max_sensitivity,
            redact: self.redact,
        })
    }

    /// The API and endpoint of this entry, checked against its kind and preset: a local
    /// route stays on this host, a cloud route uses TLS (or a loopback proxy) and no preset.
    fn transport(
        &self,
        file: &str,
        field: &dyn Fn(&str) -> String,
    ) -> Result<(Api, Endpoint), RoutesError> {
        let api = match (self.api, self.preset) {
            (Some(api), None) => api,
            (None, Some(_)) => Api::Openai,
            _ => {
                return Err(invalid(
                    file,
                    field("api"),
                    "give exactly one of api (openai, anthropic, openai-responses) and preset (ollama, vllm, llamacpp, lmstudio)".into(),
                ))
            }
        };
        let endpoint = parse_endpoint(&self.endpoint)
            .map_err(|detail| invalid(file, field("endpoint"), detail))?;
        match self.kind {
            RouteKind::Local if !endpoint.is_loopback() => {
                return Err(invalid(
                    file,
                    field("endpoint"),
                    format!("{endpoint} is not on this host: a local route's endpoint is a loopback IP (127.0.0.1, [::1]) or a unix: socket"),
                ))
            }
            RouteKind::Cloud => match &endpoint {
                Endpoint::Http { tls: false, .. } if !endpoint.is_loopback() => {
                    return Err(invalid(
                        file,
                        field("endpoint"),
                        format!("{endpoint}: a cloud route uses https:// (plain http only to a loopback proxy)"),
                    ))
                }
                Endpoint::Unix(_) => {
                    return Err(invalid(
                        file,
                        field("kind"),
                        "a unix: socket is on this host: make the route local".into(),
                    ))
                }
                _ => {}
            },
            RouteKind::Local => {}
        }
        if self.kind == RouteKind::Cloud && self.preset.is_some() {
            return Err(invalid(
                file,
                field("preset"),
                "presets name local servers; a cloud route gives api".into(),
            ));
        }
        Ok((api, endpoint))
    }
}

fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    if let Some(path) = text.strip_prefix("unix:") {
        let path = Path::new(path);
        if !path.is_absolute() {
            return Err(format!(
                "{text:?}: a Unix socket path must be absolute (unix:/run/x.sock)"
            ));
        }
        return Ok(Endpoint::Unix(path.to_owned()));
    }
    let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = text.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!(
            "{text:?}: use http://HOST:PORT, https://HOST[:PORT] or unix:/ABS/PATH"
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') || rest.contains('?') || rest.contains('@') {
        return Err(format!(
            "{text:?}: give the origin only (scheme, host, port); the API paths are added"
        ));
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("{text:?}: unclosed '[' in an IPv6 address"))?;
        (host, after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{text:?}: no host"));
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{text:?}: {port:?} is not a port"))?,
        None if tls => 443,
        None => 80,
    };
    // `localhost` is pinned, never resolved: a resolver must not decide where text goes.
    let host = if host.eq_ignore_ascii_case("localhost") {
        "127.0.0.1".to_owned()
    } else {
        host.to_ascii_lowercase()
    };
    Ok(Endpoint::Http { tls, host, port })
}

/// Whether `name` may name a route.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

impl Routes {
    /// Reads and validates a routes file.
    pub fn load(path: &Path) -> Result<Self, RoutesError> {
        let text = std::fs::read_to_string(path).map_err(|e| RoutesError::Parse {
            file: path.display().to_string(),
            detail: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates the text of a routes file (`file` names it in errors).
    pub fn parse(text: &str, file: &str) -> Result<Self, RoutesError> {
        let raw: RawFile = tollgate_receipt::spec::parse_toml(text).map_err(|problem| {
            RoutesError::Parse {
                // `routes.toml:3`: the line where the TOML was wrong.
                file: match problem.line {
                    0 => file.to_owned(),
                    line => format!("{file}:{line}"),
                },
                detail: problem.to_string(),
            }
        })?;
        let policy = raw.policy.check(file)?;
        let mut routes: Vec<Route> = Vec::new();
        for raw in raw.route {
            let route = raw.check(file, text, &routes)?;
            routes.push(route);
        }
        Ok(Self { policy, routes })
    }

    /// The route named `name`.
    pub fn get(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [policy]
        force_local = true
        max_tokens_default = 256

        [[route]]
        name = "claude"
        kind = "cloud"
        api = "anthropic"
        endpoint = "https://api.anthropic.com"
        model = "claude-sonnet-4-5"
        key_secret = "env:ANTHROPIC_API_KEY"
        max_sensitivity = "low"
        redact = true

        [[route]]
        name = "local"
        kind = "local"
        preset = "vllm"
        endpoint = "http://localhost:8000/"
        model = "qwen"

        [[route]]
        name = "llama"
        kind = "local"
        preset = "llamacpp"
        endpoint = "unix:/run/llama.sock"
        model = "m"
    "#;

    fn error(text: &str) -> String {
        Routes::parse(text, "routes.toml").unwrap_err().to_string()
    }

    fn route(extra: &str) -> String {
        format!("[[route]]\nname = \"r\"\nmodel = \"m\"\n{extra}\n")
    }

    #[test]
    fn a_valid_file_parses() {
        let routes = Routes::parse(GOOD, "routes.toml").unwrap();
        assert!(routes.policy.force_local);
        assert_eq!(routes.policy.max_tokens_default, 256);
        assert_eq!(routes.policy.max_tokens_limit, 8192);
        let claude = routes.get("claude").unwrap();
        assert_eq!(
            (claude.kind, claude.api),
            (RouteKind::Cloud, Api::Anthropic)
        );
        assert_eq!(claude.endpoint.to_string(), "https://api.anthropic.com:443");
        assert_eq!(claude.key, Some(KeySource::Env("ANTHROPIC_API_KEY".into())));
        assert_eq!(claude.max_sensitivity, Some(Sensitivity::Low));
        assert!(claude.redact);
        let local = routes.get("local").unwrap();
        assert_eq!((local.api, local.preset), (Api::Openai, Some(Preset::Vllm)));
        assert_eq!(
            local.endpoint.to_string(),
            "http://127.0.0.1:8000",
            "localhost is pinned"
        );
        assert_eq!(
            routes.get("llama").unwrap().endpoint,
            Endpoint::Unix("/run/llama.sock".into())
        );
        assert_eq!(Routes::parse("", "r.toml").unwrap(), Routes::default());
    }

    #[test]
    fn a_toml_mistake_names_its_line_and_key() {
        let text = format!(
            "{}{}",
            route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\""),
            "[[route]]\nname = \"s\"\nmodel = [1]\n"
        );
        assert_eq!(
            error(&text),
            "routes.toml:9: route[1].model: invalid type: sequence, expected a string"
        );
    }

    #[test]
    fn each_mistake_names_its_field() {
        let cases = [
            (format!("{}{}", route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\""), route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"")), "route \"r\".name: defined twice"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"").replace("\"r\"", "\"auto\""), "reserved"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://10.0.0.5:8000\""), "route \"r\".endpoint: http://10.0.0.5:8000 is not on this host"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://models.lan:8000\""), "is not on this host"),
            (route("kind = \"cloud\"\napi = \"openai\"\nendpoint = \"http://api.openai.com\"\nkey_secret = \"env:K\""), "a cloud route uses https://"),
            (route("kind = \"cloud\"\napi = \"openai\"\nendpoint = \"https://api.openai.com\""), "route \"r\".key_secret: a cloud route needs its key"),
            (route("kind = \"cloud\"\napi = \"openai\"\nendpoint = \"https://api.openai.com\"\nkey_secret = \"sk-live-abc\""), "never the key itself"),
            (route("kind = \"local\"\nendpoint = \"http://127.0.0.1:1\""), "route \"r\".api: give exactly one of api"),
            (route("kind = \"local\"\napi = \"openai\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\""), "give exactly one of api"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1/v1\""), "give the origin only"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\ncolour = \"red\""), "unknown field `colour`"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmax_sensitivity = \"secret\""), "use low, medium or high"),
            (route("kind = \"cloud\"\npreset = \"vllm\"\nendpoint = \"https://x.example\"\nkey_secret = \"env:K\""), "presets name local servers"),
            ("[policy]\nmax_tokens_default = 9000\n".to_owned(), "policy.max_tokens_default"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmodels = [\"\"]"), "routes.toml:7: route \"r\".models: \"\": a pattern has 1-128 bytes"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmodels = [\"gpt 4\"]"), "no spaces"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmodels = [\"**\"]"), "would claim every name"),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmodels = [\"a*o\"]"), "matches \"auto\""),
            (route("kind = \"local\"\npreset = \"vllm\"\nendpoint = \"http://127.0.0.1:1\"\nmodels = \"gpt-*\""), "expected a sequence"),
        ];
        assert!(!error(&route("kind = \"cloud\"\napi = \"openai\"\nendpoint = \"https://api.openai.com\"\nkey_secret = \"sk-live-abc\"")).contains("sk-live-abc"), "a pasted key is never repeated");
        for (text, needle) in cases {
            let message = error(&text);
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
            assert!(message.starts_with("routes.toml:"), "{message}");
        }
    }

    #[test]
    fn routes_claim_model_names_by_pattern() {
        let routes = Routes::parse(
            &format!(
                "{}api = \"openai-responses\"\nkind = \"cloud\"\nendpoint = \"https://api.openai.com\"\nkey_secret = \"env:K\"\nmodels = [\"gpt-*\", \"o*-mini\", \"codex-mini-latest\"]\n",
                route("")
            ),
            "routes.toml",
        )
        .unwrap();
        let r = routes.get("r").unwrap();
        assert_eq!(r.api, Api::OpenaiResponses);
        for name in [
            "m",
            "gpt-5",
            "gpt-",
            "o4-mini",
            "o3-mini",
            "codex-mini-latest",
        ] {
            assert!(r.claims(name), "{name}");
        }
        for name in [
            "gpt",
            "o4-mini-high",
            "codex-mini",
            "claude-opus-4",
            "xgpt-5",
        ] {
            assert!(!r.claims(name), "{name}");
        }
        assert!(glob_match("a*b*c", "abc") && glob_match("a*b*c", "a-b-b-c"));
        assert!(!glob_match("a*b*c", "a-c") && !glob_match("ab*ba", "aba"));
        assert!(glob_match("*-mini", "o4-mini") && glob_match("x", "x") && !glob_match("x", "xy"));
    }
}
