//! The configuration reference (`docs/src/configuration.md`) names every key the configuration
//! types accept, and no key they refuse.
//!
//! The keys come from the types themselves, through serde's own unknown-key report: a table
//! holding one key no type has (`PROBE`) is refused with "unknown field `PROBE`, expected one of
//! `a`, `b`", which lists the fields of the struct at that place. Each field is then probed as a
//! table, a tagged table (`kind = …`, whose variants the unknown-variant report lists) and a list
//! of tables, so nested sections, `[[tenant]]` and the backend and credential kinds are walked
//! too. A field added to any config struct, or a new backend kind, therefore appears here
//! without anyone listing it.

use std::collections::BTreeSet;
use std::path::Path;

use pgwake::config::Config;
use serde_json::{Value, json};

/// A key no configuration type has.
const PROBE: &str = "zz_reference_probe";

/// What the reference must hold for one key of the types.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// `key` written in the TOML table `section` (`""` for the top level, `tls.certs`, …).
    Plain { section: String, key: String },
    /// A tagged table's variant (`backend = { kind = "cnpg", … }`), with one of its fields or none.
    Variant {
        section: String,
        key: String,
        kind: String,
        field: Option<String>,
    },
}

/// Places a value at the spot a walk has reached, inside the tables around it.
type Wrap<'a> = &'a dyn Fn(Value) -> Value;

/// The error serde gives when `Config` is read from `value`, or `None` when it is accepted.
fn refusal(value: Value) -> Option<String> {
    serde_json::from_value::<Config>(value)
        .err()
        .map(|e| e.to_string())
}

/// The names in a serde list such as "expected one of `a`, `b`" or "expected `a`".
fn backticked_after(message: &str, marker: &str) -> Option<Vec<String>> {
    let rest = &message[message.find(marker)? + marker.len()..];
    if rest.trim_start().starts_with("there are no") {
        return Some(Vec::new());
    }
    let list = rest
        .split_once("expected ")
        .map(|(_, l)| l)
        .unwrap_or_default();
    let list = list.strip_prefix("one of ").unwrap_or(list);
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// The fields of the struct at `wrap`'s place, when a struct is there.
fn fields_at(wrap: Wrap) -> Option<Vec<String>> {
    let message = refusal(wrap(json!({ PROBE: 1 })))?;
    backticked_after(&message, &format!("unknown field `{PROBE}`"))
}

/// The variants of the `kind`-tagged table at `wrap`'s place, when one is there.
fn variants_at(wrap: Wrap) -> Option<Vec<String>> {
    let message = refusal(wrap(json!({ "kind": PROBE })))?;
    backticked_after(&message, &format!("unknown variant `{PROBE}`"))
}

/// Every key below the struct at `wrap`'s place, written in `section`.
fn walk(wrap: Wrap, section: &str, keys: &mut BTreeSet<Key>) {
    let fields = fields_at(wrap).unwrap_or_else(|| panic!("no struct at [{section}]"));
    for field in fields {
        keys.insert(Key::Plain {
            section: section.to_owned(),
            key: field.clone(),
        });
        let inner = if section.is_empty() {
            field.clone()
        } else {
            format!("{section}.{field}")
        };
        let as_table = |v: Value| wrap(json!({ field.as_str(): v }));
        let as_list = |v: Value| wrap(json!({ field.as_str(): [v] }));
        if fields_at(&as_table).is_some() {
            walk(&as_table, &inner, keys);
        } else if fields_at(&as_list).is_some() {
            walk(&as_list, &inner, keys);
        } else if let Some(kinds) = variants_at(&as_table) {
            for kind in kinds {
                let variant = |v: Value| {
                    let mut v = v;
                    v["kind"] = json!(kind);
                    as_table(v)
                };
                let fields = fields_at(&variant).unwrap_or_default();
                let mut entries: Vec<Option<String>> = fields.into_iter().map(Some).collect();
                entries.push(None);
                for field_of_kind in entries.into_iter().filter(|f| f.as_deref() != Some("kind")) {
                    keys.insert(Key::Variant {
                        section: section.to_owned(),
                        key: field.clone(),
                        kind: kind.clone(),
                        field: field_of_kind,
                    });
                }
            }
        }
    }
}

/// Every key the configuration types accept, found by probing them.
fn keys_of_the_types() -> BTreeSet<Key> {
    let mut keys = BTreeSet::new();
    walk(&|v| v, "", &mut keys);
    keys
}

/// One line of a TOML block in the reference, with the table it is in.
struct RefLine {
    section: String,
    text: String,
}

/// The lines of the reference's ```toml blocks, comment markers removed, each with its table;
/// a table header counts as the key that names it in the table above.
fn reference_lines(markdown: &str) -> Vec<RefLine> {
    let mut lines = Vec::new();
    let mut in_toml = false;
    let mut section = String::new();
    for raw in markdown.lines() {
        if raw.starts_with("```") {
            in_toml = raw.trim() == "```toml";
            continue;
        }
        if !in_toml {
            continue;
        }
        let text = raw.trim_start().trim_start_matches('#').trim_start();
        if let Some(header) = text.strip_prefix('[') {
            let name = header.trim_start_matches('[');
            let name = &name[..name.find(']').unwrap_or(name.len())];
            section = name.to_owned();
            let (parent, key) = name.rsplit_once('.').unwrap_or(("", name));
            lines.push(RefLine {
                section: parent.to_owned(),
                text: format!("{key} = "),
            });
        }
        lines.push(RefLine {
            section: section.clone(),
            text: text.to_owned(),
        });
    }
    lines
}

/// Whether `text` sets `key` (`key = …`, at its start or after a space, `{` or `,`).
fn sets(text: &str, key: &str) -> bool {
    let pattern = format!("{key} = ");
    text.match_indices(&pattern)
        .any(|(at, _)| at == 0 || matches!(text.as_bytes()[at - 1], b' ' | b'{' | b',' | b'\t'))
}

/// Whether the reference has a line for `key`.
fn documented(lines: &[RefLine], key: &Key) -> bool {
    match key {
        Key::Plain { section, key } => lines
            .iter()
            .any(|l| &l.section == section && sets(&l.text, key)),
        Key::Variant {
            section,
            key,
            kind,
            field,
        } => lines.iter().any(|l| {
            &l.section == section
                && l.text.contains(&format!("kind = \"{kind}\""))
                && field.as_deref().is_none_or(|f| sets(&l.text, f))
                && (sets(&l.text, key) || l.text.starts_with("kind = "))
        }),
    }
}

fn reference() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_walk_finds_sections_lists_and_kinds() {
    let keys = keys_of_the_types();
    let plain = |section: &str, key: &str| Key::Plain {
        section: section.into(),
        key: key.into(),
    };
    for key in [
        plain("", "listen"),
        plain("wake", "idle_timeout"),
        plain("tls.certs", "server_names"),
        plain("tenant", "id"),
        plain("revival.keys", "id"),
    ] {
        assert!(keys.contains(&key), "{key:?} among {keys:#?}");
    }
    let cnpg_endpoint = Key::Variant {
        section: "tenant".into(),
        key: "backend".into(),
        kind: "cnpg".into(),
        field: Some("endpoint".into()),
    };
    assert!(keys.contains(&cnpg_endpoint), "{keys:#?}");
    println!("{} keys in the configuration types", keys.len());
}

#[test]
fn every_key_of_the_config_types_has_a_line_in_the_reference() {
    let lines = reference_lines(&reference());
    let missing: Vec<String> = keys_of_the_types()
        .iter()
        .filter(|key| !documented(&lines, key))
        .map(|key| format!("{key:?}"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/configuration.md has no line for {} key(s):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn every_key_in_the_reference_is_one_the_types_accept() {
    let keys = keys_of_the_types();
    let known: BTreeSet<(&str, &str)> = keys
        .iter()
        .map(|key| match key {
            Key::Plain { section, key } => (section.as_str(), key.as_str()),
            Key::Variant { section, key, .. } => (section.as_str(), key.as_str()),
        })
        .collect();
    let variant_fields: BTreeSet<(&str, &str)> = keys
        .iter()
        .filter_map(|key| match key {
            Key::Variant {
                section,
                field: Some(f),
                ..
            } => Some((section.as_str(), f.as_str())),
            _ => None,
        })
        .collect();
    let mut stale = Vec::new();
    for line in reference_lines(&reference()) {
        // The first `key = ` of a line is the key it sets; later ones are in a comment or a
        // tagged table (checked against the kinds' fields).
        let Some((key, _)) = line.text.split_once(" = ") else {
            continue;
        };
        if !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') || key.is_empty() {
            continue;
        }
        let pair = (line.section.as_str(), key);
        if !known.contains(&pair) && !variant_fields.contains(&pair) && !free_form(&line.section) {
            stale.push(format!("[{}] {key}", line.section));
        }
    }
    assert!(
        stale.is_empty(),
        "the reference names keys the types refuse:\n{}",
        stale.join("\n")
    );
}

/// Tables whose keys are the user's own (extra `postgresql.conf` lines), not config keys.
fn free_form(section: &str) -> bool {
    section == "local.settings"
}
