//! `tollgate quickstart`: a guided tour on a throwaway authority.
//!
//! Starts the real `tollgate-authority` on a free port in a temporary data directory, mints a
//! receipt from a sample run spec, verifies it, shows that a tampered copy and a revoked
//! receipt are refused, then stops the daemon and removes the directory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::client::{connect, read_token};
use crate::error::CliError;
use crate::{authed, mint_with, show, verify_with};
use tollgate_proto::v1 as pb;

/// The shipped example run spec (also the one docs/run-spec.md explains).
const SAMPLE_SPEC: &str = include_str!("../../../examples/run.toml");

/// Finds a sibling binary of this executable, else one on PATH.
pub(crate) fn find_binary(name: &str) -> Result<PathBuf, CliError> {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    sibling
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            CliError::Other(format!(
                "cannot find {name} next to tollgate or on PATH; build it with `cargo build --release`"
            ))
        })
}

async fn wait_for_addr(
    child: &mut Child,
    addr_file: &Path,
    log: &Path,
) -> Result<String, CliError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(addr) = std::fs::read_to_string(addr_file) {
            if !addr.trim().is_empty() {
                return Ok(addr.trim().to_owned());
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let last = tail.lines().last().unwrap_or("(no output)");
            return Err(CliError::Other(format!(
                "tollgate-authority exited ({status}) before it was ready: {last}"
            )));
        }
        if Instant::now() > deadline {
            return Err(CliError::Other(format!(
                "tollgate-authority did not become ready within 20 s; see {}",
                log.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn step(n: u32, text: &str) {
    println!("\n── {n}. {text}");
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs the tour.
pub async fn run(keep: bool) -> Result<(), CliError> {
    let binary = find_binary("tollgate-authority")?;
    let dir = tempfile::Builder::new()
        .prefix("tollgate-quickstart-")
        .tempdir()
        .map_err(|e| CliError::Other(format!("cannot create a temporary directory: {e}")))?;
    let data_dir = dir.path().join("authority");
    let log_path = dir.path().join("authority.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| CliError::Other(format!("cannot create {}: {e}", log_path.display())))?;

    step(1, "Start an authority on a free port");
    let mut child = Command::new(&binary)
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| CliError::Other(format!("cannot start {}: {e}", binary.display())))?;
    let result = tour(&mut child, &data_dir, &log_path).await;

    step(6, "Stop the authority");
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(Ok(status)) => println!("   tollgate-authority exited ({status})"),
        _ => {
            let _ = child.kill().await;
            println!("   tollgate-authority did not stop within 10 s and was killed");
        }
    }
    if keep {
        let kept = dir.keep();
        println!("   data directory kept at {}", kept.display());
    } else {
        drop(dir);
        println!("   temporary data directory removed");
    }
    result?;
    println!(
        "\nNext: run your own with `tollgate-authority --data-dir DIR`, then\n\
         `tollgate --authority DIR/authority.addr --token-file DIR/admin.token mint --spec run.toml`.\n\
         See README.md and docs/."
    );
    Ok(())
}

async fn tour(child: &mut Child, data_dir: &Path, log: &Path) -> Result<(), CliError> {
    let addr = wait_for_addr(child, &data_dir.join("authority.addr"), log).await?;
    println!("   listening on {addr}; data in {}", data_dir.display());
    println!("   first start created a signing key (keys/, 0600) and admin.token (0600)");
    let token = read_token(&data_dir.join("admin.token"))?;
    let mut client = connect(&addr).await?;
    let keys = client
        .get_key_set(pb::GetKeySetRequest {})
        .await?
        .into_inner();
    for key in &keys.keys {
        println!(
            "   public key {} ({})",
            key.key_id,
            hex::encode(&key.public_key)
        );
    }

    step(2, "Mint a receipt from a run spec (as the admin operator)");
    println!("{}", indent(SAMPLE_SPEC.trim_end()));
    let minted = mint_with(&mut client, &token, SAMPLE_SPEC, "sample spec").await?;
    let receipt = minted.receipt.clone().unwrap_or_default();
    println!(
        "\n   text form ({} chars): {}…",
        minted.text.len(),
        &minted.text[..48.min(minted.text.len())]
    );

    step(3, "Verify it as a supervisor with id \"workstation\" would");
    let (_, outcome) = verify_with(&mut client, &minted.text, Some("workstation")).await?;
    let verified = outcome?;
    println!("   valid: Ed25519 signature over \"tollgate.receipt.v1\\n\" || receipt bytes");
    println!("{}", indent(&show::receipt_text(&verified)));

    step(4, "Tamper with one character: refused");
    let mut tampered = minted.text.clone();
    let middle = tampered.len() / 2;
    let replacement = if &tampered[middle..=middle] == "A" {
        "B"
    } else {
        "A"
    };
    tampered.replace_range(middle..=middle, replacement);
    match verify_with(&mut client, &tampered, Some("workstation"))
        .await?
        .1
    {
        Ok(_) => return Err(CliError::Other("a tampered receipt verified".into())),
        Err(e) => println!("   refused: {e}"),
    }

    step(5, "Revoke it: refused from now on");
    client
        .revoke_receipt(authed(
            &token,
            pb::RevokeReceiptRequest {
                receipt_id: receipt.receipt_id.clone(),
                reason: "quickstart demo".into(),
            },
        )?)
        .await?;
    match verify_with(&mut client, &minted.text, Some("workstation"))
        .await?
        .1
    {
        Ok(_) => return Err(CliError::Other("a revoked receipt verified".into())),
        Err(e) => println!("   refused: {e}"),
    }
    Ok(())
}
