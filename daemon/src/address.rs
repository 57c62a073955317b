//! A daemon's address as its clients give it: `host:port`, a URL, or the path of the
//! daemon's `.addr` readiness file (which holds `host:port`), the same way for the CLI and
//! for a supervisor following its authority.

use std::io;

/// Turns `host:port`, `http(s)://host:port` or the path of a `.addr` readiness file (absolute,
/// `./`-relative, or ending in `.addr`) into a URL; `Err` names the file it could not read.
pub fn url(addr: &str) -> Result<String, String> {
    let addr = addr.trim();
    let addr = if addr.starts_with('/') || addr.starts_with("./") || addr.ends_with(".addr") {
        std::fs::read_to_string(addr)
            .map_err(|e: io::Error| format!("cannot read address file {addr}: {e}"))?
            .trim()
            .to_owned()
    } else {
        addr.to_owned()
    };
    if addr.starts_with("http://") || addr.starts_with("https://") {
        Ok(addr)
    } else {
        Ok(format!("http://{addr}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_urls_and_readiness_files_become_urls() {
        assert_eq!(url("127.0.0.1:7700").unwrap(), "http://127.0.0.1:7700");
        assert_eq!(url("https://a.example:1").unwrap(), "https://a.example:1");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("authority.addr");
        std::fs::write(&file, "127.0.0.1:40000\n").unwrap();
        assert_eq!(
            url(&file.display().to_string()).unwrap(),
            "http://127.0.0.1:40000"
        );
        let missing = url("/nonexistent/authority.addr").unwrap_err();
        assert!(missing.contains("cannot read address file /nonexistent/authority.addr"));
    }
}
