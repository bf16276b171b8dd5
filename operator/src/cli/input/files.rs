//! Which files `-f` names: files as given, folders by their `*.yaml`, `*.yml` and `*.json`
//! files, recursively, in name order. A folder or file reached twice (through a symlink, or
//! named twice) is read once; a symlink back to a folder being read is a loop, and is skipped
//! with a note instead of being followed forever.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{InputError, STDIN};

/// The files to read, with notes about what was skipped, and the folders that could not be
/// listed.
#[derive(Debug, Default)]
pub struct Files {
    pub paths: Vec<PathBuf>,
    pub notes: Vec<String>,
    pub errors: Vec<InputError>,
}

/// The files named by `paths`.
pub fn files(paths: &[PathBuf]) -> Files {
    let mut walk = Walk::default();
    for path in paths {
        walk.visit(path, true);
    }
    walk.out
}

#[derive(Default)]
struct Walk {
    out: Files,
    /// Every file and folder read so far, by its real path.
    seen: HashSet<PathBuf>,
    /// The real paths of the folders being read, outermost first.
    open: Vec<PathBuf>,
}

impl Walk {
    /// `named`: given with `-f` (read whatever its extension), not found in a folder.
    fn visit(&mut self, path: &Path, named: bool) {
        if path == Path::new(STDIN) {
            self.out.paths.push(path.to_owned());
            return;
        }
        // A path that cannot be resolved (missing, a broken link) is read as given, so that
        // reading it names the error.
        let Ok(real) = path.canonicalize() else {
            self.out.paths.push(path.to_owned());
            return;
        };
        if !real.is_dir() {
            if !named && !is_input(&real) {
                return;
            }
            if self.seen.insert(real) {
                self.out.paths.push(path.to_owned());
            } else {
                self.out.notes.push(format!(
                    "{}: read once, it was reached before",
                    path.display()
                ));
            }
            return;
        }
        if self.open.contains(&real) {
            self.out.notes.push(format!(
                "{}: skipped, a symlink loop back to {}",
                path.display(),
                real.display()
            ));
            return;
        }
        if !self.seen.insert(real.clone()) {
            self.out.notes.push(format!(
                "{}: folder read once, it was reached before (as {})",
                path.display(),
                real.display()
            ));
            return;
        }
        let entries = std::fs::read_dir(path).and_then(|d| {
            d.map(|e| e.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()
        });
        let mut entries = match entries {
            Ok(entries) => entries,
            Err(source) => {
                self.out.errors.push(InputError::Read {
                    path: path.to_owned(),
                    source,
                });
                return;
            }
        };
        entries.sort();
        self.open.push(real);
        for entry in entries {
            self.visit(&entry, false);
        }
        self.open.pop();
    }
}

fn is_input(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_files_and_symlink_loops() {
        let dir = std::env::temp_dir().join(format!("teamgpu-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for name in ["a.yaml", "b.json", "c.txt", "sub/d.yml"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        std::os::unix::fs::symlink(&dir, dir.join("sub/loop-1")).unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("sub/loop-2")).unwrap();
        std::os::unix::fs::symlink(dir.join("sub"), dir.join("z-again")).unwrap();
        let found = files(std::slice::from_ref(&dir));
        let names: Vec<String> = found
            .paths
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["a.yaml", "b.json", "sub/d.yml"]);
        let real = dir.canonicalize().unwrap();
        let loop_note = |n| {
            format!(
                "{}: skipped, a symlink loop back to {}",
                dir.join(format!("sub/loop-{n}")).display(),
                real.display()
            )
        };
        assert_eq!(found.notes.len(), 3, "{:?}", found.notes);
        assert_eq!(found.notes[0], loop_note(1));
        assert_eq!(found.notes[1], loop_note(2));
        assert!(
            found.notes[2].contains("z-again: folder read once"),
            "{:?}",
            found.notes
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
