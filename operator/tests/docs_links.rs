//! Every relative link of README.md and docs/ points at a file of the repository, and every
//! `#anchor` at a heading of the page it names (GitHub's heading anchors).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).expect("docs/ is readable") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The text outside fenced code blocks, where links are links.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).expect("page is readable");
    prose(&text)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links in one page's prose (code spans are not links).
fn links(text: &str) -> Vec<String> {
    let outside_code: String = text.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let mut found = Vec::new();
    let mut rest = outside_code.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            found.push(rest[..end].to_owned());
        }
    }
    found
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = prose(&std::fs::read_to_string(&page).expect("page is readable"));
        let dir = page.parent().expect("a page has a folder");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            let name = page.file_name().unwrap_or_default().to_string_lossy();
            if !target.exists() {
                broken.push(format!("{name}: {link}: no such file"));
            } else if !fragment.is_empty()
                && target.extension().is_some_and(|ext| ext == "md")
                && !anchors(&target).contains(fragment)
            {
                broken.push(format!("{name}: {link}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        anchor(" Reclaim: which workloads go"),
        "reclaim-which-workloads-go"
    );
    assert_eq!(anchor("`teamgpu plan`"), "teamgpu-plan");
    assert_eq!(links("see [a](b.md#c) and [d](e)"), ["b.md#c", "e"]);
    assert_eq!(links("`^[a-z]([-a-z]*)?$` and [f](g)"), ["g"]);
}
