//! Every relative link in `README.md` and the book (`docs/src`) reaches a file that exists, and
//! every `#anchor` a heading of its page, so moving or renaming a chapter or a heading cannot
//! leave a dead link. Also that every page of the book is listed in its `SUMMARY.md` (a page
//! left out is never built).
//!
//! Anchors are derived as mdBook and GitHub derive them: the heading's text lower-cased, spaces
//! turned into `-`, everything but letters, digits, `-` and `_` dropped, and `-1`, `-2`, … added
//! to repeats. Links to other sites are not fetched (the tests run without a network).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The markdown files checked: the README and the book's pages.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut book: Vec<PathBuf> = std::fs::read_dir(repo().join("docs/src"))
        .expect("docs/src")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    book.sort();
    pages.extend(book);
    pages
}

/// The lines of `text` outside fenced code blocks, with inline code spans removed.
fn prose(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let kept: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        lines.push(kept);
    }
    lines
}

/// The targets of the `[text](target)` links in `text`.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    found
}

/// The anchor mdBook and GitHub give a heading.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().next()?),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The anchors of the headings of `text`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if in_code {
            continue;
        }
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading.trim().replace('`', "").as_str());
        let n = seen.entry(base.clone()).or_default();
        anchors.insert(match *n {
            0 => base.clone(),
            k => format!("{base}-{k}"),
        });
        *n += 1;
    }
    anchors
}

/// What is wrong with the link `target` on `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let file = match path {
        "" => page.to_path_buf(),
        path => page.parent().unwrap().join(path),
    };
    if !file.exists() {
        return Some(format!("{target}: no {}", file.display()));
    }
    if anchor.is_empty() || file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    (!anchors(&with_includes(&file)).contains(anchor))
        .then(|| format!("{target}: no heading #{anchor}"))
}

/// The text of `file` with mdBook's `{{#include path}}` lines replaced by the files they name, so
/// a page that includes another has its headings.
fn with_includes(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .map(|line| {
            match line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|rest| rest.strip_suffix("}}"))
            {
                Some(included) => {
                    std::fs::read_to_string(file.parent().unwrap().join(included.trim()))
                        .unwrap_or_else(|e| panic!("{}: {included}: {e}", file.display()))
                }
                None => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut dead = Vec::new();
    let mut count = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            count += 1;
            if let Some(why) = broken(&page, &target) {
                let name = page.strip_prefix(repo()).unwrap_or(&page).display();
                dead.push(format!("{name}: {why}"));
            }
        }
    }
    println!("{count} links checked");
    assert!(count > 0, "no links found");
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let summary = std::fs::read_to_string(repo().join("docs/src/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let missing: Vec<String> = pages()
        .iter()
        .skip(1)
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name))
        .collect();
    assert!(missing.is_empty(), "pages not in SUMMARY.md: {missing:?}");
}

#[test]
fn anchors_follow_the_heading_rules() {
    let text =
        "# Connect from …\n## `[local]` and more\n## Two\n## Two\n```sh\n# not a heading\n```\n";
    let found = anchors(text);
    let expected = ["connect-from-", "local-and-more", "two", "two-1"];
    assert_eq!(found, expected.iter().map(|s| s.to_string()).collect());
}
