//! A secret a daemon holds (a delegation token, an admin token): never printed, zeroed when
//! dropped.

use std::fmt;

use zeroize::Zeroizing;

/// A secret string. `Debug` and `Display` show `[secret]`; the value is zeroed when dropped.
#[derive(Clone)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    /// The value, for the header or file that carries it. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[secret]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[secret]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("tgt_abc".into());
        assert_eq!(format!("{secret:?} {secret}"), "[secret] [secret]");
        assert_eq!(secret.expose(), "tgt_abc");
    }
}
