//! The shell blocks of README.md and docs/, and a scratch directory to run them in as a user
//! would (`e2e/tests/docs_commands.rs`).
//!
//! A block's fence says what it needs:
//! - ` ```sh `: nothing but the `teamgpu` binary; run offline.
//! - ` ```sh cluster `: a cluster (kubectl against a real API server).
//! - ` ```sh cluster e2e `: a cluster, and it runs on the e2e control plane: the README's
//!   install, then the pages in name order (a platform engineer's first day: install, plan from
//!   a dump, look, uninstall).
//! - ` ```sh manual `: it changes the machine, needs the internet or a release, or takes minutes
//!   (installing, pushing an image, the test suite itself, benchmarks).
//! - ` ```console `: a transcript: commands with their output, not a script.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fixtures::{repo_root, teamgpu_binary};

/// What a fence may say after `sh`.
pub const NEEDS: [&str; 4] = ["", "cluster", "cluster e2e", "manual"];
const SHELLS: [&str; 4] = ["sh", "bash", "shell", "zsh"];

/// One fenced shell block: where it is, what its fence says it needs, and its text.
#[derive(Debug)]
pub struct Block {
    pub place: String,
    pub needs: String,
    pub script: String,
}

/// README.md, then the pages of docs/ in name order.
pub fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    std::iter::once(repo_root().join("README.md"))
        .chain(docs)
        .collect()
}

/// Every shell block of every page, in page order.
pub fn blocks() -> Vec<Block> {
    pages().iter().flat_map(|page| shell_blocks(page)).collect()
}

/// The shell blocks of one Markdown page. Fences may be indented (a block in a list item).
pub fn shell_blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(page).expect("page is readable");
    let root = repo_root();
    let name = page
        .strip_prefix(&root)
        .unwrap_or(page)
        .display()
        .to_string();
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let language = words.next().unwrap_or_default();
        let needs = words.collect::<Vec<_>>().join(" ");
        let body: Vec<&str> = lines
            .by_ref()
            .map(|(_, line)| line.trim_start())
            .take_while(|line| !line.starts_with("```"))
            .collect();
        if SHELLS.contains(&language) {
            blocks.push(Block {
                place: format!("{name}:{}", number + 1),
                needs: if language == "sh" {
                    needs
                } else {
                    format!("{language} {needs}")
                },
                script: body.join("\n"),
            });
        }
    }
    blocks
}

/// A scratch directory where the docs' commands find what a user has: `teamgpu` and
/// `kubectl-teamgpu` on the PATH, `cargo run -- ARGS` as the built binary, a copy of `config/` and `crds/`,
/// a home with the usual completion folders, and the kubeconfig given (none: no cluster).
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    kubeconfig: Option<PathBuf>,
}

/// The docs say `cargo run --release -- ARGS`; in the workspace that is the built binary.
const CARGO_SHIM: &str = "#!/bin/sh
while [ $# -gt 0 ]; do
  case \"$1\" in
    run|--release) shift ;;
    --) shift; exec teamgpu \"$@\" ;;
    *) echo \"docs test: only 'cargo run [--release] -- ARGS' runs here, not: cargo $*\" >&2; exit 2 ;;
  esac
done
exec teamgpu
";

impl Workspace {
    pub fn new(kubeconfig: Option<&Path>) -> Self {
        let root = std::env::temp_dir().join(format!(
            "teamgpu-docs-{}-{}",
            std::process::id(),
            if kubeconfig.is_some() {
                "cluster"
            } else {
                "offline"
            }
        ));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [
            "bin",
            "home/.local/bin",
            "home/.local/share/bash-completion/completions",
            "home/.config/fish/completions",
        ] {
            std::fs::create_dir_all(root.join(dir)).expect("scratch folders");
        }
        let binary = teamgpu_binary();
        for name in ["teamgpu", "kubectl-teamgpu"] {
            std::os::unix::fs::symlink(&binary, root.join("bin").join(name)).expect("symlink");
        }
        let shim = root.join("bin/cargo");
        std::fs::write(&shim, CARGO_SHIM).expect("cargo shim");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let copied = Command::new("cp")
            .args(["-r", "config", "crds"])
            .arg(&root)
            .current_dir(repo_root())
            .status()
            .expect("cp runs");
        assert!(copied.success(), "copying config/ and crds/ failed");
        Workspace {
            root,
            kubeconfig: kubeconfig.map(Path::to_path_buf),
        }
    }

    /// Runs the block with bash (`-e -o pipefail`); the error has the block, its place and
    /// its output.
    pub fn run(&self, block: &Block) -> Result<(), String> {
        let path = format!(
            "{}:{}",
            self.root.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = Command::new("bash");
        command
            .args(["-e", "-o", "pipefail", "-c", &block.script])
            .current_dir(&self.root)
            .env("PATH", path)
            .env("HOME", self.root.join("home"));
        match &self.kubeconfig {
            Some(kubeconfig) => command.env("KUBECONFIG", kubeconfig),
            None => command.env_remove("KUBECONFIG"),
        };
        let out = command.output().map_err(|error| format!("bash: {error}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{} exited {}:\n{}\n--- stdout:\n{}\n--- stderr:\n{}",
            block.place,
            out.status,
            block.script,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
