//! No import circles between sibling modules of `operator/src`: when `a` uses `b`, `b` (and
//! what is inside it) does not use `a`. A circle makes two modules one in all but name, and they
//! came back after every tidy until this test watched for them.
//!
//! Reads the paths the code names (`crate::`, `super::`, `self::`, with `{...}` groups), not
//! comments and not test code (files named `tests.rs`, folders named `tests`, and everything
//! after a file's first `#[cfg(test)]`, where test modules sit).

use std::collections::{BTreeMap, BTreeSet};
#[path = "support/sources.rs"]
mod sources;

type Module = Vec<String>;

/// `core/plan/mod.rs` is module `core::plan`; `None` for test code.
fn module_of(file: &str) -> Option<Module> {
    let mut module: Module = (file.strip_suffix(".rs")?.split('/'))
        .map(str::to_owned)
        .collect();
    if module.iter().any(|m| m == "tests") {
        return None;
    }
    if matches!(
        module.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        module.pop();
    }
    Some(module)
}

/// The code of a file without its test modules and comment lines.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module path named in `code` from module `this`, resolved to a path from the crate.
fn named_paths(this: &Module, code: &str) -> Vec<Module> {
    let bytes = code.as_bytes();
    let word = |i: usize| {
        bytes
            .get(i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    };
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            if at > 0 && (word(at - 1) || bytes[at - 1] == b':') {
                continue;
            }
            let (base, rest) = path_at(this, &code[at..]);
            match rest.strip_prefix('{') {
                Some(group) => out.extend(group_items(group).into_iter().map(|item| {
                    let mut path = base.clone();
                    path.push(item);
                    path
                })),
                None => out.push(base),
            }
        }
    }
    out
}

/// Resolves `crate::a::b`, `super::super::c`, `self::d` at the start of `text`; returns the path
/// and what follows its last `::` (a `{` group, or the rest).
fn path_at<'t>(this: &Module, text: &'t str) -> (Module, &'t str) {
    let mut path: Module = Vec::new();
    let mut rest = text;
    let mut first = true;
    loop {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let segment = &rest[..end];
        match (first, segment) {
            (true, "crate") => {}
            (true, "self") => path = this.clone(),
            (_, "super") if first || path.len() < this.len() => {
                if first {
                    path = this.clone();
                }
                path.pop();
            }
            (_, "") => break,
            (_, segment) => path.push(segment.to_owned()),
        }
        first = false;
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    (path, rest)
}

/// The first name of each top-level item of a `{...}` group (`text` starts after the `{`).
fn group_items(text: &str) -> Vec<String> {
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(String::new()),
            _ if depth == 0 => items.last_mut().unwrap().push(c),
            _ => {}
        }
    }
    items
        .iter()
        .filter_map(|item| {
            let name: String = (item.trim_start().chars())
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && name != "self").then_some(name)
        })
        .collect()
}

#[test]
fn sibling_modules_do_not_import_each_other_in_a_circle() {
    let files = sources::files();
    let modules: BTreeSet<Module> = files.iter().filter_map(|(f, _)| module_of(f)).collect();
    let exists = |m: &[String]| modules.iter().any(|k| k.starts_with(m));
    // Edges between siblings: the modules where `this` and the path it names part ways.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in &files {
        let Some(this) = module_of(file) else {
            continue;
        };
        for path in named_paths(&this, &code_of(text)) {
            let common = this.iter().zip(&path).take_while(|(a, b)| a == b).count();
            if common < this.len() && common < path.len() && exists(&path[..=common]) {
                let from = this[..=common].join("/");
                let to = path[..=common].join("/");
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    let circles: Vec<String> = (edges.iter())
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from, to)))
        .filter(|(from, to)| reaches(&edges, to, from))
        .map(|(from, to)| format!("{from} -> {to}"))
        .collect();
    assert!(
        circles.is_empty(),
        "imports that close a circle between sibling modules (each edge shown can reach back):\n{}",
        circles.join("\n")
    );
    assert!(
        edges.len() > 20,
        "the scan found the imports ({} modules import siblings)",
        edges.len()
    );
}

/// Whether `from` reaches `to` along `edges`.
fn reaches(edges: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut next = vec![from.to_owned()];
    while let Some(at) = next.pop() {
        if at == to {
            return true;
        }
        if seen.insert(at.clone()) {
            next.extend(edges.get(&at).into_iter().flatten().cloned());
        }
    }
    false
}
