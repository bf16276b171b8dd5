//! Every relative link of README.md and docs/ points at a file of the repository, every path a
//! page names in code exists, and every
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

/// Code spans that name a file or folder of the repository (`controller/observe.rs`,
/// `config/rbac/`): a path with a `/` ending in a known extension or in `/`.
fn named_paths(text: &str) -> Vec<String> {
    let extensions = [".rs", ".yaml", ".md", ".json", ".toml", "/"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            span.contains('/')
                && !span.starts_with(['/', '~', '.'])
                && extensions.iter().any(|ext| span.ends_with(ext))
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_path_a_page_names_exists() {
    // Pages name paths from the repository root, or inside `operator/src` or a crate.
    let bases = ["", "operator/src", "operator", "e2e"].map(|base| repo().join(base));
    let missing: Vec<String> = pages()
        .iter()
        .flat_map(|page| {
            let text = prose(&std::fs::read_to_string(page).expect("page is readable"));
            let name = page
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            named_paths(&text)
                .into_iter()
                .filter(|path| !bases.iter().any(|base| base.join(path).exists()))
                .map(move |path| format!("{name}: `{path}`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "pages name paths that do not exist: {missing:#?}"
    );
}

#[test]
fn links_anchors_and_paths_are_read_as_a_reader_reads_them() {
    assert_eq!(
        named_paths("see `controller/executor.rs`, `config/rbac/`, `a::b` and `~/.kube/config`"),
        ["controller/executor.rs", "config/rbac/"]
    );
    assert_eq!(
        anchor(" Reclaim: which workloads go"),
        "reclaim-which-workloads-go"
    );
    assert_eq!(anchor("`teamgpu plan`"), "teamgpu-plan");
    assert_eq!(links("see [a](b.md#c) and [d](e)"), ["b.md#c", "e"]);
    assert_eq!(links("`^[a-z]([-a-z]*)?$` and [f](g)"), ["g"]);
}
