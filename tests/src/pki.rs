//! A test PKI made with `tollgate pki`, and the flags and connections that use it.

use std::path::{Path, PathBuf};
use std::process::Command;

use tonic::transport::Channel;

use crate::host::bin_path;

/// A CA and certificates made with `tollgate pki` in `<dir>/pki`: the authority's,
/// supervisor `workstation`'s and operator `alice`'s.
pub struct Pki {
    /// Where the files are.
    pub dir: PathBuf,
}

impl Pki {
    /// Makes them (panics if `tollgate pki` fails).
    pub fn make(dir: &Path) -> Self {
        let dir = dir.join("pki");
        let d = dir.to_str().expect("a UTF-8 path");
        for args in [
            vec!["pki", "init", "--dir", d],
            vec!["pki", "issue", "authority", "--dir", d],
            vec!["pki", "issue", "supervisor", "workstation", "--dir", d],
            vec!["pki", "issue", "operator", "alice", "--dir", d],
        ] {
            let output = Command::new(bin_path("tollgate"))
                .args(&args)
                .output()
                .expect("run tollgate pki");
            assert!(output.status.success(), "{args:?}: {output:?}");
        }
        Self { dir }
    }

    /// The path of one of its files (`ca.pem`, `operator-alice.key`...), as a string.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The flags that make supervisor `workstation` serve mutual TLS with these files and
    /// reach its authority over TLS with its certificate.
    pub fn supervisor_flags(&self) -> Vec<String> {
        vec![
            "--authority-ca".into(),
            self.path("ca.pem"),
            "--tls-cert".into(),
            self.path("supervisor-workstation.pem"),
            "--tls-key".into(),
            self.path("supervisor-workstation.key"),
            "--tls-client-ca".into(),
            self.path("ca.pem"),
        ]
    }

    /// A mutual-TLS connection to `addr` presenting `holder`'s certificate
    /// (`operator-alice`, `supervisor-workstation`...). Panics if it cannot connect.
    pub async fn channel(&self, addr: &str, holder: &str) -> Channel {
        let read = |name: String| std::fs::read(self.dir.join(name)).expect("a PKI file");
        tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .expect("an address")
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(read(
                        "ca.pem".into(),
                    )))
                    .identity(tonic::transport::Identity::from_pem(
                        read(format!("{holder}.pem")),
                        read(format!("{holder}.key")),
                    )),
            )
            .expect("TLS settings")
            .connect()
            .await
            .expect("mutual TLS")
    }

    /// The flags that make an authority serve mutual TLS with these files.
    pub fn authority_flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.path("authority.pem"),
            "--tls-key".into(),
            self.path("authority.key"),
            "--tls-client-ca".into(),
            self.path("ca.pem"),
        ]
    }
}
