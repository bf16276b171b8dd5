//! What docs/architecture.md promises about the source: no file in `operator/src` over 700 lines,
//! no function over 120. Files are rustfmt-formatted, so a function ends at the first line that
//! closes its indentation.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 120;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("operator/src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// `(line of the fn, its length)` for every function of one file.
fn functions(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let signature = body
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        if !signature.starts_with("fn ") || body.ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[start..].iter().position(|l| *l == close) {
            found.push((start + 1, end + 1));
        }
    }
    found
}

#[test]
fn no_source_file_or_function_is_longer_than_the_architecture_page_says() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut too_long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("source is readable");
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            too_long.push(format!("{}: {lines} lines", file.display()));
        }
        for (line, length) in functions(&text) {
            if length > MAX_FN_LINES {
                too_long.push(format!(
                    "{}:{line}: a function of {length} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "files over {MAX_FILE_LINES} lines or functions over {MAX_FN_LINES} (docs/architecture.md): {too_long:#?}"
    );
}

#[test]
fn the_function_measure_finds_a_long_function() {
    let long = format!("fn long() {{\n{}}}\n", "    let _ = 1;\n".repeat(130));
    assert_eq!(functions(&long), [(1, 132)]);
    assert_eq!(functions("    pub fn short() {\n    }\n"), [(1, 2)]);
}
