//! Whether a `/sql` statement provably leaves no session state behind, so that the pooled
//! backend connection it ran on can serve the next request without `DISCARD ALL` first.
//!
//! The test is deliberately narrow and errs towards "may leave state" (which only costs a reset
//! pipelined in front of the next request): the statement must be a query (`SELECT`, `WITH`,
//! `VALUES`, `TABLE`, `SHOW`), must not write (`INTO`, `INSERT`, `UPDATE`, `DELETE`, `MERGE`,
//! which also keeps triggers out), and every function it calls must be a built-in known to touch
//! no session state (no `set_config`, advisory locks, `nextval`, `dblink`, user functions...).
//! Anything the lexer does not follow (dollar quoting, schema-qualified calls, escape strings)
//! counts as stateful. Not seen from the text: a view whose definition calls a function that
//! changes session state; the caller also resets after any reported parameter change.

/// Leading keywords of statements that only read.
const QUERY_KEYWORDS: &[&str] = &["select", "with", "values", "table", "show"];

/// Words that make a statement write or create something.
const WRITING_KEYWORDS: &[&str] = &["into", "insert", "update", "delete", "merge"];

/// Words that may stand before `(` without being a function call, and built-in functions that
/// leave no session state. Lowercase, sorted (searched by bisection).
const PAREN_OK: &[&str] = &[
    "abs",
    "age",
    "all",
    "and",
    "any",
    "array",
    "array_agg",
    "array_append",
    "array_length",
    "array_position",
    "array_remove",
    "array_to_string",
    "as",
    "avg",
    "between",
    "bigint",
    "bit",
    "bool_and",
    "bool_or",
    "btrim",
    "by",
    "cardinality",
    "case",
    "cast",
    "ceil",
    "ceiling",
    "char",
    "char_length",
    "character",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "cube",
    "cume_dist",
    "current_setting",
    "date_part",
    "date_trunc",
    "decimal",
    "dense_rank",
    "distinct",
    "else",
    "encode",
    "every",
    "except",
    "exists",
    "extract",
    "first_value",
    "float",
    "floor",
    "format",
    "from",
    "generate_series",
    "greatest",
    "group",
    "grouping",
    "having",
    "ilike",
    "in",
    "int",
    "integer",
    "intersect",
    "interval",
    "is",
    "join",
    "json_agg",
    "json_array_elements",
    "json_array_length",
    "json_build_array",
    "json_build_object",
    "json_each",
    "json_object_agg",
    "json_typeof",
    "jsonb_agg",
    "jsonb_array_elements",
    "jsonb_array_length",
    "jsonb_build_array",
    "jsonb_build_object",
    "jsonb_each",
    "jsonb_object_agg",
    "jsonb_set",
    "jsonb_strip_nulls",
    "jsonb_typeof",
    "lag",
    "last_value",
    "lateral",
    "lead",
    "least",
    "left",
    "length",
    "like",
    "limit",
    "lower",
    "lpad",
    "ltrim",
    "materialized",
    "max",
    "md5",
    "min",
    "mod",
    "not",
    "now",
    "nth_value",
    "ntile",
    "nullif",
    "numeric",
    "octet_length",
    "offset",
    "on",
    "or",
    "over",
    "percent_rank",
    "pg_typeof",
    "position",
    "power",
    "rank",
    "regexp_match",
    "regexp_matches",
    "regexp_replace",
    "replace",
    "right",
    "rollup",
    "round",
    "row",
    "row_number",
    "row_to_json",
    "rpad",
    "rtrim",
    "select",
    "sets",
    "sign",
    "smallint",
    "some",
    "split_part",
    "sqrt",
    "starts_with",
    "string_agg",
    "string_to_array",
    "strpos",
    "substr",
    "substring",
    "sum",
    "then",
    "time",
    "timestamp",
    "timestamptz",
    "to_char",
    "to_date",
    "to_json",
    "to_jsonb",
    "to_number",
    "to_timestamp",
    "trim",
    "trunc",
    "union",
    "unnest",
    "upper",
    "using",
    "values",
    "varchar",
    "varying",
    "version",
    "when",
    "where",
    "window",
    "with",
];

/// True when running `sql` leaves no session state behind (see the module comment).
pub fn leaves_no_state(sql: &str) -> bool {
    let mut lexer = Lexer {
        s: sql.as_bytes(),
        i: 0,
    };
    let Some(Token::Word(first)) = lexer.next() else {
        return false;
    };
    if !QUERY_KEYWORDS
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k.as_bytes()))
    {
        return false;
    }
    let mut previous = Token::Word(first);
    let mut qualified = false;
    let mut word_buf = String::new();
    loop {
        let Some(token) = lexer.next() else {
            return true;
        };
        match token {
            Token::Unknown => return false,
            Token::Open => {
                if let Token::Word(w) = previous {
                    word_buf.clear();
                    word_buf.extend(w.iter().map(|b| b.to_ascii_lowercase() as char));
                    if PAREN_OK.binary_search(&word_buf.as_str()).is_err() {
                        return false;
                    }
                    // A qualified name before `(` may be anyone's function.
                    if qualified {
                        return false;
                    }
                }
            }
            Token::Word(w) => {
                qualified = matches!(previous, Token::Dot);
                if WRITING_KEYWORDS
                    .iter()
                    .any(|k| w.eq_ignore_ascii_case(k.as_bytes()))
                {
                    return false;
                }
            }
            Token::Dot | Token::Other => {}
        }
        previous = token;
    }
}

#[derive(Clone, Copy)]
enum Token<'a> {
    /// A keyword or identifier (quoted ones without their quotes).
    Word(&'a [u8]),
    /// `(`.
    Open,
    /// `.`.
    Dot,
    /// Punctuation, numbers, string literals, parameters.
    Other,
    /// Something the lexer does not follow.
    Unknown,
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Lexer<'a> {
    fn peek(&self, ahead: usize) -> Option<u8> {
        self.s.get(self.i + ahead).copied()
    }

    fn skip_space_and_comments(&mut self) -> bool {
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(c), _) if c.is_ascii_whitespace() => self.i += 1,
                (Some(b'-'), Some(b'-')) => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                (Some(b'/'), Some(b'*')) => {
                    // Block comments nest in Postgres.
                    let mut depth = 0usize;
                    loop {
                        match (self.peek(0), self.peek(1)) {
                            (Some(b'/'), Some(b'*')) => {
                                depth += 1;
                                self.i += 2;
                            }
                            (Some(b'*'), Some(b'/')) => {
                                depth -= 1;
                                self.i += 2;
                                if depth == 0 {
                                    break;
                                }
                            }
                            (Some(_), _) => self.i += 1,
                            (None, _) => return false,
                        }
                    }
                }
                _ => return true,
            }
        }
    }

    fn next(&mut self) -> Option<Token<'a>> {
        if !self.skip_space_and_comments() {
            return Some(Token::Unknown);
        }
        let c = self.peek(0)?;
        let start = self.i;
        Some(match c {
            b'(' => {
                self.i += 1;
                Token::Open
            }
            b'.' => {
                self.i += 1;
                Token::Dot
            }
            b'\'' => {
                // A standard string: '' is a quote inside it.
                self.i += 1;
                loop {
                    match self.peek(0) {
                        Some(b'\'') if self.peek(1) == Some(b'\'') => self.i += 2,
                        Some(b'\'') => {
                            self.i += 1;
                            break Token::Other;
                        }
                        Some(_) => self.i += 1,
                        None => break Token::Unknown,
                    }
                }
            }
            b'"' => {
                self.i += 1;
                let from = self.i;
                loop {
                    match self.peek(0) {
                        Some(b'"') if self.peek(1) == Some(b'"') => self.i += 2,
                        Some(b'"') => {
                            self.i += 1;
                            break Token::Word(&self.s[from..self.i - 1]);
                        }
                        Some(_) => self.i += 1,
                        None => break Token::Unknown,
                    }
                }
            }
            b'$' => {
                self.i += 1;
                if !self.peek(0).is_some_and(|d| d.is_ascii_digit()) {
                    // Dollar quoting.
                    return Some(Token::Unknown);
                }
                while self.peek(0).is_some_and(|d| d.is_ascii_digit()) {
                    self.i += 1;
                }
                Token::Other
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                while self.peek(0).is_some_and(|d| {
                    d.is_ascii_alphanumeric() || d == b'_' || d == b'$' || d >= 0x80
                }) {
                    self.i += 1;
                }
                // E'...' (backslash escapes), U&'...', B'...', X'...' strings.
                if self.peek(0) == Some(b'\'') || self.peek(0) == Some(b'&') {
                    return Some(Token::Unknown);
                }
                Token::Word(&self.s[start..self.i])
            }
            _ => {
                self.i += 1;
                Token::Other
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_is_sorted() {
        assert!(PAREN_OK.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn plain_queries_leave_no_state() {
        for sql in [
            "SELECT 1",
            "select $1::int + 1 as n",
            "  -- note\n/* a /* nested */ comment */ SELECT count(*) FROM t WHERE a IN (1, 2)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "select 'it''s (set_config)' as s, \"Col\" from \"T\"",
            "SHOW search_path",
            "VALUES (1), (2)",
            "SELECT coalesce(a, 0), now() FROM t JOIN u USING (id) ORDER BY 1 LIMIT 5",
            "SELECT x::varchar(20), CAST(y AS numeric(10, 2)) FROM t",
        ] {
            assert!(leaves_no_state(sql), "{sql}");
        }
    }

    #[test]
    fn anything_that_may_leave_state_is_reset() {
        for sql in [
            "SET search_path = nowhere",
            "set_config('a', 'b', false)",
            "SELECT set_config('search_path', 'x', false)",
            "SELECT pg_advisory_lock(1)",
            "SELECT nextval('s')",
            "SELECT my_function()",
            "SELECT public.lower('A')",
            "SELECT \"set_config\"('a', 'b', false)",
            "SELECT * INTO TEMP t FROM u",
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "INSERT INTO t VALUES (1)",
            "PREPARE p AS SELECT 1",
            "LISTEN c",
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "CREATE TEMP TABLE t (a int)",
            "SELECT $$x$$",
            "SELECT E'\\''",
            "SELECT 'unterminated",
            "SELECT 1 /* unterminated",
            "",
            "BEGIN",
        ] {
            assert!(!leaves_no_state(sql), "{sql}");
        }
    }
}
