//! Where a TOML file went wrong: the line, column and dotted key path of the problem, for
//! every TOML file Tollgate reads (run specs, ceilings, profiles, daemon configuration).

/// What was wrong in a TOML file, where: the line and column (1-based) and the dotted key
/// path (`exec.allow`, `fs[1].access`) of the value or key the error is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlProblem {
    /// 1-based line; 0 when the parser gave no position.
    pub line: usize,
    /// 1-based column (in characters); 0 when the parser gave no position.
    pub column: usize,
    /// Dotted path of the key; empty when the error is about no key (a syntax error between
    /// entries, or the document as a whole).
    pub key: String,
    /// What was wrong, one line.
    pub message: String,
}

impl TomlProblem {
    /// Where `error` (from parsing `text`) happened, with the key path worked out from the
    /// document's spans.
    pub fn new(text: &str, error: &toml::de::Error) -> Self {
        // toml's message may span several lines; keep it to one.
        let message = error
            .message()
            .trim()
            .lines()
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" ");
        let Some(span) = error.span() else {
            return Self {
                line: 0,
                column: 0,
                key: String::new(),
                message,
            };
        };
        let at = span.start.min(text.len());
        let before = &text[..floor_char_boundary(text, at)];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        let key = toml::de::DeTable::parse(text)
            .ok()
            .and_then(|table| key_at(table.get_ref(), span.start, ""))
            .unwrap_or_default();
        Self {
            line,
            column,
            key,
            message,
        }
    }

    /// `line 3: key: message`, for messages that name the file themselves.
    pub fn located(&self) -> String {
        if self.line > 0 {
            format!("line {}: {self}", self.line)
        } else {
            self.to_string()
        }
    }

    /// `file:line: key: message` (parts without a value left out).
    pub fn in_file(&self, file: &str) -> String {
        let mut shown = file.to_owned();
        if self.line > 0 {
            shown.push_str(&format!(":{}", self.line));
        }
        shown.push_str(": ");
        shown.push_str(&self.to_string());
        shown
    }
}

impl std::fmt::Display for TomlProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The deepest key path whose key or value span holds `offset`. Every entry is searched (a
/// table's own span may cover only its header, not its body).
fn key_at(table: &toml::de::DeTable<'_>, offset: usize, prefix: &str) -> Option<String> {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        if let Some(deeper) = value_key_at(value, offset, &path) {
            return Some(deeper);
        }
        if key.span().contains(&offset) || value.span().contains(&offset) {
            return Some(path);
        }
    }
    None
}

fn value_key_at(
    value: &toml::Spanned<toml::de::DeValue<'_>>,
    offset: usize,
    path: &str,
) -> Option<String> {
    match value.get_ref() {
        toml::de::DeValue::Table(table) => key_at(table, offset, path),
        toml::de::DeValue::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let path = format!("{path}[{i}]");
            value_key_at(item, offset, &path)
                .or_else(|| item.span().contains(&offset).then_some(path))
        }),
        _ => None,
    }
}

/// Parses TOML text into `T`; an error says the line and the key path (see [`TomlProblem`]).
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, TomlProblem> {
    toml::from_str(text).map_err(|e| TomlProblem::new(text, &e))
}
