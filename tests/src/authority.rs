//! A real `tollgate-authority` daemon, started in its own data directory and stopped on
//! demand or on drop.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tollgate_proto::v1::authority_client::AuthorityClient;
use tonic::transport::Channel;

use crate::client::authed;
use crate::host::{bin_path, command_on, wait_for_file};
use crate::pki::Pki;

/// A running `tollgate-authority`.
pub struct AuthorityProcess {
    child: Child,
    data_dir: PathBuf,
    addr: String,
}

impl AuthorityProcess {
    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts the daemon on `127.0.0.1:0` with `data_dir`, waiting until it is ready.
    /// Its stderr goes to `<data_dir>/../authority.stderr`.
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[]).unwrap_or_else(|(status, stderr)| {
            panic!("authority failed to start ({status}): {stderr}")
        })
    }

    /// Starts with extra flags; on failure returns the exit status and stderr.
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Result<Self, (String, String)> {
        Self::start_on(&[], data_dir, "127.0.0.1:0", extra)
    }

    /// Starts it through the command `prefix` (e.g. a [`crate::lan::Lan`] host's), listening on
    /// `listen`, with extra flags; on failure returns the exit status and stderr.
    pub fn start_on(
        prefix: &[String],
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Result<Self, (String, String)> {
        let log = data_dir.with_extension("stderr");
        // After a SIGKILL the old readiness file is still there; never mistake it for ours.
        let _ = std::fs::remove_file(data_dir.join("authority.addr"));
        let mut child = command_on(prefix, bin_path("tollgate-authority"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", listen])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create log"))
            .spawn()
            .expect("spawn tollgate-authority");
        match wait_for_file(
            &data_dir.join("authority.addr"),
            &mut child,
            Duration::from_secs(30),
        ) {
            Ok(addr) => Ok(Self {
                child,
                data_dir: data_dir.to_owned(),
                addr,
            }),
            Err(why) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or(why);
                Err((status, std::fs::read_to_string(&log).unwrap_or_default()))
            }
        }
    }

    /// Starts it serving mutual TLS with `pki`'s authority certificate.
    pub fn start_tls(data_dir: &Path, pki: &Pki) -> Self {
        let flags = pki.authority_flags();
        Self::start_with(
            data_dir,
            &flags.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .unwrap_or_else(|(status, stderr)| {
            panic!("authority with TLS failed to start ({status}): {stderr}")
        })
    }

    /// `host:port` it listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The bootstrap admin token.
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("admin.token"))
            .expect("admin.token")
            .trim()
            .to_owned()
    }

    /// A connected gRPC client.
    pub async fn client(&self) -> AuthorityClient<Channel> {
        AuthorityClient::connect(self.url()).await.expect("connect")
    }

    /// Adds operator `name` with `ceiling` (not an admin), with the admin token; returns its
    /// token. Panics if the authority refuses.
    pub async fn add_operator(&self, name: &str, ceiling: tollgate_proto::v1::Ceiling) -> String {
        self.client()
            .await
            .add_operator(authed(
                &self.admin_token(),
                tollgate_proto::v1::AddOperatorRequest {
                    name: name.into(),
                    ceiling: Some(ceiling),
                    admin: false,
                },
            ))
            .await
            .expect("operator added")
            .into_inner()
            .token
    }

    /// Enrols supervisor `id` for delegation (`AddSupervisor` with the admin token) and
    /// returns its delegation token, for `DelegateReceipt` (or a supervisor's
    /// `--delegation-token-file`). Panics if the authority refuses.
    pub async fn add_supervisor(&self, id: &str) -> String {
        self.client()
            .await
            .add_supervisor(authed(
                &self.admin_token(),
                tollgate_proto::v1::AddSupervisorRequest {
                    supervisor_id: id.to_owned(),
                },
            ))
            .await
            .unwrap_or_else(|status| panic!("AddSupervisor {id:?}: {status}"))
            .into_inner()
            .token
    }

    /// [`Self::add_supervisor`], with the token written to `path` (mode 0600), as a
    /// supervisor's `--delegation-token-file` wants it.
    pub async fn add_supervisor_token_file(&self, id: &str, path: &Path) {
        use std::os::unix::fs::OpenOptionsExt as _;
        let token = self.add_supervisor(id).await;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
            .expect("write the delegation token");
    }

    /// Sends `signal` and waits for the process to exit.
    pub fn stop(mut self, signal: Signal) -> ExitStatus {
        let _ = kill(Pid::from_raw(self.child.id() as i32), signal);
        self.child.wait().expect("wait")
    }
}

impl Drop for AuthorityProcess {
    fn drop(&mut self) {
        // Never leave a daemon behind, whatever the test did.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
