//! Where an outbound connection goes: the supervisor resolves the name itself (the sandbox
//! has no DNS), keeps only the addresses the grant may reach, and the caller connects to one
//! of exactly those (never resolving again, so no rebinding between check and connect).
//!
//! `--egress-hosts FILE` (hosts-file syntax) answers for the names it lists before the
//! system resolver is asked: test suites and air-gapped sites name their own servers there.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate_receipt::egress::{canonical, is_public, Host};

/// How long the system resolver may take for one name.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the `--egress-hosts` file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EgressHostsError {
    /// It could not be read.
    #[error("egress hosts file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A line is not `ADDRESS NAME...`.
    #[error("egress hosts file {path}, line {line}: {problem} (write \"ADDRESS NAME [NAME...]\", e.g. \"198.51.100.7 api.example.test\")")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
}

/// Names the supervisor resolves from its own file before asking the system resolver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressHosts {
    names: HashMap<String, Vec<IpAddr>>,
}

impl EgressHosts {
    /// No names of its own: everything goes to the system resolver.
    pub fn system() -> Self {
        Self::default()
    }

    /// Reads a hosts file: `ADDRESS NAME [NAME...]` per line, `#` starts a comment. A name
    /// on several lines gets every address, in file order.
    pub fn load(path: &Path) -> Result<Self, EgressHostsError> {
        let text = std::fs::read_to_string(path).map_err(|source| EgressHostsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|(line, problem)| EgressHostsError::Line {
            path: path.to_owned(),
            line,
            problem,
        })
    }

    fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(address) = words.next() else {
                continue;
            };
            let address: IpAddr = address
                .parse()
                .map_err(|_| (i + 1, format!("{address:?} is not an IP address")))?;
            let mut any = false;
            for name in words {
                match Host::parse(name) {
                    Ok(Host::Name(name)) => names.entry(name).or_default().push(canonical(address)),
                    _ => return Err((i + 1, format!("{name:?} is not a DNS name"))),
                }
                any = true;
            }
            if !any {
                return Err((i + 1, "an address without a name".into()));
            }
        }
        Ok(Self { names })
    }

    /// The addresses `host` has: itself when it is one, else the file's or the system
    /// resolver's. Errors are one line for the agent (no resolver internals).
    pub async fn resolve(&self, host: &Host, port: u16) -> Result<Vec<SocketAddr>, String> {
        let name = match host {
            Host::Address(address) => return Ok(vec![SocketAddr::new(*address, port)]),
            Host::Name(name) => name,
        };
        if let Some(addresses) = self.names.get(name) {
            return Ok(addresses
                .iter()
                .map(|a| SocketAddr::new(*a, port))
                .collect());
        }
        match tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((name.as_str(), port)),
        )
        .await
        {
            Err(_) => Err(format!(
                "{name} did not resolve within {} s",
                RESOLVE_TIMEOUT.as_secs()
            )),
            Ok(Err(e)) => Err(format!("{name} does not resolve: {}", e.kind())),
            Ok(Ok(found)) => {
                let mut addresses: Vec<SocketAddr> = Vec::new();
                for address in found {
                    let address = SocketAddr::new(canonical(address.ip()), port);
                    if !addresses.contains(&address) {
                        addresses.push(address);
                    }
                }
                Ok(addresses)
            }
        }
    }
}

/// The addresses of `resolved` a connection to `host` may use: every one, when the grant
/// named the address itself; else only public ones (see
/// `tollgate_receipt::egress::is_public`). None left: why, naming the addresses.
pub fn reachable(host: &Host, resolved: Vec<SocketAddr>) -> Result<Vec<SocketAddr>, String> {
    if matches!(host, Host::Address(_)) {
        // Only a grant naming this literal address matches it (the caller checked).
        return Ok(resolved);
    }
    let (public, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
        resolved.into_iter().partition(|a| is_public(a.ip()));
    if !public.is_empty() {
        return Ok(public);
    }
    let shown: Vec<String> = refused.iter().take(4).map(|a| a.ip().to_string()).collect();
    if shown.is_empty() {
        return Err(format!("{host} has no address"));
    }
    Err(format!(
        "{host} resolves only to addresses that are not public ({}): a name never reaches loopback, private, link-local, shared or metadata addresses; grant the address itself to reach it",
        shown.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_file_names_addresses() {
        let hosts = EgressHosts::parse(
            "# test servers\n198.51.100.2 api.example.test Mirror.Example.Test\n\n198.51.100.3 api.example.test\n",
        )
        .unwrap();
        assert_eq!(hosts.names["api.example.test"].len(), 2);
        assert_eq!(hosts.names["mirror.example.test"].len(), 1);
        assert_eq!(EgressHosts::parse("x.example a").unwrap_err().0, 1);
        assert_eq!(EgressHosts::parse("\n198.51.100.2\n").unwrap_err().0, 2);
        assert_eq!(EgressHosts::parse("1.2.3.4 bad_name").unwrap_err().0, 1);
    }

    #[tokio::test]
    async fn names_reach_public_addresses_only() {
        let hosts = EgressHosts::parse("10.0.0.5 internal.example.test\n198.51.100.2 pub.example.test\n127.0.0.1 pub.example.test\n").unwrap();
        let name = |n: &str| Host::parse(n).unwrap();
        let internal = hosts
            .resolve(&name("internal.example.test"), 443)
            .await
            .unwrap();
        let error = reachable(&name("internal.example.test"), internal).unwrap_err();
        assert!(error.contains("10.0.0.5"), "{error}");
        let public = hosts.resolve(&name("pub.example.test"), 443).await.unwrap();
        assert_eq!(
            reachable(&name("pub.example.test"), public).unwrap(),
            ["198.51.100.2:443".parse().unwrap()]
        );
        // A literal address was granted by name of that address.
        let literal = hosts.resolve(&name("10.0.0.5"), 80).await.unwrap();
        assert_eq!(reachable(&name("10.0.0.5"), literal).unwrap().len(), 1);
    }
}
