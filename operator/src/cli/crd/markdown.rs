//! Markdown text for the API reference: code spans and prose that survive a table cell.

/// A JSON value as a code span (a string without its quotes).
pub(super) fn json_code(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => code(s),
        other => code(&other.to_string()),
    }
}

/// Items as code spans, comma-separated.
pub(super) fn code_list(items: &[String]) -> String {
    items.iter().map(|i| code(i)).collect::<Vec<_>>().join(", ")
}

/// An inline code span that survives a Markdown table: whitespace collapsed, `|` escaped (GFM
/// unescapes it inside code in a table cell), and a fence longer than any backtick run inside.
pub(super) fn code(text: &str) -> String {
    let text = collapse(text).replace('|', "\\|");
    let longest_run = text
        .split(|c| c != '`')
        .map(str::len)
        .max()
        .unwrap_or_default();
    let fence = "`".repeat(longest_run + 1);
    if text.starts_with('`') || text.ends_with('`') {
        format!("{fence} {text} {fence}")
    } else {
        format!("{fence}{text}{fence}")
    }
}

/// `text` on one line, runs of whitespace as one space.
fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Prose for a table cell: one line, `|` escaped, and `<` outside code spans escaped so that
/// `<policy>` is not taken for an HTML tag.
pub(super) fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in collapse(text).chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '|' => out.push_str("\\|"),
            '<' if !in_code => out.push_str("&lt;"),
            _ => out.push(c),
        }
    }
    out
}

/// Prose outside a table: the same, without the table's pipe escaping.
pub(super) fn paragraph(text: &str) -> String {
    inline(text).replace("\\|", "|")
}
