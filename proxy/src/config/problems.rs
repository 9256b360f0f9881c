//! Reading the merged file and environment into the config's types with every problem named in
//! one run, each as a line a person can act on: the key as it was written, then what is wrong in
//! words of the file (a whole number, a table), not of Rust's types.

use figment::Figment;
use figment::error::{Actual, Kind};
use figment::providers::Serialized;
use figment::value::Value;
use serde::de::DeserializeOwned;

/// Extracts `T` from `figment`, or describes every problem found, one line each.
///
/// Deserializing stops at the first problem, so the key of each problem found is taken out of
/// the value and the rest is read again, until a read gets through or a problem has no key that
/// can be taken out (a missing key, a file that is not TOML). Keys are taken out only to find
/// further problems: nothing read from a value with keys taken out is ever used.
pub(super) fn extract<T: DeserializeOwned>(figment: &Figment) -> Result<T, String> {
    let mut error = match figment.extract::<T>() {
        Ok(config) => return Ok(config),
        Err(error) => error,
    };
    // A file that does not parse has no value to take keys out of; its error is the only one.
    let mut value = figment.find_value("").ok();
    let mut lines = Vec::new();
    let mut removed: Vec<Vec<String>> = Vec::new();
    loop {
        let mut progress = false;
        for e in error {
            let path = key_of(value.as_ref(), &e);
            // A required key taken out after its own problem is missing now; that is not news.
            if removed.iter().any(|r| path.starts_with(r)) {
                continue;
            }
            lines.push(describe(&e, &path, figment));
            // No removal fixes a missing key.
            if !matches!(e.kind, Kind::MissingField(_))
                && let Some(value) = &mut value
                && remove(value, &path)
            {
                removed.push(path);
                progress = true;
            }
        }
        let Some(rest) = value.as_ref().filter(|_| progress) else {
            break;
        };
        match Figment::from(Serialized::defaults(rest)).extract::<T>() {
            Ok(_) => break,
            Err(next) => error = next,
        }
    }
    match lines.as_slice() {
        [one] => Err(one.clone()),
        many => Err(format!("{} problems\n  {}", many.len(), many.join("\n  "))),
    }
}

/// The key a problem is about: the key that errored, a missing key's own name, and for an
/// unknown key reported on its table (inside a table with a `kind`, which serde reads as a
/// whole) that table's entry.
fn key_of(value: Option<&Value>, e: &figment::Error) -> Vec<String> {
    let mut path = e.path.clone();
    match &e.kind {
        Kind::MissingField(field) => path.push(field.to_string()),
        Kind::UnknownField(field, _) => {
            let table = value.and_then(|v| find(v, &path)).and_then(Value::as_dict);
            if table.is_some_and(|t| t.contains_key(field)) {
                path.push(field.clone());
            }
        }
        _ => {}
    }
    path
}

/// The value at `path` (table keys and list indexes).
fn find<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |at, key| match at {
        Value::Dict(_, table) => table.get(key),
        Value::Array(_, list) => list.get(key.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Takes the key at `path` out of its table. A list element is never taken out: the indexes
/// after it would shift, and later problems would name the wrong element.
fn remove(value: &mut Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut at = value;
    for key in parents {
        at = match at {
            Value::Dict(_, table) => match table.get_mut(key) {
                Some(next) => next,
                None => return false,
            },
            Value::Array(_, list) => {
                match key.parse::<usize>().ok().and_then(|i| list.get_mut(i)) {
                    Some(next) => next,
                    None => return false,
                }
            }
            _ => return false,
        };
    }
    match at {
        Value::Dict(_, table) => table.remove(last).is_some(),
        _ => false,
    }
}

/// One problem about the key at `path`: the key as the user wrote it (a variable's name when it came from the
/// environment), and what is wrong, without figment's profile prefix (`default.`) or quoting.
fn describe(e: &figment::Error, path: &[String], figment: &Figment) -> String {
    // Later reads are of a copy that has lost its sources, so the source is looked up in the
    // merged original: at the key, or for a list element the list, which holds its source.
    let metadata = (0..=e.path.len())
        .rev()
        .find_map(|n| figment.find_metadata(&e.path[..n].join(".")));
    let from_env = metadata.is_some_and(|m| m.name.contains("environment"));
    let key = match from_env {
        true => format!("PGWAKE_{}", path.join("__").to_ascii_uppercase()),
        false => toml_key(path),
    };
    // The file is named by whoever loads it; a value from the environment is not in it.
    let source = match from_env {
        true => "environment variable ",
        false => "",
    };
    let problem = match &e.kind {
        Kind::UnknownField(_, []) => "unknown key".to_owned(),
        Kind::UnknownField(_, expected) => {
            format!("unknown key; the keys here are {}", expected.join(", "))
        }
        Kind::UnknownVariant(value, expected) => {
            let quoted: Vec<String> = expected.iter().map(|v| format!("{v:?}")).collect();
            format!("unknown value {value:?}; one of {}", quoted.join(", "))
        }
        Kind::MissingField(_) => "missing".to_owned(),
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!(
                "expected {}, found {}",
                expected_words(expected),
                found_words(actual)
            )
        }
        Kind::Message(m) => m.clone(),
        other => other.to_string().replace('`', ""),
    };
    match key.is_empty() {
        true => format!("{source}{problem}"),
        false => format!("{source}{key}: {problem}"),
    }
}

/// A key path as TOML spells it: `tenant[0].backend.kind`.
fn toml_key(path: &[String]) -> String {
    let mut key = String::new();
    for part in path {
        if part.parse::<usize>().is_ok() {
            key.push_str(&format!("[{part}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(part);
        }
    }
    key
}

/// What serde expected, in the words of a TOML file: serde names Rust types (`usize`,
/// `struct Limits`), which mean nothing to someone editing a config.
fn expected_words(expected: &str) -> String {
    let words = match expected {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" => "a whole number from 0 to 4294967295",
        "u64" | "u128" | "usize" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" => "a string in quotes",
        "a character" => "a single character in quotes",
        "a sequence" => "a list in square brackets",
        "a map" => "a table",
        "socket address" => "an address with a port in quotes, such as \"127.0.0.1:6432\"",
        other if other.starts_with("internally tagged enum") => {
            "a table with a kind, such as { kind = \"...\", ... }"
        }
        other if other.starts_with("struct ") => "a table",
        other => other,
    };
    words.to_owned()
}

/// The value found, as it would be written in the file.
fn found_words(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => format!("{s:?}"),
        Actual::Char(c) => format!("{:?}", c.to_string()),
        Actual::Bool(b) => b.to_string(),
        Actual::Unsigned(n) => n.to_string(),
        Actual::Signed(n) => n.to_string(),
        Actual::Float(n) => n.to_string(),
        Actual::Seq => "a list".to_owned(),
        Actual::Map => "a table".to_owned(),
        other => other.to_string().replace('`', ""),
    }
}

#[cfg(test)]
mod tests {
    use figment::providers::{Format, Toml};
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // read only to find the problems
    struct Shape {
        name: String,
        #[serde(default)]
        count: usize,
        #[serde(default)]
        port: u16,
        #[serde(default)]
        on: bool,
        #[serde(default)]
        part: Vec<Part>,
        #[serde(default)]
        listen: Option<std::net::SocketAddr>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    #[allow(dead_code)] // read only to find the problems
    enum Part {
        Fixed { address: String },
    }

    fn problems(text: &str) -> String {
        extract::<Shape>(&Figment::from(Toml::string(text))).unwrap_err()
    }

    #[test]
    fn every_unknown_key_is_named_in_one_run_even_inside_a_tagged_table() {
        let err = problems(
            "name = \"x\"\nnme = 1\nconut = 2\n[[part]]\nkind = \"fixed\"\naddress = \"a\"\nadress = \"b\"\n",
        );
        assert!(err.starts_with("3 problems\n"), "{err}");
        for key in ["nme: unknown key", "conut: unknown key", "part[0].adress"] {
            assert!(err.contains(key), "{key} in {err}");
        }
    }

    #[test]
    fn type_errors_speak_of_the_file_not_of_rust() {
        let err =
            problems("name = \"x\"\ncount = \"x\"\nport = 70000\non = \"yes\"\nlisten = 6432\n");
        let expected = [
            "count: expected a whole number, 0 or more, found \"x\"",
            "port: expected a whole number from 0 to 65535, found 70000",
            "on: expected true or false, found \"yes\"",
            "listen: expected an address with a port in quotes, such as \"127.0.0.1:6432\", found 6432",
        ];
        for line in expected {
            assert!(err.lines().any(|l| l.trim() == line), "{line} in {err}");
        }
        assert!(!err.contains("usize") && !err.contains("u16"), "{err}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn a_variable_found_in_a_later_read_is_still_named_as_set() {
        use figment::providers::Env;
        figment::Jail::expect_with(|jail| {
            jail.set_env("PGWAKE_PORT", "x");
            let figment = Figment::from(Toml::string("name = \"x\"\nconut = 1\n"))
                .merge(Env::prefixed("PGWAKE_"));
            let err = extract::<Shape>(&figment).unwrap_err();
            assert!(err.contains("\n  conut: unknown key"), "{err}");
            assert!(
                err.contains("\n  environment variable PGWAKE_PORT: expected a whole number"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn a_required_key_with_a_bad_value_is_named_once() {
        let err = problems("name = 5\nnme = 1\n");
        assert_eq!(
            err,
            "2 problems\n  name: expected a string in quotes, found 5\n  nme: unknown key; \
             the keys here are name, count, port, on, part, listen"
        );
    }
}
