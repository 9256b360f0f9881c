//! Watching query texts as they stream past for session state that SQL cannot list afterwards:
//! the custom settings (`prefix.name`) a text creates (`SET`, `RESET`, `set_config`),
//! `setseed`, and whether it reads sequence state (`currval`, `lastval`).
//!
//! `pg_settings` leaves custom settings out, so a snapshot can only ask for them by name, and
//! the random generator's state cannot be read at all. The names come from every byte of a
//! Query's or Parse's text (not a prefix of it), and from the parameters bound to a statement
//! whose text passes its setting name as a parameter (`set_config($1, …)`). A name the text
//! computes at run time cannot be learnt, so such a text pins the session instead. A dotted
//! name passed as a literal argument to any function is kept as a candidate too: a function
//! or trigger the database holds may set a setting by the name it is given.

/// Bytes after a keyword that matching it may need (`set session ` and a long name).
const LOOKAHEAD: usize = 192;
/// Window capacity kept between messages; a larger one is freed.
const WINDOW_KEEP: usize = 512;

/// What the texts of one message showed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Findings {
    /// Custom setting names it may create, folded to lower case.
    pub names: Vec<String>,
    /// It calls `setseed`.
    pub seed: bool,
    /// It calls `currval` or `lastval`.
    pub sequence_read: bool,
    /// It passes a setting's name to `set_config` as a bound parameter.
    pub bound: bool,
    /// It passes a setting's name to `set_config` as an expression the gateway cannot read.
    pub computed: bool,
    /// Dotted names it passes as string literal arguments to any function (`dyn_set('app.x',
    /// …)`, `VALUES ('app.x', …)`): a function or trigger may set a setting by a name it is
    /// given, which no text shows in a `SET`.
    pub candidates: Vec<String>,
    /// It may change a setting that decides how a statement is parsed and its names resolved,
    /// or the role ([`CONTEXT_SETTINGS`]): `SET`, `RESET` or `set_config` of one of them (or of
    /// a name the gateway cannot read), `SET ROLE`, `SET SESSION AUTHORIZATION`, `RESET ALL`,
    /// `DISCARD`.
    pub context: bool,
    /// It runs a statement made with SQL `PREPARE` (`EXECUTE`).
    pub executes: bool,
}

impl Findings {
    /// Nothing found.
    pub(crate) const NONE: Findings = Findings {
        names: Vec::new(),
        seed: false,
        sequence_read: false,
        bound: false,
        computed: false,
        candidates: Vec::new(),
        context: false,
        executes: false,
    };
}

/// The settings that decide how Postgres reads a statement's text and resolves its names when
/// it prepares it, in the order a restore sets them: the session's identity first (setting
/// `session_authorization` resets `role`), then `search_path` (name lookup), and those that
/// change how the scanner reads strings or how a literal of a type is read (a `date`, a
/// `timestamptz`, an `interval`, an array, `xml`, `money`) or what `x = NULL` means.
pub const CONTEXT_SETTINGS: [&str; 13] = [
    "session_authorization",
    "role",
    "search_path",
    "datestyle",
    "intervalstyle",
    "timezone",
    "standard_conforming_strings",
    "transform_null_equals",
    "escape_string_warning",
    "backslash_quote",
    "array_nulls",
    "xmloption",
    "lc_monetary",
];

/// True when a `SET` or `RESET` of the word `w` (folded to lower case) may change a context
/// setting: one of them, or a form that names one without its name (`SET TIME ZONE`, `SET
/// SCHEMA`, `SET XML OPTION`, `SET SESSION AUTHORIZATION`, `RESET ALL`).
fn changes_context(w: &str) -> bool {
    CONTEXT_SETTINGS.contains(&w)
        || matches!(w, "authorization" | "time" | "schema" | "xml" | "all")
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Not a message with a query text.
    #[default]
    Off,
    /// In a Parse's statement name, before its text.
    Name,
    /// In the text.
    Text,
    /// Past the text's terminating NUL.
    Done,
}

/// Streaming scanner over the text of one client message at a time.
#[derive(Debug, Default)]
pub(crate) struct TextWatch {
    phase: Phase,
    /// Text not scanned yet; only the last [`LOOKAHEAD`] bytes wait for more.
    window: Vec<u8>,
    /// The byte before `window[0]` (a space at the start of a text).
    before: u8,
    found: Findings,
}

impl TextWatch {
    /// Drops the scan window's spare room (called between messages only).
    pub(crate) fn release_buffer(&mut self) {
        self.window = Vec::new();
    }

    /// A message with `tag` begins.
    pub fn start(&mut self, tag: u8) {
        self.phase = match tag {
            b'Q' => Phase::Text,
            b'P' => Phase::Name,
            _ => Phase::Off,
        };
        self.window.clear();
        self.before = b' ';
    }

    /// The next payload bytes of the current message.
    pub fn bytes(&mut self, mut data: &[u8]) {
        loop {
            match self.phase {
                Phase::Off | Phase::Done => return,
                Phase::Name => match memchr::memchr(0, data) {
                    Some(i) => {
                        data = &data[i + 1..];
                        self.phase = Phase::Text;
                    }
                    None => return,
                },
                Phase::Text => {
                    let end = memchr::memchr(0, data);
                    // A whole text in one chunk (most are) is scanned where it lies.
                    if let Some(end) = end
                        && self.window.is_empty()
                    {
                        scan_text(&data[..end], end, self.before, &mut self.found);
                        self.phase = Phase::Done;
                        return;
                    }
                    self.window
                        .extend_from_slice(&data[..end.unwrap_or(data.len())]);
                    if end.is_some() {
                        self.scan(self.window.len());
                        self.phase = Phase::Done;
                    } else {
                        self.scan(self.window.len().saturating_sub(LOOKAHEAD));
                    }
                    return;
                }
            }
        }
    }

    /// The message ended: what its text showed, `None` when nothing (no text, or nothing the
    /// watch looks for: most messages).
    pub fn finish(&mut self) -> Option<Findings> {
        match self.phase {
            // Nothing was scanned since the last finish.
            Phase::Off => return None,
            Phase::Text => self.scan(self.window.len()),
            Phase::Name | Phase::Done => {}
        }
        self.phase = Phase::Off;
        self.window.clear();
        if self.window.capacity() > WINDOW_KEEP {
            self.window = Vec::new();
        }
        (self.found != Findings::NONE).then(|| std::mem::take(&mut self.found))
    }

    /// Looks for keywords that start before `upto`, then drops those bytes.
    fn scan(&mut self, upto: usize) {
        scan_text(&self.window, upto, self.before, &mut self.found);
        if upto > 0 {
            self.before = self.window[upto - 1];
            self.window.drain(..upto);
        }
    }
}

/// A byte of a word ([`is_word`]).
const WORD: u8 = 1;
/// A byte that may begin a keyword [`note_at`] looks for (the first letters of `setseed`,
/// `discard`, `execute`, `currval`, `lastval`, `set_config`, `set` and `reset`, in either case).
const KEYWORD_START: u8 = 2;
/// A string literal's opening quote.
const QUOTE: u8 = 4;

/// Each byte's classes: the scan passes over the rest of a word once its first byte is seen,
/// and most words begin nothing the watch looks for, which keeps it cheap on texts that change
/// no state.
static BYTE_CLASS: [u8; 256] = byte_classes();

const fn byte_classes() -> [u8; 256] {
    let mut classes = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        if is_word(b as u8) {
            classes[b] = WORD;
        }
        b += 1;
    }
    let starts = b"sdeclrSDECLR";
    let mut i = 0;
    while i < starts.len() {
        classes[starts[i] as usize] |= KEYWORD_START;
        i += 1;
    }
    classes[b'\'' as usize] = QUOTE;
    classes
}

/// Looks for keywords in `text` that start before `upto`; `before` is the byte before it.
fn scan_text(text: &[u8], upto: usize, mut before: u8, found: &mut Findings) {
    let scanned = &text[..upto];
    let mut i = 0;
    while let Some(&b) = scanned.get(i) {
        let class = BYTE_CLASS[b as usize];
        if class & WORD != 0 {
            if class & KEYWORD_START != 0 && !is_word(before) {
                note_at(&text[i..], found);
            }
            let rest = &scanned[i + 1..];
            let len = rest
                .iter()
                .position(|&b| BYTE_CLASS[b as usize] & WORD == 0)
                .unwrap_or(rest.len());
            i += len;
        } else if class & QUOTE != 0
            && (before == b'(' || before == b',' || before.is_ascii_whitespace())
            && let Some(name) = literal_name(&text[i + 1..])
            && name.contains('.')
        {
            found.candidates.push(name);
        }
        before = scanned[i];
        i += 1;
    }
}

/// Records what a keyword at the start of `w` (a word boundary) does.
fn note_at(w: &[u8], found: &mut Findings) {
    // The first letter, folded, rules out most keywords before any comparison.
    let first = w.first().map_or(0, |&b| b | 0x20);
    if first == b's' && keyword(w, b"setseed").is_some() {
        found.seed = true;
    } else if first == b'd' && keyword(w, b"discard").is_some() {
        found.context = true;
    } else if first == b'e' && keyword(w, b"execute").is_some() {
        found.executes = true;
    } else if (first == b'c' && keyword(w, b"currval").is_some())
        || (first == b'l' && keyword(w, b"lastval").is_some())
    {
        found.sequence_read = true;
    } else if first == b's'
        && let Some(rest) = keyword(w, b"set_config")
    {
        let rest = skip_space(rest);
        let Some(rest) = rest.strip_prefix(b"(") else {
            return;
        };
        let rest = skip_space(rest);
        match rest.first() {
            Some(b'\'') => match literal_name(&rest[1..]) {
                // A built-in setting (no dot) shows in pg_settings: nothing to remember.
                Some(name) if name.contains('.') => found.names.push(name),
                Some(name) => found.context |= CONTEXT_SETTINGS.contains(&name.as_str()),
                None => {
                    found.computed = true;
                    found.context = true;
                }
            },
            // Whether the name is one of them shows in each Bind.
            Some(b'$') if rest.get(1).is_some_and(u8::is_ascii_digit) => found.bound = true,
            _ => {
                found.computed = true;
                found.context = true;
            }
        }
    } else if (first == b's' || first == b'r')
        && let Some(rest) = keyword(w, b"set").or_else(|| keyword(w, b"reset"))
        && rest.first().is_some_and(u8::is_ascii_whitespace)
    {
        // RESET of a custom setting defines it (empty) as SET does.
        let mut rest = skip_space(rest);
        for scope in [&b"session"[..], b"local"] {
            if let Some(after) = keyword(rest, scope)
                && after.first().is_some_and(u8::is_ascii_whitespace)
            {
                rest = skip_space(after);
            }
        }
        let quoted = rest.strip_prefix(b"\"").and_then(|q| {
            let end = q.iter().position(|&b| b == b'"')?;
            setting_name(&q[..end]).filter(|(_, after)| after.is_empty())
        });
        if let Some((name, _)) = quoted.or_else(|| setting_name(rest)) {
            found.names.push(name);
        }
        found.context |= changes_context(&first_word(rest));
    }
}

/// The name in a string literal whose opening quote ends before `w`, when the literal is the
/// whole argument (`'app.x'` then `,` or `)`), folded to lower case: a setting name, dotted or
/// not. `None` when the argument is computed (`'app.' || x`) or not a plain name.
fn literal_name(w: &[u8]) -> Option<String> {
    let len = w
        .iter()
        .take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.')
        .count();
    let after = w.get(len)?;
    let next = skip_space(&w[len + 1..]).first();
    let whole = *after == b'\'' && matches!(next, Some(b',') | Some(b')'));
    if !whole || len == 0 {
        return None;
    }
    let name = &w[..len];
    if name.contains(&b'.') {
        setting_name(name).map(|(n, _)| n)
    } else {
        Some(String::from_utf8_lossy(name).to_ascii_lowercase())
    }
}

/// The word (or quoted name) at the start of `w`, folded to lower case.
fn first_word(w: &[u8]) -> String {
    let w = w.strip_prefix(b"\"").unwrap_or(w);
    let len = w.iter().take_while(|&&b| is_word(b)).count();
    String::from_utf8_lossy(&w[..len]).to_ascii_lowercase()
}

/// The rest of `w` after `word` (compared without case) when the word ends there.
fn keyword<'a>(w: &'a [u8], word: &[u8]) -> Option<&'a [u8]> {
    let head = w.get(..word.len())?;
    let rest = &w[word.len()..];
    (head.eq_ignore_ascii_case(word) && !rest.first().is_some_and(|&b| is_word(b))).then_some(rest)
}

fn skip_space(w: &[u8]) -> &[u8] {
    let n = w.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &w[n..]
}

const fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// A custom setting name (`a.b`, `a.b.c`: identifier parts joined by dots) at the start of `w`,
/// folded to lower case, and the bytes after it.
fn setting_name(w: &[u8]) -> Option<(String, &[u8])> {
    let len = w
        .iter()
        .take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.')
        .count();
    let name = &w[..len];
    let parts_ok = name.split(|&b| b == b'.').all(|p| {
        p.first()
            .is_some_and(|&b| b.is_ascii_alphabetic() || b == b'_')
    });
    let dotted = name.contains(&b'.');
    (dotted && parts_ok && len <= LOOKAHEAD / 2).then(|| {
        (
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            &w[len..],
        )
    })
}

/// The parameters of a Bind whose first bytes are `body`, and whether they are all there (a
/// parameter cut off by the end of `body` is not read). A NULL is left out.
fn bind_params(body: &[u8]) -> (Vec<&[u8]>, bool) {
    let mut out = Vec::new();
    let mut rest = body;
    for _ in 0..2 {
        let Some(end) = rest.iter().position(|&b| b == 0) else {
            return (out, false);
        };
        rest = &rest[end + 1..];
    }
    let int16 = |r: &[u8]| {
        r.get(..2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    };
    let Some(formats) = int16(rest) else {
        return (out, false);
    };
    let Some(after_formats) = rest.get(2 + 2 * formats..) else {
        return (out, false);
    };
    rest = after_formats;
    let Some(count) = int16(rest) else {
        return (out, false);
    };
    rest = &rest[2..];
    for _ in 0..count {
        let Some(len) = rest
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return (out, false);
        };
        rest = &rest[4..];
        let Ok(len) = usize::try_from(len) else {
            continue;
        };
        let Some(value) = rest.get(..len) else {
            return (out, false);
        };
        out.push(value);
        rest = &rest[len..];
    }
    (out, true)
}

/// The custom setting names among the parameters of a Bind whose first bytes are `body`.
/// Binary parameters count too: a text parameter's binary form is its text, and anything else
/// that happens to read as a name is only a name to ask about.
pub(crate) fn bind_setting_names(body: &[u8]) -> Vec<String> {
    bind_params(body)
        .0
        .into_iter()
        .filter_map(|value| setting_name(value).filter(|(_, after)| after.is_empty()))
        .map(|(name, _)| name)
        .collect()
}

/// True when a Bind whose first bytes are `body`, of a statement that passes a setting's name
/// as a parameter, may name a [`CONTEXT_SETTINGS`] one: a parameter is one of their names, or
/// the parameters are not all there.
pub(crate) fn bind_names_context(body: &[u8]) -> bool {
    let (params, whole) = bind_params(body);
    !whole
        || params.iter().any(|p| {
            CONTEXT_SETTINGS
                .iter()
                .any(|n| p.trim_ascii().eq_ignore_ascii_case(n.as_bytes()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan as first written, one byte at a time: the word-skipping scan must find the same.
    fn scan_each_byte(text: &[u8], upto: usize, mut before: u8, found: &mut Findings) {
        for (i, &b) in text[..upto].iter().enumerate() {
            let starts = b"sdeclrSDECLR".contains(&b) && !is_word(before);
            if starts {
                note_at(&text[i..], found);
            } else if b == b'\''
                && (before == b'(' || before == b',' || before.is_ascii_whitespace())
                && let Some(name) = literal_name(&text[i + 1..])
                && name.contains('.')
            {
                found.candidates.push(name);
            }
            before = b;
        }
    }

    proptest::proptest! {
        #[test]
        fn skipping_words_finds_what_each_byte_finds(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "set ", "SET LOCAL ", "reset ", "set_config(", "setseed(", "discard ", "execute ",
                "currval(", "lastval()", "select ", "resets ", "xset ", "a.b", "'app.x'", "'x.y', ",
                "(", ")", ",", " ", "\n", "$1", "_e", "é", "日本", "ẞ", "\"q.r\"", "=", ";", "s", "e",
            ]), 0..40),
            upto_cut in 0usize..8,
            before in proptest::sample::select(vec![b' ', b'a', b'(', b',', b'_', 0xc3]),
        ) {
            let text = parts.concat().into_bytes();
            let upto = text.len().saturating_sub(upto_cut);
            let (mut fast, mut each) = (Findings::default(), Findings::default());
            scan_text(&text, upto, before, &mut fast);
            scan_each_byte(&text, upto, before, &mut each);
            proptest::prop_assert_eq!(fast, each);
        }
    }

    fn watch(tag: u8, body: &[u8], chunk: usize) -> Findings {
        let mut w = TextWatch::default();
        w.start(tag);
        for c in body.chunks(chunk.max(1)) {
            w.bytes(c);
        }
        w.finish().unwrap_or_default()
    }

    fn query(text: &str) -> Vec<u8> {
        let mut b = text.as_bytes().to_vec();
        b.push(0);
        b
    }

    #[test]
    fn names_anywhere_in_a_long_text_and_across_chunks() {
        let text = format!(
            "select '{}'; SET app.late = 1; set session My.Y to 2; SET LOCAL tx.z = 3; \
             select pg_catalog.set_config ( 'app.w', 'v', false), set_config('App.Q','x',true); \
             update t set col = 1; set search_path = x",
            "x".repeat(5000)
        );
        for chunk in [1, 7, 100, 4096, 100_000] {
            let f = watch(b'Q', &query(&text), chunk);
            assert_eq!(
                f.names,
                ["app.late", "my.y", "tx.z", "app.w", "app.q"],
                "{chunk}"
            );
            assert!(!f.seed && !f.bound && !f.computed);
        }
    }

    #[test]
    fn parse_text_after_the_statement_name() {
        let mut body = b"set app.no\0select set_config($1, $2, false)\0".to_vec();
        body.extend([0, 0]);
        let f = watch(b'P', &body, 3);
        assert!(f.names.is_empty() && f.bound && !f.computed);
    }

    #[test]
    fn built_in_names_and_quoted_names() {
        let f = watch(
            b'Q',
            &query(
                "select set_config('search_path', 'x', false), set_config( 'TimeZone' ,'UTC', false)",
            ),
            3,
        );
        assert!(f.names.is_empty() && !f.computed, "{f:?}");
        let f = watch(b'Q', &query("SET \"App.MixedCase\" = 'v'"), 4);
        assert_eq!(f.names, ["app.mixedcase"]);
        let f = watch(b'Q', &query("RESET app.never; RESET ALL; reset role"), 3);
        assert_eq!(f.names, ["app.never"]);
    }

    #[test]
    fn computed_names_and_setseed() {
        let f = watch(
            b'Q',
            &query("select set_config('app.' || x, 'v', false)"),
            5,
        );
        assert!(f.computed && f.names.is_empty());
        let f = watch(
            b'Q',
            &query("do $$ begin perform set_config(n, 'v', false); end $$"),
            64,
        );
        assert!(f.computed);
        assert!(watch(b'Q', &query("SELECT SetSeed(0.5)"), 2).seed);
        assert!(!watch(b'Q', &query("select reset_seed, offset_x from t"), 2).seed);
        assert!(watch(b'Q', &query("select 1; SELECT CurrVal('s')"), 3).sequence_read);
        assert!(watch(b'Q', &query("select lastval ()"), 1).sequence_read);
        assert!(!watch(b'Q', &query("select my_currval, lastvalue from t"), 2).sequence_read);
        assert_eq!(watch(b'B', b"whatever\0", 1), Findings::default());
    }

    #[test]
    fn texts_that_change_how_statements_are_read() {
        for text in [
            "SET datestyle = 'ISO, DMY'",
            "set local TimeZone to 'UTC'",
            "select 1; SET \"search_path\" = x",
            "SET TIME ZONE 'Europe/Paris'",
            "set schema 'app'",
            "SET ROLE r0",
            "reset role",
            "SET SESSION AUTHORIZATION u",
            "RESET ALL",
            "DISCARD ALL",
            "select set_config('DateStyle', 'ISO, DMY', false)",
            "select set_config(n, 'v', false) from t",
            "set standard_conforming_strings = off",
            "SET xml option document",
        ] {
            for chunk in [1, 4, 4096] {
                assert!(watch(b'Q', &query(text), chunk).context, "{text} ({chunk})");
            }
        }
        for text in [
            "SET application_name = 'a'",
            "set statement_timeout = 5",
            "SET app.tenant = 'x'",
            "update t set datestyle_col = 1",
            "select set_config('app.x', 'v', false)",
            "select reset_x, settle from t",
            "SET NAMES 'LATIN1'",
        ] {
            assert!(!watch(b'Q', &query(text), 3).context, "{text}");
        }
        assert!(watch(b'Q', &query("EXECUTE p(1)"), 2).executes);
        assert!(!watch(b'Q', &query("select executed from t"), 2).executes);
    }

    fn bind(formats: &[u16], params: &[Option<&[u8]>]) -> Vec<u8> {
        let mut b = b"\0stmt\0".to_vec();
        b.extend((formats.len() as u16).to_be_bytes());
        for f in formats {
            b.extend(f.to_be_bytes());
        }
        b.extend((params.len() as u16).to_be_bytes());
        for p in params {
            match p {
                Some(v) => {
                    b.extend((v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v);
                }
                None => b.extend((-1i32).to_be_bytes()),
            }
        }
        b
    }

    #[test]
    fn dotted_literal_arguments_are_candidates() {
        let text = "select dyn_set('App.Dyn', 'v'), f( 'x.y' ), g('a.b' || c); \
                    insert into kv values ('app.row','v'); select 'not.arg' as n, 'it''s.x'";
        for chunk in [1, 5, 4096] {
            let f = watch(b'Q', &query(text), chunk);
            assert_eq!(f.candidates, ["app.dyn", "x.y", "app.row"], "{chunk}");
            assert!(f.names.is_empty() && !f.computed);
        }
        let f = watch(b'Q', &query("select set_config('app.w', 'v', false)"), 3);
        assert_eq!(
            (f.names, f.candidates),
            (vec!["app.w".into()], vec!["app.w".into()])
        );
    }

    #[test]
    fn bound_names_in_text_parameters() {
        let body = bind(&[], &[Some(b"App.Tenant"), None, Some(b"acme")]);
        assert_eq!(bind_setting_names(&body), ["app.tenant"]);
        // tokio-postgres sends a text parameter in binary form, which is the same bytes.
        let body = bind(&[0, 1], &[Some(b"app.a"), Some(b"app.b")]);
        assert_eq!(bind_setting_names(&body), ["app.a", "app.b"]);
        let body = bind(&[1], &[Some(b"app.a"), Some(&7i32.to_be_bytes())]);
        assert_eq!(bind_setting_names(&body), ["app.a"]);
        assert!(bind_setting_names(&body[..body.len() - 6]).len() == 1);
        assert!(bind_setting_names(&body[..8]).is_empty());
        assert!(bind_setting_names(&bind(&[], &[Some(b"app.x y")])).is_empty());
        assert!(!bind_names_context(&bind(
            &[],
            &[Some(b"app.tenant"), Some(b"v")]
        )));
        assert!(bind_names_context(&bind(
            &[],
            &[Some(b"DateStyle"), Some(b"ISO, DMY")]
        )));
        let role = bind(&[], &[Some(b"role"), Some(b"r0")]);
        assert!(bind_names_context(&role));
        assert!(bind_names_context(&role[..role.len() - 1]), "cut off");
    }
}
