//! Command input read from a file or stdin, and secrets (receipts, tokens) written to files
//! only their owner can read.

use std::io::Read as _;
use std::path::Path;

use crate::error::CliError;

pub(crate) fn read_input(path: &Path) -> Result<String, CliError> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| CliError::Input(format!("cannot read stdin: {e}")))?;
        return Ok(text);
    }
    std::fs::read_to_string(path)
        .map_err(|e| CliError::Input(format!("cannot read {}: {e}", path.display())))
}

/// Writes a secret (receipt or token) to `path` with mode 0600, also when the file already
/// existed with a looser mode (the mode given to open() applies only on creation).
pub(crate) fn write_private(path: &Path, contents: &str) -> Result<(), CliError> {
    let (file, _) = open_private(path)?;
    fill_private(file, path, contents)
}

/// Opens `path` for a secret, mode 0600, without changing what it holds yet; whether it was
/// created now.
pub(crate) fn open_private(path: &Path) -> Result<(std::fs::File, bool), CliError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let error = |e: std::io::Error| CliError::Output {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    let created = !path.exists();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(error)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(error)?;
    Ok((file, created))
}

/// Replaces what a file opened by [`open_private`] holds with `contents`, durably.
pub(crate) fn fill_private(
    mut file: std::fs::File,
    path: &Path,
    contents: &str,
) -> Result<(), CliError> {
    use std::io::Write as _;
    let error = |e: std::io::Error| CliError::Output {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    file.set_len(0).map_err(error)?;
    file.write_all(contents.as_bytes()).map_err(error)?;
    file.sync_all().map_err(error)
}
