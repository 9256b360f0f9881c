//! The `static` credential source: a file of `"user" "secret"` lines, like PgBouncer's
//! auth_file, where the secret is a SCRAM verifier (preferred) or a password.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Credential, CredentialError, CredentialSource, parse_secret};

/// Users loaded from a file at start-up.
pub struct StaticSource {
    users: HashMap<String, Arc<Credential>>,
}

/// Splits a line into its double-quoted fields; `""` inside a field is a literal quote.
fn quoted_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(fields),
            Some('"') => {}
            Some(_) => return None,
        }
        let mut field = String::new();
        loop {
            match chars.next()? {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => break,
                c => field.push(c),
            }
        }
        fields.push(field);
    }
}

impl StaticSource {
    /// Parses the file text (computing verifiers for plain passwords: call it at start-up).
    pub fn parse(text: &str) -> Result<StaticSource, CredentialError> {
        let mut users = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let fields = quoted_fields(line)
                .filter(|f| f.len() >= 2)
                .ok_or_else(|| {
                    CredentialError::Invalid(format!(
                        "line {}: expected \"user\" \"secret\"",
                        n + 1
                    ))
                })?;
            let credential = parse_secret(&fields[1])
                .map_err(|e| CredentialError::Invalid(format!("line {}: {e}", n + 1)))?;
            users.insert(fields[0].clone(), Arc::new(credential));
        }
        Ok(StaticSource { users })
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<StaticSource, CredentialError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CredentialError::Invalid(format!("{}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| CredentialError::Invalid(format!("{}: {e}", path.display())))
    }
}

#[async_trait]
impl CredentialSource for StaticSource {
    fn kind(&self) -> &'static str {
        "static"
    }

    async fn lookup(&self, user: &str) -> Result<Option<Arc<Credential>>, CredentialError> {
        Ok(self.users.get(user).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_userlist_lines() {
        assert_eq!(
            quoted_fields(r#""bob" "pa""ss" "#),
            Some(vec!["bob".to_owned(), "pa\"ss".to_owned()])
        );
        assert_eq!(quoted_fields(r#"bob "x""#), None);
        assert_eq!(quoted_fields(r#""bob" "x"#), None);
        let src = StaticSource::parse("# users\n\"alice\" \"secret\"\n\n").unwrap();
        assert!(src.users.contains_key("alice"));
        assert!(src.users["alice"].password.is_some());
        let err = StaticSource::parse("\"a\" \"md5aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"")
            .err()
            .unwrap();
        assert!(err.to_string().contains("line 1"), "{err}");
        assert!(StaticSource::parse("alice secret").is_err());
    }
}
