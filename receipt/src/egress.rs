//! Egress grants: where a run may connect. One set of rules for everyone who reads them — the
//! authority (shape, defaults and ceilings), delegation (a child within its parent) and the
//! supervisor (each connection, when it is made) — so what is signed and what is enforced
//! cannot drift apart.
//!
//! A grant's `host` is an exact DNS name, `*.` and a suffix, or a literal address; only a
//! literal address can reach an address that is not public (see [`is_public`]): a name that
//! resolves to one is refused, so a grant of a name never becomes a way into the host's own
//! network (SSRF, DNS rebinding).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tollgate_proto::v1 as pb;

/// The port a grant that names none allows.
pub const DEFAULT_PORT: u32 = 443;
/// Most egress grants one receipt or ceiling may carry.
pub const MAX_GRANTS: usize = 64;
/// Most ports, methods or paths one grant may list.
pub const MAX_LIST: usize = 32;
/// Longest path prefix a grant may name.
pub const MAX_PATH: usize = 512;
/// Longest DNS name (RFC 1035, without the trailing dot).
pub const MAX_NAME: usize = 253;

/// A host a connection asks for: a DNS name (lower case, no trailing dot) or an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name.
    Name(String),
    /// A literal address.
    Address(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Address(address) => write!(f, "{address}"),
        }
    }
}

/// Whether `name` is a DNS name as grants and connections use it: labels of letters, digits
/// and `-` (not at either end), 1 to 63 characters, joined by `.`; at most [`MAX_NAME`]
/// characters. Lower case only (the caller folds case), no trailing dot.
fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        // An all-digit last label would be read as an address by some resolvers.
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

impl Host {
    /// The host a client named: case folded, one trailing dot dropped, IPv6 brackets removed.
    /// Anything else that is not a DNS name or an address is refused, with why.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.strip_suffix('.').unwrap_or(text);
        let unbracketed = trimmed
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(trimmed);
        if let Ok(address) = unbracketed.parse::<IpAddr>() {
            return Ok(Self::Address(canonical(address)));
        }
        let name = trimmed.to_ascii_lowercase();
        if is_dns_name(&name) {
            Ok(Self::Name(name))
        } else {
            Err(format!(
                "{:?} is not a DNS name or an IP address",
                truncate(text, 64)
            ))
        }
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is that IPv4 address: checked and
/// matched as such, so the mapped form is never a way around a rule.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn truncate(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// What a grant's `host` covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `*` (ceilings only): every host.
    Any,
    /// Exactly this name.
    Exact(String),
    /// Every name ending in `.` and this suffix (not the suffix itself).
    Suffix(String),
    /// This address only.
    Address(IpAddr),
}

impl HostPattern {
    /// Parses a grant's `host`; `*` only when `ceiling`.
    pub fn parse(text: &str, ceiling: bool) -> Result<Self, String> {
        if text == "*" {
            return if ceiling {
                Ok(Self::Any)
            } else {
                Err("\"*\" is a ceiling wildcard; name the host, or \"*.\" and a suffix".into())
            };
        }
        if let Some(suffix) = text.strip_prefix("*.") {
            return if is_dns_name(suffix) {
                Ok(Self::Suffix(suffix.to_owned()))
            } else {
                Err(format!(
                    "{:?}: after \"*.\" comes a lower-case DNS name, e.g. \"*.example.com\"",
                    truncate(text, 64)
                ))
            };
        }
        if let Ok(address) = text.parse::<IpAddr>() {
            return Ok(Self::Address(canonical(address)));
        }
        if is_dns_name(text) {
            Ok(Self::Exact(text.to_owned()))
        } else {
            Err(format!(
                "{:?} is not a lower-case DNS name (\"api.example.com\"), \"*.\" and a suffix, or an IP address",
                truncate(text, 64)
            ))
        }
    }

    /// Whether a connection to `host` is covered.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (Self::Any, _) => true,
            (Self::Exact(name), Host::Name(asked)) => name == asked,
            (Self::Suffix(suffix), Host::Name(asked)) => asked
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Self::Address(address), Host::Address(asked)) => address == asked,
            _ => false,
        }
    }

    /// Whether every host `other` covers, this covers too (ceilings and delegation).
    pub fn covers(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Any, _) => true,
            (_, Self::Any) => false,
            (Self::Suffix(suffix), Self::Suffix(narrower)) => {
                narrower == suffix
                    || Self::Suffix(suffix.clone()).matches(&Host::Name(narrower.clone()))
            }
            (pattern, Self::Exact(name)) => pattern.matches(&Host::Name(name.clone())),
            (pattern, Self::Address(address)) => pattern.matches(&Host::Address(*address)),
            _ => false,
        }
    }
}

/// Whether an address is public: not loopback, unspecified, private (RFC 1918, IPv6 unique
/// local), link-local (which holds the cloud metadata service, 169.254.169.254), shared
/// (CGNAT, 100.64.0.0/10), "this network" (0.0.0.0/8), benchmarking (198.18.0.0/15),
/// reserved (240.0.0.0/4), broadcast or multicast, nor an IPv6 form that embeds or stands
/// for one of those (IPv4-mapped, IPv4-compatible, NAT64 well-known prefix, 6to4). Only a
/// grant naming the literal address may reach one that is not.
pub fn is_public(address: IpAddr) -> bool {
    match canonical(address) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, _, _] = v4.octets();
    !(v4.is_unspecified()
        || v4.is_loopback()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_broadcast()
        || v4.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    let segments = v6.segments();
    let embedded_v4 = |high: usize| {
        Ipv4Addr::new(
            (segments[high] >> 8) as u8,
            segments[high] as u8,
            (segments[high + 1] >> 8) as u8,
            segments[high + 1] as u8,
        )
    };
    if v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() {
        return false;
    }
    // fc00::/7 unique local (holds fd00:ec2::254, a cloud's metadata), fe80::/10 link-local,
    // fec0::/10 the old site-local.
    if (segments[0] & 0xfe00) == 0xfc00
        || (segments[0] & 0xffc0) == 0xfe80
        || (segments[0] & 0xffc0) == 0xfec0
    {
        return false;
    }
    // ::a.b.c.d (IPv4-compatible) and 64:ff9b::a.b.c.d (NAT64) reach that IPv4 address.
    if segments[..6] == [0; 6] || segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded_v4(6));
    }
    // 2002:a.b.c.d::/48 (6to4) reaches that IPv4 address's network.
    if segments[0] == 0x2002 {
        return is_public_v4(embedded_v4(1));
    }
    true
}

/// Why a list of egress grants cannot be signed: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct EgressError {
    /// Dotted path of the field, e.g. `egress[0].host`.
    pub field: String,
    /// What is wrong and what to write instead.
    pub reason: String,
}

fn error(field: String, reason: impl Into<String>) -> EgressError {
    EgressError {
        field,
        reason: reason.into(),
    }
}

/// Whether `name` names a secret: letters, digits, `.`, `_` and `-`, 1 to 64 characters.
pub fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks grants (a request's when `ceiling` is false, a ceiling's when true, `prefix`
/// naming where they are: `""`, `"ceiling."`) and fills in what a signed receipt always
/// says: ports ([`DEFAULT_PORT`] when none; in a ceiling none means every port), the sensitivity (LOW when unset) and `inspect`
/// (set when `inject`, `methods` or `paths` needs it). Methods are folded to upper case.
pub fn normalise(
    grants: &mut [pb::EgressGrant],
    prefix: &str,
    ceiling: bool,
) -> Result<(), EgressError> {
    if grants.len() > MAX_GRANTS {
        return Err(error(
            format!("{prefix}egress"),
            format!("at most {MAX_GRANTS} grants"),
        ));
    }
    for (i, grant) in grants.iter_mut().enumerate() {
        let field = |name: &str| format!("{prefix}egress[{i}].{name}");
        HostPattern::parse(&grant.host, ceiling).map_err(|reason| error(field("host"), reason))?;
        // In a ceiling, no ports means every port.
        if grant.ports.is_empty() && !ceiling {
            grant.ports.push(DEFAULT_PORT);
        }
        if grant.ports.len() > MAX_LIST {
            return Err(error(field("ports"), format!("at most {MAX_LIST} ports")));
        }
        if let Some(port) = grant.ports.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(error(
                field("ports"),
                format!("{port} is not a port (1 to 65535)"),
            ));
        }
        grant.ports.sort_unstable();
        grant.ports.dedup();
        match pb::Sensitivity::try_from(grant.max_sensitivity) {
            Ok(pb::Sensitivity::Unspecified) => grant.max_sensitivity = pb::Sensitivity::Low as i32,
            Ok(_) => {}
            Err(_) => {
                return Err(error(
                    field("max_sensitivity"),
                    "must be LOW, MEDIUM or HIGH",
                ));
            }
        }
        // In a ceiling, "*" lets operators name any of the supervisor's secrets.
        let names_a_secret = grant.inject.is_empty()
            || is_secret_name(&grant.inject)
            || (ceiling && grant.inject == "*");
        if !names_a_secret {
            return Err(error(
                field("inject"),
                "must name a secret of the supervisor's configuration: letters, digits, '.', '_' and '-', 1 to 64 characters",
            ));
        }
        if grant.methods.len() > MAX_LIST || grant.paths.len() > MAX_LIST {
            return Err(error(
                field(if grant.paths.len() > MAX_LIST {
                    "paths"
                } else {
                    "methods"
                }),
                format!("at most {MAX_LIST} entries"),
            ));
        }
        for method in &mut grant.methods {
            method.make_ascii_uppercase();
            // RFC 9110 methods are tokens; these letters are all any real one uses.
            if method.is_empty()
                || method.len() > 32
                || !method
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
            {
                return Err(error(
                    field("methods"),
                    format!(
                        "{:?} is not an HTTP method like \"GET\"",
                        truncate(method, 40)
                    ),
                ));
            }
        }
        for path in &grant.paths {
            if !is_path_prefix(path) {
                return Err(error(
                    field("paths"),
                    format!(
                        "{:?} must start with '/', hold only printable ASCII without spaces, '%', '?', '#' or a \"..\" segment, and be at most {MAX_PATH} characters",
                        truncate(path, 64)
                    ),
                ));
            }
        }
        // A request's grant is inspected when anything needs it; a ceiling's entry requires
        // inspection when it restricts methods or paths (which only inspection can hold), not
        // because it allows a secret.
        let needs_inspection = if ceiling {
            !grant.methods.is_empty() || !grant.paths.is_empty()
        } else {
            grant.is_inspected()
        };
        if needs_inspection {
            grant.inspect = true;
        }
    }
    Ok(())
}

/// A path prefix a grant may name: what a request's path is compared with, byte for byte,
/// after the supervisor has refused requests whose paths it would have to decode.
fn is_path_prefix(path: &str) -> bool {
    path.starts_with('/')
        && path.len() <= MAX_PATH
        && path
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'%' | b'?' | b'#'))
        && !path
            .split('/')
            .any(|segment| segment == ".." || segment == ".")
}

/// Whether `narrower` is within `wider` (a child grant within its parent's, or a requested
/// grant within a ceiling entry); if not, why.
pub fn within(
    narrower: &pb::EgressGrant,
    wider: &pb::EgressGrant,
    wider_is_ceiling: bool,
) -> Result<(), String> {
    let (Ok(outer), Ok(inner)) = (
        HostPattern::parse(&wider.host, wider_is_ceiling),
        HostPattern::parse(&narrower.host, false),
    ) else {
        return Err("not a valid host".into());
    };
    if !outer.covers(&inner) {
        return Err(format!("{} does not cover it", wider.host));
    }
    let any_port = wider_is_ceiling && wider.ports.is_empty();
    if let Some(port) = narrower
        .ports
        .iter()
        .find(|p| !any_port && !wider.ports.contains(p))
    {
        return Err(format!(
            "port {port} is not among {}'s {:?}",
            wider.host, wider.ports
        ));
    }
    if narrower.max_sensitivity > wider.max_sensitivity || narrower.max_sensitivity == 0 {
        return Err(format!(
            "{} may carry text up to {}",
            wider.host,
            tollgate_proto::sensitivity_name(wider.max_sensitivity)
        ));
    }
    if wider.ask && !narrower.ask {
        return Err(format!(
            "{} asks an operator before each connection; so must this (ask = true)",
            wider.host
        ));
    }
    if wider.inspect && !narrower.is_inspected() {
        return Err(format!(
            "{} is inspected; so must this be (inspect = true)",
            wider.host
        ));
    }
    let any_secret = wider_is_ceiling && wider.inject == "*";
    if !narrower.inject.is_empty() && narrower.inject != wider.inject && !any_secret {
        return Err(format!(
            "{} does not inject secret {:?}",
            wider.host, narrower.inject
        ));
    }
    if !wider.methods.is_empty() {
        if narrower.methods.is_empty() {
            return Err(format!(
                "{} allows only methods {:?}",
                wider.host, wider.methods
            ));
        }
        if let Some(method) = narrower.methods.iter().find(|m| !wider.methods.contains(m)) {
            return Err(format!("method {method} is not among {:?}", wider.methods));
        }
    }
    if !wider.paths.is_empty() {
        if narrower.paths.is_empty() {
            return Err(format!(
                "{} allows only paths beneath {:?}",
                wider.host, wider.paths
            ));
        }
        if let Some(path) = narrower.paths.iter().find(|p| {
            !wider
                .paths
                .iter()
                .any(|prefix| p.starts_with(prefix.as_str()))
        }) {
            return Err(format!("path {path} is not beneath {:?}", wider.paths));
        }
    }
    Ok(())
}

/// Whether `grant` is within one of `wider` (a parent's grants, or a ceiling's when
/// `ceiling`); if not, why: the reason of the entry whose host covers it, when one does.
pub fn covered(
    grant: &pb::EgressGrant,
    wider: &[pb::EgressGrant],
    ceiling: bool,
) -> Result<(), String> {
    let mut why = format!("nothing grants egress to {}", grant.host);
    let inner = HostPattern::parse(&grant.host, false).ok();
    // An entry that asks binds every grant it overlaps, whatever else covers it too: asking
    // wins over allowing.
    if !grant.ask {
        if let Some(asking) = wider.iter().find(|entry| {
            entry.ask
                && HostPattern::parse(&entry.host, ceiling)
                    .ok()
                    .zip(inner.as_ref())
                    .is_some_and(|(outer, inner)| outer.covers(inner) || inner.covers(&outer))
        }) {
            return Err(format!(
                "{} asks an operator before each connection; so must this (ask = true)",
                asking.host
            ));
        }
    }
    for entry in wider {
        match within(grant, entry, ceiling) {
            Ok(()) => return Ok(()),
            Err(reason) => {
                let outer = HostPattern::parse(&entry.host, ceiling).ok();
                if let (Some(outer), Some(inner)) = (&outer, &inner) {
                    if outer.covers(inner) {
                        why = reason;
                    }
                }
            }
        }
    }
    Err(why)
}

/// The grant a connection to `host`:`port` is served under: the most specific that allows
/// it — an exact name or address before any suffix, a longer suffix before a shorter one, an
/// inspected grant before an opaque one of the same host — so a narrower rule the receipt
/// states for a host (its secret, methods, paths) is never bypassed through a wider grant that
/// also covers it.
pub fn grant_for<'a>(
    grants: &'a [pb::EgressGrant],
    host: &Host,
    port: u16,
) -> Option<&'a pb::EgressGrant> {
    grants
        .iter()
        .filter_map(|grant| {
            let pattern = HostPattern::parse(&grant.host, false).ok()?;
            if !grant.ports.contains(&u32::from(port)) || !pattern.matches(host) {
                return None;
            }
            let specificity = match pattern {
                HostPattern::Exact(_) | HostPattern::Address(_) => usize::MAX,
                HostPattern::Suffix(suffix) => suffix.len(),
                HostPattern::Any => 0,
            };
            Some(((specificity, grant.is_inspected()), grant))
        })
        // The first of equals wins: `max_by_key` keeps the last, so compare in reverse.
        .rev()
        .max_by_key(|(rank, _)| *rank)
        .map(|(_, grant)| grant)
}

/// A grant as one line: `egress[1] = *.example.com:443,8443`.
pub fn describe(index: usize, grant: &pb::EgressGrant) -> String {
    let ports: Vec<String> = grant.ports.iter().map(u32::to_string).collect();
    format!("egress[{index}] = {}:{}", grant.host, ports.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(host: &str) -> pb::EgressGrant {
        let mut grants = [pb::EgressGrant {
            host: host.into(),
            ..Default::default()
        }];
        normalise(&mut grants, "", false).unwrap();
        grants[0].clone()
    }

    #[test]
    fn a_host_that_asks_binds_every_grant_it_overlaps() {
        let asking = |host: &str| pb::EgressGrant {
            ask: true,
            ..grant(host)
        };
        let entry = |host: &str, ask: bool| {
            let mut entries = [pb::EgressGrant {
                host: host.into(),
                max_sensitivity: pb::Sensitivity::High as i32,
                ask,
                ..Default::default()
            }];
            normalise(&mut entries, "ceiling.", true).unwrap();
            entries[0].clone()
        };
        let ceiling = [entry("*", false), entry("*.push.example", true)];
        assert!(covered(&grant("api.example"), &ceiling, true).is_ok());
        let refused = covered(&grant("git.push.example"), &ceiling, true).unwrap_err();
        assert!(refused.contains("ask = true"), "{refused}");
        assert!(covered(&asking("git.push.example"), &ceiling, true).is_ok());
        // A wildcard grant would reach the asking hosts too.
        let wide = [entry("*", false), entry("git.push.example", true)];
        assert!(covered(&grant("*.example"), &wide, true).is_err());
        // A delegated child under an asking parent grant asks too.
        assert!(within(&grant("api.example"), &asking("api.example"), false).is_err());
    }

    #[test]
    fn hosts_parse_strictly() {
        assert_eq!(
            Host::parse("PyPI.org.").unwrap(),
            Host::Name("pypi.org".into())
        );
        assert_eq!(
            Host::parse("[::ffff:10.0.0.1]").unwrap(),
            Host::Address("10.0.0.1".parse().unwrap())
        );
        for bad in [
            "",
            "a b",
            "-x.com",
            "x..com",
            "x.com/",
            "1.2.3.400",
            "user@x.com",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad}");
        }
        assert!(HostPattern::parse("*", false).is_err());
        assert_eq!(HostPattern::parse("*", true).unwrap(), HostPattern::Any);
        assert!(
            HostPattern::parse("Example.com", false).is_err(),
            "upper case in a grant"
        );
        assert!(HostPattern::parse("*.", false).is_err());
        assert!(HostPattern::parse("a.*.com", false).is_err());
    }

    #[test]
    fn a_suffix_matches_names_beneath_it_only() {
        let pattern = HostPattern::parse("*.example.com", false).unwrap();
        assert!(pattern.matches(&Host::parse("api.example.com").unwrap()));
        assert!(pattern.matches(&Host::parse("a.b.example.com").unwrap()));
        assert!(!pattern.matches(&Host::parse("example.com").unwrap()));
        assert!(!pattern.matches(&Host::parse("evilexample.com").unwrap()));
        assert!(!pattern.matches(&Host::parse("93.184.216.34").unwrap()));
        assert!(pattern.covers(&HostPattern::parse("*.api.example.com", false).unwrap()));
        assert!(!pattern.covers(&HostPattern::parse("*.com", false).unwrap()));
        assert!(!HostPattern::parse("api.example.com", false)
            .unwrap()
            .covers(&pattern));
    }

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "198.18.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:0a00:0001::1",
            "ff02::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "203.0.113.80",
            "198.51.100.2",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn normalising_fills_defaults_and_names_bad_fields() {
        let g = grant("pypi.org");
        assert_eq!(g.ports, [443]);
        assert_eq!(g.max_sensitivity, pb::Sensitivity::Low as i32);
        assert!(!g.inspect);
        let mut grants = [pb::EgressGrant {
            host: "api.github.com".into(),
            methods: vec!["get".into()],
            ..Default::default()
        }];
        normalise(&mut grants, "", false).unwrap();
        assert_eq!(grants[0].methods, ["GET"]);
        assert!(grants[0].inspect, "methods imply inspection");
        for (grant, field) in [
            (
                pb::EgressGrant {
                    host: "*".into(),
                    ..Default::default()
                },
                "egress[0].host",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    ports: vec![0],
                    ..Default::default()
                },
                "egress[0].ports",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    inject: "a b".into(),
                    ..Default::default()
                },
                "egress[0].inject",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    paths: vec!["/a/../b".into()],
                    ..Default::default()
                },
                "egress[0].paths",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    paths: vec!["/a%2f".into()],
                    ..Default::default()
                },
                "egress[0].paths",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    methods: vec!["GET /".into()],
                    ..Default::default()
                },
                "egress[0].methods",
            ),
            (
                pb::EgressGrant {
                    host: "x.com".into(),
                    max_sensitivity: 9,
                    ..Default::default()
                },
                "egress[0].max_sensitivity",
            ),
        ] {
            assert_eq!(normalise(&mut [grant], "", false).unwrap_err().field, field);
        }
    }

    #[test]
    fn within_narrows_every_part() {
        let mut parent = grant("*.example.com");
        parent.ports = vec![443, 8443];
        parent.max_sensitivity = pb::Sensitivity::Medium as i32;
        let mut child = grant("api.example.com");
        assert!(within(&child, &parent, false).is_ok());
        child.ports = vec![80];
        assert!(within(&child, &parent, false)
            .unwrap_err()
            .contains("port 80"));
        child.ports = vec![8443];
        child.max_sensitivity = pb::Sensitivity::High as i32;
        assert!(within(&child, &parent, false).is_err());
        child.max_sensitivity = pb::Sensitivity::Low as i32;
        child.inject = "github".into();
        assert!(within(&child, &parent, false)
            .unwrap_err()
            .contains("inject"));
        child.inject.clear();
        parent.inspect = true;
        assert!(within(&child, &parent, false)
            .unwrap_err()
            .contains("inspect"));
        child.inspect = true;
        parent.methods = vec!["GET".into()];
        assert!(within(&child, &parent, false)
            .unwrap_err()
            .contains("methods"));
        child.methods = vec!["GET".into(), "POST".into()];
        assert!(within(&child, &parent, false).unwrap_err().contains("POST"));
        child.methods = vec!["GET".into()];
        parent.paths = vec!["/repos/acme/".into()];
        child.paths = vec!["/repos/acme/x/".into()];
        assert!(within(&child, &parent, false).is_ok());
        child.paths = vec!["/repos/other/".into()];
        assert!(within(&child, &parent, false).is_err());
        assert!(within(&grant("example.com"), &grant("*.example.com"), false).is_err());
        let mut any = grant("x.com");
        any.host = "*".into();
        any.ports = vec![443];
        assert!(within(&grant("10.0.0.1"), &any, true).is_ok());
    }

    #[test]
    fn a_connection_finds_its_grant_by_host_and_port() {
        let grants = [grant("pypi.org"), grant("*.pythonhosted.org")];
        let find = |host: &str, port| {
            grant_for(&grants, &Host::parse(host).unwrap(), port).map(|g| g.host.clone())
        };
        assert_eq!(find("pypi.org", 443).as_deref(), Some("pypi.org"));
        assert_eq!(
            find("files.pythonhosted.org", 443).as_deref(),
            Some("*.pythonhosted.org")
        );
        assert_eq!(find("pypi.org", 80), None);
        assert_eq!(find("pythonhosted.org", 443), None);
        assert_eq!(find("203.0.113.80", 443), None);
    }

    #[test]
    fn the_most_specific_grant_serves_a_connection() {
        let mut inspected = grant("api.example.com");
        inspected.inject = "github".into();
        normalise(std::slice::from_mut(&mut inspected), "", false).unwrap();
        let grants = [
            grant("*.example.com"),
            inspected,
            grant("*.api.example.com"),
        ];
        let chosen = |host: &str| {
            grant_for(&grants, &Host::parse(host).unwrap(), 443).map(|g| g.host.clone())
        };
        assert_eq!(
            chosen("api.example.com").as_deref(),
            Some("api.example.com"),
            "not through the wider opaque grant"
        );
        assert_eq!(
            chosen("v1.api.example.com").as_deref(),
            Some("*.api.example.com")
        );
        assert_eq!(chosen("www.example.com").as_deref(), Some("*.example.com"));
        let twins = [grant("x.example.com"), {
            let mut g = grant("x.example.com");
            g.inspect = true;
            g
        }];
        assert!(
            grant_for(&twins, &Host::parse("x.example.com").unwrap(), 443)
                .unwrap()
                .inspect
        );
    }
}
