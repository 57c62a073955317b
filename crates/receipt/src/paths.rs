//! Path rules shared by everyone who checks grants: the authority (against ceilings) and the
//! supervisor (again, before it mounts anything).

/// Sandbox paths a grant may not be mounted at or beneath: the sandbox builds them itself.
pub const RESERVED_MOUNTS: [&str; 6] = ["/proc", "/dev", "/sys", "/tmp", "/work", "/run"];

/// Whether `path` is absolute and normalised: no empty, `.` or `..` components, no trailing
/// slash (except the root itself), no NUL or other control character (a path is quoted in
/// one-line refusals and logs, where a newline could forge a second line).
pub fn is_normal_absolute(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    !path.chars().any(char::is_control)
        && rest
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Whether `path` equals or lies beneath `prefix` (both normalised), by whole components:
/// `/home/me` does not cover `/home/meow`. `/` covers everything.
pub fn path_within(path: &str, prefix: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_normalised() {
        for good in ["/", "/a", "/a/b.c", "/a/..b"] {
            assert!(is_normal_absolute(good), "{good}");
        }
        for bad in [
            "",
            "a",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/..",
            "/a\0",
            "/a\nfake: line",
            "/a\rb",
        ] {
            assert!(!is_normal_absolute(bad), "{bad:?}");
        }
    }

    #[test]
    fn prefix_match_respects_component_boundaries() {
        assert!(path_within("/home/me", "/home/me"));
        assert!(path_within("/home/me/x", "/home/me"));
        assert!(!path_within("/home/meow", "/home/me"));
        assert!(path_within("/etc", "/"));
    }
}
