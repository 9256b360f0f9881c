//! Reading SQL text the way the server's lexer splits it, for the few decisions the gateway makes
//! about text a client sent: which statement of a multi-statement string made a prepared
//! statement, and which names it used.
//!
//! Only what splitting needs is recognised: string literals (`'…'` with `''`, `E'…'` with
//! backslash escapes), quoted identifiers, dollar quotes, `--` and nested `/* */` comments, and
//! parentheses (a `;` inside them, as in a rule's action list, does not end a statement). The
//! gateway never trusts this split to keep statements apart on its own: whatever it sends back
//! to a server goes through the extended protocol, where the server refuses more than one
//! command.

use std::ops::Range;

/// Longest identifier the server keeps (`NAMEDATALEN - 1`); longer ones are truncated.
const MAX_IDENTIFIER: usize = 63;

/// The statements of `text`, each without its terminating `;`, leaving out those that hold only
/// white space and comments.
pub fn split_statements(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0usize;
    let mut i = 0;
    let mut push = |from: usize, to: usize| {
        let piece = &text[from..to];
        if !is_blank(piece) {
            out.push(piece);
        }
    };
    while i < bytes.len() {
        match bytes[i] {
            b';' if depth == 0 => {
                push(start, i);
                start = i + 1;
                i += 1;
            }
            b'(' => {
                depth += 1;
                i += 1;
            }
            b')' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i = skip_token(bytes, i),
        }
    }
    push(start, bytes.len());
    out
}

/// Where a prepared statement's `PREPARE` stands in the query text that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareSource<'a> {
    /// The text is that one `PREPARE` and nothing else (besides comments and a final `;`).
    Whole,
    /// The text holds other statements too; this is the one `PREPARE` of the name.
    Part(&'a str),
    /// No statement of the text prepares the name, or more than one does: which one made the
    /// statement cannot be told from the text.
    Unknown,
}

/// Finds the statement of `text` that prepared `name` (as the server folded it).
pub fn prepare_source<'a>(text: &'a str, name: &str) -> PrepareSource<'a> {
    let statements = split_statements(text);
    let mut found = statements
        .iter()
        .filter(|s| prepared_name(s).as_deref() == Some(name));
    match (found.next(), found.next()) {
        (Some(_), None) if statements.len() == 1 => PrepareSource::Whole,
        (Some(s), None) => PrepareSource::Part(s),
        _ => PrepareSource::Unknown,
    }
}

/// The statement name a `PREPARE name …` statement gives, folded as the server folds it
/// (unquoted names to lower case, quoted ones as written), truncated to the server's limit.
pub fn prepared_name(statement: &str) -> Option<String> {
    named_by(statement, "prepare").map(|(name, _)| name)
}

/// The prepared statements a text runs with SQL `EXECUTE name`: each one's folded name and
/// where its name is written in `text`, in order.
pub fn executed_statements(text: &str) -> Vec<(String, Range<usize>)> {
    split_statements(text)
        .into_iter()
        .filter_map(|statement| {
            let start = statement.as_ptr() as usize - text.as_ptr() as usize;
            let (name, at) = named_by(statement, "execute")?;
            Some((name, start + at.start..start + at.end))
        })
        .collect()
}

/// The name that follows `keyword` at the start of `statement`, folded, and where it is written.
fn named_by(statement: &str, keyword: &str) -> Option<(String, Range<usize>)> {
    let bytes = statement.as_bytes();
    let i = skip_blank(bytes, 0);
    let word_end = i + bytes[i..]
        .iter()
        .take_while(|b| b.is_ascii_alphabetic())
        .count();
    if !statement[i..word_end].eq_ignore_ascii_case(keyword) {
        return None;
    }
    let j = skip_blank(bytes, word_end);
    if j == word_end {
        return None;
    }
    let (name, end) = identifier(statement, j)?;
    Some((name, j..end))
}

/// Reads an identifier at `at`: its folded, truncated name and the index after it.
fn identifier(text: &str, at: usize) -> Option<(String, usize)> {
    let bytes = text.as_bytes();
    let mut name = if bytes.get(at) == Some(&b'"') {
        let mut out = String::new();
        let mut i = at + 1;
        loop {
            let close = i + text[i..].find('"')?;
            out.push_str(&text[i..close]);
            if bytes.get(close + 1) == Some(&b'"') {
                out.push('"');
                i = close + 2;
            } else {
                break (out, close + 1);
            }
        }
    } else {
        let len = bytes[at..]
            .iter()
            .take_while(|&&b| is_ident_byte(b))
            .count();
        if len == 0 || bytes[at].is_ascii_digit() || bytes[at] == b'$' {
            return None;
        }
        (text[at..at + len].to_ascii_lowercase(), at + len)
    };
    if name.0.is_empty() {
        return None;
    }
    if name.0.len() > MAX_IDENTIFIER {
        let mut cut = MAX_IDENTIFIER;
        while !name.0.is_char_boundary(cut) {
            cut -= 1;
        }
        name.0.truncate(cut);
    }
    Some(name)
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// True when `text` holds only white space and comments.
fn is_blank(text: &str) -> bool {
    skip_blank(text.as_bytes(), 0) == text.len()
}

/// The index of the first byte at or after `i` that is neither white space nor in a comment.
fn skip_blank(bytes: &[u8], mut i: usize) -> usize {
    loop {
        match bytes.get(i) {
            Some(b) if b.is_ascii_whitespace() => i += 1,
            Some(b'-') if bytes.get(i + 1) == Some(&b'-') => i = skip_token(bytes, i),
            Some(b'/') if bytes.get(i + 1) == Some(&b'*') => i = skip_token(bytes, i),
            _ => return i,
        }
    }
}

/// The index after the token that starts at `i`: a literal, quoted identifier, dollar-quoted
/// string or comment as a whole, an identifier or keyword as a whole, else one byte. An
/// unterminated token runs to the end of the text, as the server would refuse it anyway.
fn skip_token(bytes: &[u8], i: usize) -> usize {
    let end = bytes.len();
    let after = |from: usize, pat: &[u8]| {
        bytes[from..]
            .windows(pat.len())
            .position(|w| w == pat)
            .map_or(end, |p| from + p + pat.len())
    };
    match bytes[i] {
        b'-' if bytes.get(i + 1) == Some(&b'-') => bytes[i..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map_or(end, |p| i + p + 1),
        b'/' if bytes.get(i + 1) == Some(&b'*') => {
            let mut depth = 0usize;
            let mut j = i;
            while j + 1 < end {
                match (bytes[j], bytes[j + 1]) {
                    (b'/', b'*') => {
                        depth += 1;
                        j += 2;
                    }
                    (b'*', b'/') => {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            return j;
                        }
                    }
                    _ => j += 1,
                }
            }
            end
        }
        b'\'' => quoted(bytes, i + 1, b'\'', false),
        b'"' => quoted(bytes, i + 1, b'"', false),
        b'e' | b'E' if bytes.get(i + 1) == Some(&b'\'') => quoted(bytes, i + 2, b'\'', true),
        b'$' => match dollar_tag(bytes, i) {
            Some(tag_end) => after(tag_end, &bytes[i..tag_end]),
            None => i + 1,
        },
        b if is_ident_byte(b) => i + bytes[i..].iter().take_while(|&&b| is_ident_byte(b)).count(),
        _ => i + 1,
    }
}

/// The index after a quoted run whose opening quote ends before `from`; a doubled quote stands
/// for itself, and with `backslash` a backslash escapes the next byte.
fn quoted(bytes: &[u8], from: usize, quote: u8, backslash: bool) -> usize {
    let mut j = from;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' if backslash => j += 2,
            b if b == quote && bytes.get(j + 1) == Some(&quote) => j += 2,
            b if b == quote => return j + 1,
            _ => j += 1,
        }
    }
    bytes.len()
}

/// The end of a dollar-quote opening tag (`$$` or `$tag$`) at `i`, if one stands there.
fn dollar_tag(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if bytes.get(j).is_some_and(|b| b.is_ascii_digit()) {
        return None;
    }
    while let Some(&b) = bytes.get(j) {
        match b {
            b'$' => return Some(j + 1),
            b if b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80 => j += 1,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_top_level_semicolons_only() {
        let text = "insert into t values ('a;b'); -- c;d\n\
                    prepare p as select $$x;y$$, \"q;\"\"r\", E'\\';'; /* a; /* b; */ c; */ \
                    create rule r as on insert to t do also (select 1; select 2);;  ";
        let parts = split_statements(text);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(parts[0], "insert into t values ('a;b')");
        assert!(parts[1].trim_start().starts_with("-- c;d\nprepare p"));
        assert!(parts[1].ends_with("E'\\';'"));
        assert!(parts[2].ends_with("(select 1; select 2)"));
    }

    #[test]
    fn dollar_signs_that_do_not_quote() {
        let parts = split_statements("select $1; select a$b$ from t; select $tag$;$tag$");
        assert_eq!(
            parts,
            ["select $1", " select a$b$ from t", " select $tag$;$tag$"]
        );
    }

    #[test]
    fn prepare_names_fold_like_the_server() {
        assert_eq!(
            prepared_name("PREPARE Foo(int) AS select 1").as_deref(),
            Some("foo")
        );
        assert_eq!(
            prepared_name(" /* c */ prepare \"Bar\"\"x\" as select 2").as_deref(),
            Some("Bar\"x")
        );
        assert_eq!(prepared_name("prepared_stuff"), None);
        assert_eq!(prepared_name("select 1"), None);
        assert_eq!(prepared_name("prepare 1x as select 1"), None);
        let long = format!("prepare {} as select 1", "a".repeat(80));
        assert_eq!(prepared_name(&long).map(|n| n.len()), Some(63));
    }

    #[test]
    fn finds_the_one_prepare_of_a_name() {
        assert_eq!(
            prepare_source("prepare p as select 1;", "p"),
            PrepareSource::Whole
        );
        let text = "insert into audit(note) values ('once'); prepare p as select 1";
        assert_eq!(
            prepare_source(text, "p"),
            PrepareSource::Part(" prepare p as select 1")
        );
        let two = "prepare p as select 1; prepare q as select 'p;'";
        assert_eq!(
            prepare_source(two, "q"),
            PrepareSource::Part(" prepare q as select 'p;'")
        );
        let twice = "prepare p as select 1; deallocate p; prepare p as select 2";
        assert_eq!(prepare_source(twice, "p"), PrepareSource::Unknown);
        assert_eq!(prepare_source("select 1", "p"), PrepareSource::Unknown);
    }

    #[test]
    fn unterminated_tokens_run_to_the_end() {
        assert_eq!(split_statements("select 'a; b").len(), 1);
        assert_eq!(split_statements("select /* a; b").len(), 1);
        assert_eq!(split_statements("select $q$ a; b").len(), 1);
        assert!(split_statements(" -- only a comment; here").is_empty());
    }

    #[test]
    fn finds_the_statements_a_text_executes() {
        let text =
            "select 'execute no'; EXECUTE  by_A(1); /* c */ execute \"Q\"\"x\"; explain execute p";
        let found = executed_statements(text);
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["by_a", "Q\"x"]);
        assert_eq!(&text[found[0].1.clone()], "by_A");
        assert_eq!(&text[found[1].1.clone()], "\"Q\"\"x\"");
        assert!(executed_statements("executed(1)").is_empty());
    }
}
