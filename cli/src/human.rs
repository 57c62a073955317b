//! Human views: everything the CLI prints for a person goes through here, so text that came
//! from a daemon, an audit log or an agent (paths, argv, reasons, names) can never drive the
//! terminal. Every control character — C0 (newline included), DEL and C1 — and the backslash
//! are shown as escapes (`\n`, `\x1b`, `\u{9b}`, `\\`): a path with a newline cannot forge a
//! line, and one with an escape sequence cannot set the title or move the cursor. JSON output
//! is not printed here: serde_json escapes control characters itself.

use std::fmt::{self, Write as _};

/// `text` as one line for a terminal (see the module docs).
pub fn line(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let _ = write!(shown, "{}", Shown(text));
    shown
}

/// Displays its text escaped for a terminal, as [`line`] does.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if (c as u32) < 0x20 || c == '\u{7f}' => write!(f, "\\x{:02x}", c as u32)?,
                c if ('\u{80}'..='\u{9f}').contains(&c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Rows (the first is the header) as aligned lines: each cell escaped as [`line`] does, each
/// column but the last as wide as its widest cell plus two spaces, so no value, however long,
/// pushes the columns after it out of line. Print the lines as they are (they are escaped).
pub fn table(rows: &[Vec<String>]) -> Vec<String> {
    let shown: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| line(cell)).collect())
        .collect();
    let columns = shown.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            shown
                .iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    shown
        .iter()
        .map(|row| {
            let mut text = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    text.push_str(cell);
                } else {
                    let pad = widths[c] + 2 - cell.chars().count();
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            text
        })
        .collect()
}

/// Prints one line of a human view to stdout, escaped with [`line`], through
/// [`crate::out`]: evaluates to `Result<(), CliError>` (a failed write is an error to return,
/// not a panic). `say!()` prints an empty line; a view of several lines says each.
macro_rules! say {
    () => {
        $crate::out::line("")
    };
    ($($arg:tt)*) => {
        $crate::out::line(&$crate::human::line(&format!($($arg)*)))
    };
}

/// [`say!`] to stderr (where a failed write has nowhere left to be reported).
macro_rules! say_err {
    ($($arg:tt)*) => {
        $crate::out::stderr(&format!("{}\n", $crate::human::line(&format!($($arg)*))))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_backslashes_are_shown_as_escapes() {
        assert_eq!(line("plain /path ok"), "plain /path ok");
        assert_eq!(
            line("a\nb\r\t\x1b]0;pwned\x07\u{7f}\u{9b}\\"),
            "a\\nb\\r\\t\\x1b]0;pwned\\x07\\x7f\\u{9b}\\\\"
        );
        // Printable non-ASCII stays as it is.
        assert_eq!(line("µs · naïve"), "µs · naïve");
        assert!(!line("\u{85}\u{1b}").chars().any(char::is_control));
    }

    #[test]
    fn table_columns_fit_their_longest_cell() {
        let rows = [
            vec!["RUN".into(), "SUBJECT".into(), "REASON".into()],
            vec![
                "r1".into(),
                "a-subject-longer-than-its-column-was".into(),
                "stopped".into(),
            ],
            vec!["r2\n".into(), "s".into(), "x".into()],
        ];
        let lines = table(&rows);
        assert_eq!(
            lines,
            [
                "RUN   SUBJECT                               REASON",
                "r1    a-subject-longer-than-its-column-was  stopped",
                "r2\\n  s                                     x",
            ]
        );
    }
}
