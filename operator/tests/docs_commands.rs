//! Every shell block of README.md and docs/ that needs no cluster runs, and exits 0.
//!
//! A block's fence says what it needs:
//! - ` ```sh `: nothing but the `teamgpu` binary; this test runs it.
//! - ` ```sh cluster `: a cluster (kubectl against a real API server).
//! - ` ```sh manual `: it changes the machine, needs the internet or a release, or takes minutes
//!   (installing, pushing an image, the test suite itself, benchmarks).
//! - ` ```console `: a transcript: commands with their output, not a script.
//!
//! A shell block with no such word fails the test, so a new command cannot go unjudged.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One fenced shell block: where it is, what its fence says it needs, and its text.
struct Block {
    place: String,
    needs: String,
    script: String,
}

const SHELLS: [&str; 4] = ["sh", "bash", "shell", "zsh"];
const NEEDS: [&str; 2] = ["cluster", "manual"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The shell blocks of one Markdown page (fences of ``` at the start of a line).
fn shell_blocks(page: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(page).expect("page is readable");
    let name = page
        .strip_prefix(repo())
        .unwrap_or(page)
        .display()
        .to_string();
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        // Fences may be indented (a block inside a list item).
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut words = info.split_whitespace();
        let language = words.next().unwrap_or_default();
        let needs = words.collect::<Vec<_>>().join(" ");
        let body: Vec<&str> = lines
            .by_ref()
            .map(|(_, line)| line)
            .take_while(|line| !line.trim_start().starts_with("```"))
            .collect();
        if SHELLS.contains(&language) {
            blocks.push(Block {
                place: format!("{name}:{}", number + 1),
                needs: if language == "sh" {
                    needs
                } else {
                    format!("{language} {needs}")
                },
                script: body
                    .iter()
                    .map(|line| line.trim_start())
                    .collect::<Vec<_>>()
                    .join("\n"),
            });
        }
    }
    blocks
}

/// A scratch directory where the docs' commands find what a user has: `teamgpu` and
/// `kubectl-teamgpu` on the PATH, `cargo run -- ARGS` as the built binary, a copy of `config/`,
/// and a home with the usual completion folders.
struct Workspace {
    root: PathBuf,
}

impl Workspace {
    fn new() -> Self {
        let root = std::env::temp_dir().join(format!("teamgpu-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [
            "bin",
            "home/.local/bin",
            "home/.local/share/bash-completion/completions",
            "home/.config/fish/completions",
        ] {
            std::fs::create_dir_all(root.join(dir)).expect("scratch folders");
        }
        let binary = Path::new(env!("CARGO_BIN_EXE_teamgpu"));
        for name in ["teamgpu", "kubectl-teamgpu"] {
            std::os::unix::fs::symlink(binary, root.join("bin").join(name)).expect("symlink");
        }
        // The docs say `cargo run --release -- ARGS`; here that is the binary this test built.
        let cargo = "#!/bin/sh\n\
            while [ $# -gt 0 ]; do\n\
              case \"$1\" in\n\
                run|--release) shift ;;\n\
                --) shift; exec teamgpu \"$@\" ;;\n\
                *) echo \"docs test: only 'cargo run [--release] -- ARGS' runs here, not: cargo $*\" >&2; exit 2 ;;\n\
              esac\n\
            done\n\
            exec teamgpu\n";
        let shim = root.join("bin/cargo");
        std::fs::write(&shim, cargo).expect("cargo shim");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let status = Command::new("cp")
            .args(["-r", "config"])
            .arg(&root)
            .current_dir(repo())
            .status()
            .expect("cp runs");
        assert!(status.success(), "copying config/ failed");
        Workspace { root }
    }

    fn run(&self, block: &Block) -> Result<(), String> {
        let path = format!(
            "{}:{}",
            self.root.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c", &block.script])
            .current_dir(&self.root)
            .env("PATH", path)
            .env("HOME", self.root.join("home"))
            .env_remove("KUBECONFIG")
            .output()
            .map_err(|error| format!("bash: {error}"))?;
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

#[test]
fn every_shell_block_says_what_it_needs() {
    let unmarked: Vec<String> = pages()
        .iter()
        .flat_map(|page| shell_blocks(page))
        .filter(|block| !(block.needs.is_empty() || NEEDS.contains(&block.needs.as_str())))
        .map(|block| format!("{} (```{})", block.place, block.needs))
        .collect();
    assert!(
        unmarked.is_empty(),
        "shell blocks must be ```sh (runs offline), ```sh cluster or ```sh manual: {unmarked:#?}"
    );
}

#[test]
fn every_shell_block_that_needs_no_cluster_exits_zero() {
    let blocks: Vec<Block> = pages()
        .iter()
        .flat_map(|page| shell_blocks(page))
        .filter(|block| block.needs.is_empty())
        .collect();
    assert!(
        blocks.len() >= 5,
        "expected the README's and the CLI page's offline commands, found {} blocks",
        blocks.len()
    );
    let workspace = Workspace::new();
    let failures: Vec<String> = blocks
        .iter()
        .filter_map(|block| workspace.run(block).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
