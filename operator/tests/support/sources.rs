//! The source files of `operator/src`, for the tests that hold it to what docs/architecture.md
//! promises.

use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("operator/src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file of `operator/src`, sorted, as (path below `src` with `/`, text).
pub fn files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    collect(&root, &mut paths);
    paths.sort();
    (paths.into_iter())
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("source is readable");
            let relative = p.strip_prefix(&root).expect("below src");
            (relative.to_string_lossy().replace('\\', "/"), text)
        })
        .collect()
}
