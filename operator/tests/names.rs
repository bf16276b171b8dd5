//! One name per idea in `operator/src` (docs/architecture.md): the words that once meant two or
//! three things keep one meaning each, and no two error types share a name, so a log line or a
//! status that names an error says which step failed.

use std::collections::BTreeMap;

#[path = "support/sources.rs"]
mod sources;
use sources::files;

/// The identifiers of Rust source `text`, without comments, strings and char literals (whose
/// words are for people; the doc comments are read in review).
fn identifiers(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if matches!(bytes.get(i + 1), Some(b'#' | b'"')) => {
                let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                i = text[start..]
                    .find(&close)
                    .map_or(bytes.len(), |e| start + e + close.len());
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) is skipped as its quote.
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            }
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 3,
            b if ident(b) && !b.is_ascii_digit() => {
                let start = i;
                while i < bytes.len() && ident(bytes[i]) {
                    i += 1;
                }
                out.push(&text[start..i]);
            }
            _ => i += 1,
        }
    }
    out
}

#[test]
fn identifiers_are_found_outside_comments_strings_and_chars() {
    let text = "fn a<'a>(x: &'a str) -> char { // selector\n let _ = \"selector\"; \
                let _ = r#\"sel\"ector\"#; /* selector */ if x == \"\\\"\" { '\"' } else { '\\'' } }";
    assert_eq!(
        identifiers(text),
        [
            "fn", "a", "a", "x", "a", "str", "char", "let", "_", "let", "_", "if", "x", "else"
        ]
    );
}

/// The identifiers with "selector" that `operator/src` may use, by what they mean:
const SELECTOR_WORDS: &[&str] = &[
    // a GpuSharingPolicy's hardware selector: `spec.selector`, of type `DeviceSelector`
    "selector",
    "DeviceSelector",
    // the API's words for a DeviceClass's list (`spec.selectors`) and its CEL entry; teamgpu
    // calls the CEL "expressions" (`CompiledExpressions`, `cel::class_expressions`)
    "selectors",
    "CELDeviceSelector",
    // the condition type `SelectorValid` (of the hardware selector)
    "SELECTOR_VALID",
];

/// Label selectors (a team's `namespaceSelector`, a Pod's `nodeSelector`) are named as such.
const LABEL_SELECTOR_PREFIXES: &[&str] = &[
    "LabelSelector",
    "label_selector",
    "namespace_selector",
    "node_selector",
];

#[test]
fn selector_means_the_hardware_selector_or_a_label_selector_and_class_cel_is_expressions() {
    let mut strays: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in files() {
        for id in identifiers(&text) {
            let allowed = SELECTOR_WORDS.contains(&id)
                || LABEL_SELECTOR_PREFIXES.iter().any(|p| id.starts_with(p));
            if id.to_ascii_lowercase().contains("selector") && !allowed {
                let files = strays.entry(id.to_owned()).or_default();
                if !files.contains(&path) {
                    files.push(path.clone());
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "identifiers that give \"selector\" another meaning (a DeviceClass's CEL is \
         \"expressions\", a namespaceSelector a \"label selector\"; see docs/architecture.md): \
         {strays:?}"
    );
}

#[test]
fn no_two_error_types_share_a_name() {
    let mut declared: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in files() {
        let ids = identifiers(&text);
        for pair in ids.windows(2) {
            if matches!(pair[0], "enum" | "struct") && pair[1].ends_with("Error") {
                declared
                    .entry(pair[1].to_owned())
                    .or_default()
                    .push(path.clone());
            }
        }
    }
    let twice: BTreeMap<_, _> = (declared.into_iter())
        .filter(|(_, files)| files.len() > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "error types declared more than once: {twice:?}"
    );
}
