//! What an inspected request must be before the supervisor checks it against its grant or
//! gives it a secret: it names exactly one host, the granted one (one `Host`, an absolute-form
//! target naming that host too, no header asking a server to route or rewrite by something
//! else), and goes on in origin form; under a grant's path rules its path is in the one
//! spelling every common server decodes the same way. Servers disagree on what a request
//! names (RFC 9112 §3.2.2 routes by an absolute-form target's host whatever `Host` says; a
//! CDN or reverse proxy in front of several sites honours `X-Forwarded-Host`; Tomcat drops
//! `;` parameters from each segment; some decode `%252e` twice or take `%c0%ae` for `.`):
//! anything two of them could read differently is refused rather than guessed at.

use http::header::HOST;
use http::{HeaderMap, Uri};
use tollgate_receipt::egress::Host;

/// Headers with which some server or proxy routes, or rewrites the path, by something other
/// than `Host` and the request target (lower case, as `http` names headers).
const OVERRIDES: &[&str] = &[
    "forwarded",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-forwarded-prefix",
    "x-forwarded-uri",
    "x-forwarded-path",
    "x-original-host",
    "x-original-url",
    "x-original-uri",
    "x-rewrite-url",
    "x-host",
    "x-http-host-override",
    "x-envoy-original-path",
];

/// Headers with which some servers take another method than the request line's.
const METHOD_OVERRIDES: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Why a request was refused before its grant's rules were looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestRule {
    /// `Host` appears more than once.
    #[error("the request has {0} Host headers; send exactly one, naming {1}")]
    HostRepeated(usize, String),
    /// Neither `Host` nor the target names a host.
    #[error("the request names no host; send Host: {0}")]
    NoHost(String),
    /// `Host` or an absolute-form target names another host or port.
    #[error(
        "the request's {0} names {1:?}, not {2}, the host and port this connection was granted for"
    )]
    OtherHost(&'static str, String, String),
    /// A header asks a server to route or rewrite by something else.
    #[error("the request carries {0}, which asks a server to route or rewrite it past its Host and path; send it without")]
    Override(String),
    /// A header asks a server to take another method, under a grant's method rules.
    #[error(
        "the request carries {0}, which asks a server for another method than {1}; send it without"
    )]
    MethodOverride(String, String),
    /// The target is neither origin form nor absolute form.
    #[error("the request target is not a path (origin form `/…`) or an absolute URL")]
    NotOriginForm,
    /// The path has a spelling servers decode differently.
    #[error("the path {0:?} {1}; paths under path rules are accepted in one plain spelling only")]
    PathSpelling(String, &'static str),
}

/// Checks that the request names exactly `granted` (at `port`) and nothing else, and
/// returns the target in origin form with the `Host` the request goes on with.
pub fn check_target(
    headers: &HeaderMap,
    uri: &Uri,
    granted: &Host,
    port: u16,
) -> Result<(Uri, String), RequestRule> {
    let shown = || format!("{granted}:{port}");
    let hosts: Vec<_> = headers.get_all(HOST).iter().collect();
    if hosts.len() > 1 {
        return Err(RequestRule::HostRepeated(hosts.len(), granted.to_string()));
    }
    let header = match hosts.first() {
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| RequestRule::OtherHost("Host", "(not text)".into(), shown()))?;
            let (host, named_port) = split_host(text);
            let names_granted = Host::parse(host).is_ok_and(|h| h == *granted)
                && named_port.is_none_or(|p| p == Some(port));
            if !names_granted {
                return Err(RequestRule::OtherHost("Host", clip(text), shown()));
            }
            Some(text.to_owned())
        }
        None => None,
    };
    let path_and_query = uri
        .path_and_query()
        .filter(|p| p.as_str().starts_with('/'))
        .ok_or(RequestRule::NotOriginForm)?;
    let absolute = match uri.authority() {
        None if uri.scheme().is_some() => return Err(RequestRule::NotOriginForm),
        None => None,
        Some(authority) => {
            let default = match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            };
            let named_port = authority.port_u16().or(default);
            let names_granted = Host::parse(authority.host()).is_ok_and(|h| h == *granted)
                && named_port == Some(port)
                && !authority.as_str().contains('@');
            if !names_granted {
                return Err(RequestRule::OtherHost(
                    "target",
                    clip(&uri.to_string()),
                    shown(),
                ));
            }
            Some(authority.as_str().to_owned())
        }
    };
    let host = header
        .or(absolute)
        .ok_or_else(|| RequestRule::NoHost(granted.to_string()))?;
    let origin = Uri::try_from(path_and_query.as_str()).map_err(|_| RequestRule::NotOriginForm)?;
    Ok((origin, host))
}

/// `host[:port]` (IPv6 in brackets): the host, and the port when one is written (`Some(None)`
/// when what follows the colon is not a port).
fn split_host(text: &str) -> (&str, Option<Option<u16>>) {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, tail)) => (&text[..inner.len() + 2], tail.strip_prefix(':')),
            None => (text, None),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    (
        host,
        port.map(|p| p.parse::<u16>().ok().filter(|p| *p != 0)),
    )
}

/// Refuses headers that ask a server to route or rewrite the request past its `Host` and
/// path, and, when the grant restricts methods (`method` is the request line's), those that
/// ask for another method.
pub fn check_overrides(
    headers: &HeaderMap,
    methods_restricted: bool,
    method: &str,
) -> Result<(), RequestRule> {
    if let Some(name) = OVERRIDES.iter().find(|name| headers.contains_key(**name)) {
        return Err(RequestRule::Override((*name).to_owned()));
    }
    if methods_restricted {
        if let Some(name) = METHOD_OVERRIDES
            .iter()
            .find(|name| headers.contains_key(**name))
        {
            return Err(RequestRule::MethodOverride(
                (*name).to_owned(),
                method.to_owned(),
            ));
        }
    }
    Ok(())
}

/// Accepts a path only in a spelling that every common decoding reads as the same segments,
/// none of them `.` or `..`: no `\`, no `;` parameters (Tomcat and Spring drop them from a
/// segment), no empty segment (servers that merge slashes see another path), and each
/// percent-escape well formed and decoding to a byte that is not a separator, `%` (a second
/// decoding would change it), `?`, `#` or a control, the whole valid UTF-8 (overlong forms
/// such as `%c0%ae` are not).
pub fn check_path_spelling(path: &str) -> Result<(), RequestRule> {
    let refuse = |why| Err(RequestRule::PathSpelling(clip(path), why));
    let Some(rest) = path.strip_prefix('/') else {
        return refuse("does not start with /");
    };
    if !path.is_ascii() || path.bytes().any(|b| b.is_ascii_control()) {
        return refuse("has bytes that are not printable ASCII");
    }
    if path.contains('\\') {
        return refuse("has a backslash");
    }
    if path.contains(';') {
        return refuse("has a ; (path parameters)");
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    for (at, segment) in segments.iter().enumerate() {
        // `/` alone, and a trailing slash, are an empty last segment.
        if segment.is_empty() && at != last {
            return refuse("has an empty segment (//)");
        }
        let decoded = match percent_decode(segment) {
            Ok(decoded) => decoded,
            Err(why) => return refuse(why),
        };
        if decoded == "." || decoded == ".." {
            return refuse("has a . or .. segment");
        }
    }
    Ok(())
}

/// One segment percent-decoded once, refused when that decoding holds what another decoding
/// (a second pass, a separator, overlong UTF-8) would read differently.
fn percent_decode(segment: &str) -> Result<String, &'static str> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'%' {
            out.push(bytes[at]);
            at += 1;
            continue;
        }
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or("has a % that is not followed by two hex digits")?;
        match hex {
            b'/' | b'\\' => return Err("has an encoded / or \\"),
            b'%' => return Err("has an encoded % (decoded twice it reads differently)"),
            b';' | b'?' | b'#' => return Err("has an encoded ;, ? or #"),
            b if b.is_ascii_control() => return Err("has an encoded control character"),
            b => out.push(b),
        }
        at += 3;
    }
    String::from_utf8(out)
        .map_err(|_| "decodes to bytes that are not UTF-8 (such as overlong forms)")
}

fn clip(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn granted() -> Host {
        Host::parse("api.example.test").unwrap()
    }

    #[test]
    fn exactly_the_granted_host_in_origin_form() {
        let target = |hs: &[(&str, &str)], uri: &str| {
            check_target(&headers(hs), &uri.parse().unwrap(), &granted(), 443)
        };
        let (origin, host) = target(&[("host", "api.example.test")], "/a?b=1").unwrap();
        assert_eq!(
            (origin.to_string().as_str(), host.as_str()),
            ("/a?b=1", "api.example.test")
        );
        let (origin, host) = target(&[], "https://api.example.test/a").unwrap();
        assert_eq!(
            (origin.to_string().as_str(), host.as_str()),
            ("/a", "api.example.test")
        );
        assert!(target(&[("host", "API.example.test:443")], "/").is_ok());
        assert!(matches!(
            target(
                &[("host", "api.example.test"), ("host", "other.example.test")],
                "/"
            ),
            Err(RequestRule::HostRepeated(2, _))
        ));
        assert!(matches!(
            target(
                &[("host", "api.example.test"), ("host", "api.example.test")],
                "/"
            ),
            Err(RequestRule::HostRepeated(2, _))
        ));
        for (hs, uri) in [
            (&[("host", "other.example.test")][..], "/"),
            (&[("host", "api.example.test:8443")][..], "/"),
            (&[("host", "api.example.test:x")][..], "/"),
            (
                &[("host", "api.example.test")][..],
                "https://other.example.test/",
            ),
            (
                &[("host", "api.example.test")][..],
                "http://api.example.test/",
            ),
            (
                &[("host", "api.example.test")][..],
                "https://api.example.test:8443/",
            ),
            (&[][..], "https://other.example.test/"),
        ] {
            assert!(
                matches!(target(hs, uri), Err(RequestRule::OtherHost(..))),
                "{hs:?} {uri}"
            );
        }
        assert!(matches!(target(&[], "/"), Err(RequestRule::NoHost(_))));
        assert!(matches!(
            target(&[("host", "api.example.test")], "*"),
            Err(RequestRule::NotOriginForm)
        ));
        assert!(matches!(
            check_target(
                &headers(&[]),
                &"api.example.test:443".parse().unwrap(),
                &granted(),
                443
            ),
            Err(RequestRule::NotOriginForm)
        ));
    }

    #[test]
    fn routing_and_method_overrides_are_refused() {
        for name in [
            "X-Forwarded-Host",
            "Forwarded",
            "X-Original-URL",
            "X-Rewrite-URL",
            "X-Host",
        ] {
            assert!(matches!(
                check_overrides(&headers(&[(name, "other")]), false, "GET"),
                Err(RequestRule::Override(_))
            ));
        }
        let method = headers(&[("X-HTTP-Method-Override", "DELETE")]);
        assert!(check_overrides(&method, false, "GET").is_ok());
        assert!(matches!(
            check_overrides(&method, true, "GET"),
            Err(RequestRule::MethodOverride(..))
        ));
        assert!(check_overrides(&headers(&[("accept", "*/*")]), true, "GET").is_ok());
    }

    #[test]
    fn paths_in_one_spelling_only() {
        for fine in [
            "/",
            "/repos/acme/",
            "/repos/acme/x%20y",
            "/a/%C3%A9t%C3%A9",
            "/a/b.c/..d",
        ] {
            assert_eq!(check_path_spelling(fine), Ok(()), "{fine}");
        }
        for bad in [
            "/repos/acme/..;/admin",
            "/repos/acme;x/admin",
            "/repos/acme/%252e%252e/admin",
            "/repos/acme/%c0%ae%c0%ae/admin",
            "/repos/acme/%2e%2e/admin",
            "/repos/acme/%2E/admin",
            "/repos/acme/../admin",
            "/repos/acme/./admin",
            "/repos/acme/..%2fadmin",
            "/repos/acme/..%5cadmin",
            "/repos/acme/..\\admin",
            "/repos/acme//admin",
            "/repos/acme/%zz",
            "/repos/acme/%2",
            "/repos/acme/%00",
            "/repos/acme/%3f",
            "repos/acme/",
        ] {
            assert!(check_path_spelling(bad).is_err(), "{bad}");
        }
    }
}
