//! The module graph of a crate, read from its source text, for the layout tests of every crate:
//! which top-level modules use which, which files of a folder use which, and the circles among
//! them.
//!
//! A use is a path in the code (comments and `#[cfg(test)]` modules left out): `crate::…`,
//! `super::…`, `self::…`, or a child module named from its parent's file. A name a folder's
//! `mod.rs` (or the crate root) re-exports with `pub use` is followed to the file that defines
//! it, so `super::Admission` in `wake/slot.rs` is a use of `wake/queue.rs`. Re-exports are the
//! folder's handles, not uses of their own.
//!
//! Folders one level deep are what the crates have (`routing/src/wake/slot.rs`); deeper ones
//! are refused, so a new level cannot go unchecked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A directed graph of modules or files, each with what it uses.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file of a crate.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Top-level module (`wake` for `wake/slot.rs`; `lib` or `main` for the crate root).
    pub module: String,
    /// File within its folder (`slot`, or `mod` for the folder's own file and a top-level file).
    pub file: String,
    /// The code: comments, `pub use` re-exports in a folder's `mod.rs` or the root, and test
    /// modules left out.
    pub code: String,
    /// The whole file.
    pub raw: String,
}

impl SourceFile {
    /// `module/file`, as the file graphs name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.module, self.file)
    }
}

/// One use of another module or file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    /// The using file, `module/file`.
    pub from: String,
    /// The used top-level module.
    pub module: String,
    /// The used file within it (`mod` for the folder's own file or a top-level file).
    pub file: String,
    /// True when the path names the file itself (`crate::wake::slot::Slot`) rather than what the
    /// folder's `mod.rs` exports.
    pub names_file: bool,
    /// The path as written, after `crate::`.
    pub path: String,
}

/// A crate's sources and the uses between them.
#[derive(Debug)]
pub struct Layout {
    /// Every source file, except modules compiled for tests only.
    pub files: Vec<SourceFile>,
    /// Every use of another file.
    pub uses: Vec<Use>,
    /// Files a folder's `mod.rs` declares `pub mod`: handles of the folder like its re-exports.
    pub public_files: BTreeSet<String>,
}

impl Layout {
    /// Reads the crate whose sources are under `src` (its `lib.rs` or `main.rs` and their
    /// modules).
    pub fn read(src: &Path) -> Layout {
        let mut files = Vec::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("readable src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(source(src, &path));
                }
            }
        }
        let test_only = test_only_modules(&files);
        files.retain(|f| !test_only.contains(&f.name()));
        files.sort_by_key(SourceFile::name);
        let index = Index::new(&files);
        let mut uses: Vec<Use> = files.iter().flat_map(|f| index.uses(f)).collect();
        uses.sort();
        uses.dedup();
        let public_files = files
            .iter()
            .filter(|f| f.file == "mod" && !is_root(&f.module))
            .flat_map(|f| {
                f.raw.lines().filter_map(|l| {
                    let name = l.trim().strip_prefix("pub mod ")?.strip_suffix(';')?;
                    Some(format!("{}/{name}", f.module))
                })
            })
            .collect();
        Layout {
            files,
            uses,
            public_files,
        }
    }

    /// The crate at `manifest_dir` (`env!("CARGO_MANIFEST_DIR")` of a test).
    pub fn of_crate(manifest_dir: &str) -> Layout {
        Layout::read(&PathBuf::from(manifest_dir).join("src"))
    }

    /// Top-level modules and the other top-level modules each uses.
    pub fn modules(&self) -> Graph {
        let mut graph = Graph::new();
        for f in &self.files {
            graph.entry(f.module.clone()).or_default();
        }
        for u in &self.uses {
            let from = u.from.split('/').next().unwrap_or_default();
            if from != u.module {
                graph
                    .entry(from.to_owned())
                    .or_default()
                    .insert(u.module.clone());
            }
        }
        graph
    }

    /// For each folder, its files (`module/file`) and the files of the same folder each uses.
    /// The folder's own `mod.rs` is its face: it declares the files and may call on them, and
    /// those uses are not arrows here (the files using `mod.rs` are).
    pub fn folders(&self) -> BTreeMap<String, Graph> {
        let mut out: BTreeMap<String, Graph> = BTreeMap::new();
        for f in &self.files {
            if self.is_folder(&f.module) {
                out.entry(f.module.clone())
                    .or_default()
                    .entry(f.name())
                    .or_default();
            }
        }
        for u in &self.uses {
            let (module, _) = u.from.split_once('/').unwrap_or_default();
            let to = format!("{}/{}", u.module, u.file);
            let from_face = u.from.ends_with("/mod");
            if module == u.module && u.from != to && !from_face && self.is_folder(module) {
                out.entry(module.to_owned())
                    .or_default()
                    .entry(u.from.clone())
                    .or_default()
                    .insert(to);
            }
        }
        out
    }

    fn is_folder(&self, module: &str) -> bool {
        self.files
            .iter()
            .any(|f| f.module == module && f.file != "mod")
    }

    /// Every circle of the module graph and of each folder's file graph, in words: the modules
    /// (or files) that reach each other, and one way round them.
    pub fn circles(&self) -> Vec<String> {
        let mut graphs = vec![self.modules()];
        graphs.extend(self.folders().into_values());
        let mut out = Vec::new();
        for graph in &graphs {
            for path in circles(graph) {
                let members = reaching_each_other(graph, &path[0]);
                let members: Vec<&str> = members.iter().map(String::as_str).collect();
                out.push(format!(
                    "{} reach each other (one way round: {})",
                    members.join(", "),
                    path.join(" → ")
                ));
            }
        }
        out
    }

    /// Uses that name a file of another module's folder instead of what the folder's `mod.rs`
    /// exports (its handles), as `from: path`.
    pub fn reaches_in(&self) -> Vec<String> {
        self.uses
            .iter()
            .filter(|u| u.names_file && !u.from.starts_with(&format!("{}/", u.module)))
            .filter(|u| {
                !self
                    .public_files
                    .contains(&format!("{}/{}", u.module, u.file))
            })
            .map(|u| format!("{}: crate::{}", u.from, u.path))
            .collect()
    }

    /// What the rules every crate keeps find wrong: a circle between its top-level modules or
    /// between the files of a folder, a module reaching into another folder's files instead of
    /// using its handles, an arrow running back up against `levels` (see [`against`]).
    pub fn problems(&self, levels: &[&[&str]]) -> Vec<String> {
        let mut out: Vec<String> = self
            .circles()
            .iter()
            .map(|c| format!("import circle: {c}"))
            .collect();
        out.extend(
            self.reaches_in()
                .into_iter()
                .map(|r| format!("reaches into another folder's file: {r}")),
        );
        out.extend(
            against(&self.modules(), levels)
                .into_iter()
                .map(|(from, to)| format!("arrow running back up: {from} → {to}")),
        );
        if !levels.is_empty() {
            out.extend(
                self.modules()
                    .keys()
                    .filter(|m| !levels.iter().any(|l| l.contains(&m.as_str())))
                    .map(|m| format!("module {m} is on no level: place it")),
            );
        }
        out
    }

    /// The module graph and each folder's file graph as text, with the count of circles.
    pub fn describe(&self, name: &str) -> String {
        let mut out = String::new();
        let modules = self.modules();
        let arrows: usize = modules.values().map(BTreeSet::len).sum();
        let _ = writeln!(
            out,
            "{name}: {} modules, {arrows} arrows, {} circles",
            modules.len(),
            circles(&modules).len()
        );
        write_graph(&mut out, &modules, "  ");
        for (folder, graph) in self.folders() {
            let arrows: usize = graph.values().map(BTreeSet::len).sum();
            let _ = writeln!(
                out,
                "  {folder}/: {} files, {arrows} arrows, {} circles",
                graph.len(),
                circles(&graph).len()
            );
            write_graph(&mut out, &graph, "    ");
        }
        out
    }
}

fn write_graph(out: &mut String, graph: &Graph, indent: &str) {
    for (node, uses) in graph {
        let uses: Vec<&str> = uses.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{indent}{node} → {}", uses.join(", "));
    }
}

fn source(root: &Path, path: &Path) -> SourceFile {
    let rel = path.strip_prefix(root).expect("under src");
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    assert!(
        parts.len() <= 2,
        "{}: folders deeper than one level are not read",
        rel.display()
    );
    let raw = std::fs::read_to_string(path).expect("readable source");
    let (module, file) = match parts.as_slice() {
        [module] => (module.clone(), "mod".to_owned()),
        [module, file] => (module.clone(), file.clone()),
        _ => unreachable!(),
    };
    // A folder's `mod.rs` and the root re-export their children: handles, not uses.
    let code = code_of(&raw, parts.len() == 2 && file == "mod" || is_root(&module));
    SourceFile {
        module,
        file,
        code,
        raw,
    }
}

/// The code of a file: without comments, without its test modules, and (in a file with
/// children) without its `pub use` re-exports.
fn code_of(raw: &str, has_children: bool) -> String {
    let mut out = Vec::new();
    let mut lines = raw.lines().peekable();
    let mut in_reexport = false;
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().contains("mod ") && next.ends_with('{'))
        {
            // A test module: skip to its closing brace at the same indentation.
            let indent = &line[..line.len() - trimmed.len()];
            let close = format!("{indent}}}");
            for l in lines.by_ref() {
                if l == close {
                    break;
                }
            }
            continue;
        }
        if has_children
            && (trimmed.starts_with("pub use ") || trimmed.starts_with("pub(crate) use "))
        {
            in_reexport = true;
        }
        if in_reexport {
            in_reexport = !line.trim_end().ends_with(';');
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

/// `module/file` names of files compiled only for tests (`#[cfg(test)] mod testing;`).
fn test_only_modules(files: &[SourceFile]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for f in files.iter().filter(|f| f.file == "mod") {
        let mut lines = f.raw.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "#[cfg(test)]" {
                continue;
            }
            let Some(next) = lines.next() else { break };
            let Some(name) = next
                .trim()
                .strip_suffix(';')
                .and_then(|d| d.rsplit_once("mod "))
                .map(|(_, name)| name.trim())
            else {
                continue;
            };
            if f.module == "lib" || f.module == "main" {
                out.insert(format!("{name}/mod"));
            } else {
                out.insert(format!("{}/{name}", f.module));
            }
        }
    }
    out
}

/// What each folder and the root hold and re-export.
struct Index {
    /// Top-level modules, and for each the files of its folder.
    modules: BTreeMap<String, BTreeSet<String>>,
    /// Re-exports of each folder's `mod.rs` (and of the root, under ""): name → path after it.
    reexports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Index {
    fn new(files: &[SourceFile]) -> Index {
        let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut reexports: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for f in files {
            modules
                .entry(f.module.clone())
                .or_default()
                .insert(f.file.clone());
            if f.file == "mod" {
                let key = if is_root(&f.module) { "" } else { &f.module };
                reexports
                    .entry(key.to_owned())
                    .or_default()
                    .extend(reexports_of(&f.raw));
            }
        }
        Index { modules, reexports }
    }

    /// The uses of other files in `f`.
    fn uses(&self, f: &SourceFile) -> Vec<Use> {
        let here = f.name();
        let mut out = Vec::new();
        for (start, rel) in relative_paths(&f.code, &self.children(f)) {
            let Some(abs) = self.absolute(f, start, rel) else {
                continue;
            };
            if let Some((module, file, names_file)) = self.resolve(&abs, 0)
                && format!("{module}/{file}") != here
            {
                out.push(Use {
                    from: here.clone(),
                    module,
                    file,
                    names_file,
                    path: abs.join("::"),
                });
            }
        }
        out
    }

    /// Modules a file may name without a prefix: the root's top-level modules, a folder's files.
    fn children(&self, f: &SourceFile) -> BTreeSet<String> {
        if is_root(&f.module) {
            self.modules
                .keys()
                .filter(|m| !is_root(m))
                .cloned()
                .collect()
        } else if f.file == "mod" {
            self.modules[&f.module]
                .iter()
                .filter(|x| *x != "mod")
                .cloned()
                .collect()
        } else {
            BTreeSet::new()
        }
    }

    /// The path from the crate root of a path written in `f` with prefix `start`.
    fn absolute(&self, f: &SourceFile, start: Start, rel: Vec<String>) -> Option<Vec<String>> {
        let folder = !is_root(&f.module) && self.modules[&f.module].len() > 1;
        let mut abs: Vec<String> = match (start, f.file.as_str(), folder) {
            (Start::Crate, ..) => Vec::new(),
            (Start::Child, _, _) if is_root(&f.module) => Vec::new(),
            (Start::Child | Start::SelfMod, "mod", true) => vec![f.module.clone()],
            (Start::SelfMod, "mod", false) => return None,
            (Start::SelfMod, file, _) => vec![f.module.clone(), file.to_owned()],
            (Start::Super(1), "mod", _) => Vec::new(),
            (Start::Super(1), _, _) => vec![f.module.clone()],
            (Start::Super(2), "mod", _) => return None,
            (Start::Super(2), _, _) => Vec::new(),
            _ => return None,
        };
        abs.extend(rel);
        Some(abs)
    }

    /// The module and file a path from the crate root lands in, and whether it names the file.
    fn resolve(&self, abs: &[String], depth: usize) -> Option<(String, String, bool)> {
        let first = abs.first()?;
        if depth > 4 {
            return None;
        }
        let Some(files) = self.modules.get(first).filter(|_| !is_root(first)) else {
            // Not a module: an item of the root, or one it re-exports.
            if let Some(path) = self.reexports.get("").and_then(|r| r.get(first)) {
                return self.resolve(path, depth + 1);
            }
            let root = self.modules.keys().find(|m| is_root(m))?;
            return Some((root.clone(), "mod".to_owned(), false));
        };
        let Some(second) = abs.get(1).filter(|_| files.len() > 1) else {
            return Some((first.clone(), "mod".to_owned(), false));
        };
        if files.contains(second) {
            return Some((first.clone(), second.clone(), true));
        }
        if let Some(path) = self.reexports.get(first).and_then(|r| r.get(second)) {
            let mut target = vec![first.clone()];
            target.extend(path.iter().cloned());
            if let Some((m, file, _)) = self.resolve(&target, depth + 1) {
                return Some((m, file, false));
            }
        }
        Some((first.clone(), "mod".to_owned(), false))
    }
}

fn is_root(module: &str) -> bool {
    module == "lib" || module == "main"
}

/// How a path starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    Crate,
    SelfMod,
    Super(usize),
    /// A child module named without a prefix.
    Child,
}

/// Every path of `code` starting with `crate::`, `self::`, `super::` or one of `children`, as
/// (how it starts, the segments after the prefix), braces expanded one level.
fn relative_paths(code: &str, children: &BTreeSet<String>) -> Vec<(Start, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let boundary = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        if !boundary || !is_ident(bytes[i]) {
            i += 1;
            continue;
        }
        let end = code[i..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(code.len(), |e| i + e);
        let word = &code[i..end];
        if !code[end..].starts_with("::") {
            i = end;
            continue;
        }
        let mut rest = &code[end + 2..];
        let start = match word {
            "crate" => Start::Crate,
            "self" => Start::SelfMod,
            "super" => {
                let mut n = 1;
                while let Some(r) = rest.strip_prefix("super::") {
                    n += 1;
                    rest = r;
                }
                Start::Super(n)
            }
            w if children.contains(w) => {
                out.extend(expand(rest).into_iter().map(|mut p| {
                    p.insert(0, w.to_owned());
                    (Start::Child, p)
                }));
                i = end;
                continue;
            }
            _ => {
                i = end;
                continue;
            }
        };
        out.extend(expand(rest).into_iter().map(|p| (start, p)));
        i = end;
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The paths starting at `text`, expanding `{a, b::c}` one level.
fn expand(text: &str) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut rest = text;
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let end = inner.find('}').unwrap_or(inner.len());
            return inner[..end]
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|item| {
                    let mut p = segs.clone();
                    p.extend(
                        item.split("::")
                            .map(|s| s.split_whitespace().next().unwrap_or("").to_owned())
                            .filter(|s| !s.is_empty() && s != "self"),
                    );
                    p
                })
                .collect();
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            return vec![segs];
        }
        segs.push(rest[..end].to_owned());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![segs],
        }
    }
}

/// The `pub use` re-exports of a file: the name each makes visible → the path it stands for.
fn reexports_of(raw: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let raw = raw.replace("pub(crate) use ", "pub use ");
    let mut rest = raw.as_str();
    while let Some(at) = rest.find("pub use ") {
        let before = &rest[..at];
        rest = &rest[at + "pub use ".len()..];
        if !before.ends_with('\n') && !before.ends_with("    ") && !before.is_empty() {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        let stmt: String = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        let (prefix, items) = match stmt.split_once('{') {
            Some((prefix, items)) => (prefix, items.trim_end_matches('}')),
            None => match stmt.rsplit_once("::") {
                Some((prefix, item)) => (prefix, item),
                None => continue,
            },
        };
        let prefix: Vec<String> = prefix
            .trim_end_matches("::")
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        for item in items.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (path, alias) = match item.split_once(" as ") {
                Some((path, alias)) => (path.trim(), alias.trim()),
                None => (item, item.rsplit("::").next().unwrap_or(item)),
            };
            let mut full = prefix.clone();
            full.extend(path.split("::").map(str::to_owned));
            if full.first().is_some_and(|s| s == "crate" || s == "self") {
                full.remove(0);
            }
            out.insert(alias.to_owned(), full);
        }
    }
    out
}

/// The arrows of `graph` that run against `levels` (listed from the top: a level may use those
/// below it and its own members, never one above); modules in no level are not judged.
pub fn against(graph: &Graph, levels: &[&[&str]]) -> Vec<(String, String)> {
    let level = |m: &str| levels.iter().position(|l| l.contains(&m));
    let mut out = Vec::new();
    for (from, uses) in graph {
        for to in uses {
            if let (Some(a), Some(b)) = (level(from), level(to))
                && b < a
            {
                out.push((from.clone(), to.clone()));
            }
        }
    }
    out
}

/// Everything `from` reaches in `graph`.
fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(n) = stack.pop() {
        for next in graph.get(&n).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

/// The members of `graph` that `node` reaches and that reach it back (itself included when it
/// is on a circle).
fn reaching_each_other(graph: &Graph, node: &str) -> BTreeSet<String> {
    reach(graph, node)
        .into_iter()
        .filter(|m| reach(graph, m).contains(node))
        .collect()
}

/// The strongly connected parts of `graph` with more than one member, each as one path around
/// it (first member repeated at the end).
pub fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(graph, n))).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if placed.contains(*n) || !reaches[n].contains(*n) {
            continue;
        }
        let part: BTreeSet<String> = reaches[n]
            .iter()
            .filter(|m| reaches.get(m).is_some_and(|r| r.contains(*n)))
            .cloned()
            .collect();
        placed.extend(part.iter().cloned());
        out.push(path_around(graph, n, &part));
    }
    out
}

/// One path from `start` back to itself visiting each member of `part` at most once, preferring
/// a long one so the message names most of the circle.
fn path_around(graph: &Graph, start: &str, part: &BTreeSet<String>) -> Vec<String> {
    fn walk(
        graph: &Graph,
        start: &str,
        part: &BTreeSet<String>,
        path: &mut Vec<String>,
        best: &mut Vec<String>,
    ) {
        let last = path.last().cloned().unwrap_or_default();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start && path.len() + 1 > best.len() {
                *best = path.clone();
                best.push(start.to_owned());
            } else if part.contains(next) && !path.contains(next) {
                path.push(next.clone());
                walk(graph, start, part, path, best);
                path.pop();
            }
        }
    }
    let mut best = Vec::new();
    walk(graph, start, part, &mut vec![start.to_owned()], &mut best);
    best
}

/// How a function's first line starts, after its indentation.
const FN_STARTS: &[&str] = &[
    "fn ",
    "async fn ",
    "pub fn ",
    "pub async fn ",
    "pub(crate) fn ",
    "pub(crate) async fn ",
    "pub(super) fn ",
    "pub(super) async fn ",
    "const fn ",
    "pub const fn ",
];

/// Functions of `text` as (name, lines), from their `fn` line to the closing brace at the same
/// indentation (the sources are formatted by rustfmt).
pub fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let decl = FN_STARTS.iter().find_map(|p| trimmed.strip_prefix(p));
        let Some(rest) = decl else { continue };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            out.push((name, end + 2));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_found_from_every_start() {
        let children: BTreeSet<String> = ["slot".to_owned()].into();
        let found = relative_paths(
            "use super::{a::B, C};\nuse crate::x::y;\nlet s = slot::Slot::new(super::super::z::W);",
            &children,
        );
        let text: Vec<String> = found
            .iter()
            .map(|(s, p)| format!("{s:?} {}", p.join("::")))
            .collect();
        assert_eq!(
            text,
            [
                "Super(1) a::B",
                "Super(1) C",
                "Crate x::y",
                "Child slot::Slot::new",
                "Super(2) z::W"
            ]
        );
    }

    #[test]
    fn reexports_name_their_source() {
        let r = reexports_of(
            "pub use a::{B, c::D as E};\npub use f::G;\n    pub use crate::h::I;\n// pub use x::Y;\n",
        );
        assert_eq!(r["B"], ["a", "B"]);
        assert_eq!(r["E"], ["a", "c", "D"]);
        assert_eq!(r["G"], ["f", "G"]);
        assert_eq!(r["I"], ["h", "I"]);
        assert!(!r.contains_key("Y"));
    }

    #[test]
    fn circles_are_found_once_each() {
        let mut g = Graph::new();
        for (a, b) in [
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d"),
        ] {
            g.entry(a.into()).or_default().insert(b.into());
            g.entry(b.into()).or_default();
        }
        assert_eq!(circles(&g), [vec!["a", "b", "c", "a"], vec!["d", "e", "d"]]);
    }

    #[test]
    fn test_modules_are_not_code() {
        let code = code_of(
            "use crate::a::B;\n// crate::c\n#[cfg(test)]\nmod tests {\n    use crate::d::E;\n}\n",
            false,
        );
        assert_eq!(code, "use crate::a::B;");
    }
}
