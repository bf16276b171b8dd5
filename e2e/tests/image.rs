//! The image, tested without a container engine: the Dockerfile copies only what exists and
//! what `.dockerignore` lets into the build context (also every file the operator's source
//! includes from outside operator/), its stages exist, its final stage runs as uid 65532 on a
//! base that has the libc the binary needs, config/manager runs the released tag, and the
//! binary runs `plan` with no HOME and nothing to write.

use std::path::Path;
use std::process::Command;

use teamgpu_e2e::fixtures::{repo_root, teamgpu_binary};

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// A Dockerfile instruction: its keyword (upper case) and its arguments, continuations joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: Vec<String>,
}

fn instructions() -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                let mut words = current.split_whitespace().map(str::to_owned);
                let keyword = words.next().expect("a non-empty line").to_uppercase();
                out.push(Instruction {
                    keyword,
                    args: words.collect(),
                });
                current.clear();
            }
        }
    }
    out
}

/// The instructions of each stage: (base image, stage name, instructions).
fn stages() -> Vec<(String, Option<String>, Vec<Instruction>)> {
    let mut stages: Vec<(String, Option<String>, Vec<Instruction>)> = Vec::new();
    for i in instructions() {
        if i.keyword == "FROM" {
            let name = match i.args.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.clone()),
                [_] => None,
                other => panic!("FROM {other:?} is not `FROM image [AS name]`"),
            };
            stages.push((i.args[0].clone(), name, Vec::new()));
        } else {
            stages
                .last_mut()
                .expect("the Dockerfile starts with FROM")
                .2
                .push(i);
        }
    }
    stages
}

/// (flags, sources, destination) of a COPY.
fn copy_parts(i: &Instruction) -> (Vec<&str>, Vec<&str>, &str) {
    let flags: Vec<&str> = i
        .args
        .iter()
        .map(String::as_str)
        .take_while(|a| a.starts_with("--"))
        .collect();
    let rest: Vec<&str> = i.args[flags.len()..].iter().map(String::as_str).collect();
    let (destination, sources) = rest
        .split_last()
        .expect("COPY has a source and a destination");
    assert!(!sources.is_empty(), "COPY {:?} has no source", i.args);
    (flags, sources.to_vec(), destination)
}

/// Whether `.dockerignore` (an allowlist: `*` then `!path` lines) lets `path` into the context.
fn in_build_context(path: &str) -> bool {
    let mut included = true;
    for pattern in read(".dockerignore").lines().map(str::trim) {
        if pattern.is_empty() || pattern.starts_with('#') {
            continue;
        }
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pattern),
        };
        let pattern = pattern.trim_end_matches('/');
        // `*` matches every top-level entry, so everything below them too.
        let matches = pattern == "*" || path == pattern || path.starts_with(&format!("{pattern}/"));
        assert!(
            pattern == "*" || !pattern.contains(['*', '?', '[']),
            ".dockerignore: only `*` and plain paths are understood by this test, not {pattern}"
        );
        if matches {
            included = negated;
        }
    }
    included
}

/// Every COPY from the build context: (source, destination).
fn context_copies() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (_, _, instructions) in stages() {
        for i in instructions.iter().filter(|i| i.keyword == "COPY") {
            let (flags, sources, destination) = copy_parts(i);
            if flags.iter().any(|f| f.starts_with("--from=")) {
                continue;
            }
            for source in sources {
                out.push((
                    source.trim_end_matches('/').to_owned(),
                    destination.to_owned(),
                ));
            }
        }
    }
    out
}

#[test]
fn every_copied_path_exists_and_is_in_the_build_context() {
    let copies = context_copies();
    assert!(!copies.is_empty());
    for (source, _) in &copies {
        assert!(
            !source.contains(['*', '?']),
            "COPY {source}: use plain paths"
        );
        assert!(
            repo_root().join(source).exists(),
            "COPY {source}: no such path in the repository"
        );
        assert!(
            in_build_context(source),
            "COPY {source}: .dockerignore keeps it out of the build context"
        );
    }
    // Whatever the build reads must be copied: the manifests, the lock file, the sources.
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "operator/Cargo.toml",
        "operator/src",
        // A workspace member's manifest: cargo reads every member's, even for `-p teamgpu`.
        "operator/synthetic/Cargo.toml",
    ] {
        assert!(
            copies.iter().any(|(s, _)| s == needed),
            "the Dockerfile does not copy {needed}"
        );
    }
    // .dockerignore keeps build output and Git out of the context.
    for excluded in ["target", ".git", "e2e/tests", "docs"] {
        assert!(!in_build_context(excluded), "{excluded} is in the context");
    }
}

/// Every `include_str!`/`include_bytes!` of operator/src that reaches outside operator/, as a
/// path from the repository root: the build fails without them.
fn included_files_outside_the_crate() -> Vec<String> {
    let root = repo_root();
    let mut out = Vec::new();
    let mut dirs = vec![root.join("operator/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("operator/src is readable") {
            let path = entry.expect("readable").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file is UTF-8");
            for macro_ in ["include_str!(\"", "include_bytes!(\""] {
                for (at, _) in text.match_indices(macro_) {
                    let rest = &text[at + macro_.len()..];
                    let relative = &rest[..rest.find('"').expect("a closing quote")];
                    let file = path
                        .parent()
                        .expect("a file has a folder")
                        .join(relative)
                        .canonicalize()
                        .unwrap_or_else(|e| panic!("{relative} in {}: {e}", path.display()));
                    let from_root = file
                        .strip_prefix(root.canonicalize().expect("the root exists"))
                        .expect("included files are in the repository")
                        .to_string_lossy()
                        .into_owned();
                    if !from_root.starts_with("operator/") {
                        out.push(from_root);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn files_the_operator_includes_from_outside_its_crate_are_copied() {
    let included = included_files_outside_the_crate();
    assert!(
        included.iter().any(|f| f.starts_with("config/samples/")),
        "the built-in example includes config/samples: {included:?}"
    );
    let copies = context_copies();
    for file in &included {
        assert!(
            copies
                .iter()
                .any(|(s, _)| file == s || file.starts_with(&format!("{s}/"))),
            "operator/src includes {file}, which the Dockerfile does not copy"
        );
    }
}

#[test]
fn stages_copied_from_exist_and_the_final_stage_runs_as_65532() {
    let stages = stages();
    assert!(stages.len() >= 2, "a multi-stage build");
    for (index, (_, _, instructions)) in stages.iter().enumerate() {
        for i in instructions.iter().filter(|i| i.keyword == "COPY") {
            let (flags, _, _) = copy_parts(i);
            for from in flags.iter().filter_map(|f| f.strip_prefix("--from=")) {
                assert!(
                    stages[..index]
                        .iter()
                        .any(|(_, name, _)| name.as_deref() == Some(from)),
                    "COPY --from={from}: no earlier stage of that name"
                );
            }
        }
    }
    let (base, _, instructions) = stages.last().expect("a final stage");
    assert!(
        base.starts_with("gcr.io/distroless/") && base.ends_with(":nonroot"),
        "a minimal non-root base, not {base}"
    );
    let user = instructions
        .iter()
        .rfind(|i| i.keyword == "USER")
        .map(|i| i.args.join(" "))
        .expect("the final stage sets USER");
    assert!(
        user == "65532" || user == "65532:65532",
        "the final stage runs as {user}, not uid 65532 (the Deployment's runAsUser)"
    );
    // The builder compiles with `--locked`, so the image is built from Cargo.lock.
    let builds: Vec<String> = stages
        .iter()
        .flat_map(|(_, _, i)| i.iter())
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.join(" "))
        .filter(|r| r.contains("cargo build"))
        .collect();
    assert!(!builds.is_empty());
    for build in &builds {
        assert!(
            build.contains("--release")
                && build.contains("--locked")
                && build.contains("-p teamgpu"),
            "{build}"
        );
    }
}

/// The workspace version of the root Cargo.toml.
fn workspace_version() -> String {
    let manifest = read("Cargo.toml");
    let section = &manifest[manifest
        .find("[workspace.package]")
        .expect("a [workspace.package] section")..];
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with("version"))
        .expect("[workspace.package] has a version");
    line.split('"')
        .nth(1)
        .expect("version = \"x.y.z\"")
        .to_owned()
}

#[test]
fn config_manager_runs_the_image_of_this_version_the_way_the_image_starts() {
    let tag = format!("v{}", workspace_version());
    let deployment: serde_json::Value =
        serde_saphyr::from_str(&read("config/manager/manager.yaml")).expect("YAML");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/teamgpu/teamgpu:{tag}"),
        "manager.yaml"
    );
    let kustomization: serde_json::Value =
        serde_saphyr::from_str(&read("config/manager/kustomization.yaml")).expect("YAML");
    let image = kustomization["images"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == "ghcr.io/teamgpu/teamgpu"))
        .expect("config/manager sets the image");
    assert_eq!(
        image["newTag"],
        tag.as_str(),
        "config/manager/kustomization.yaml"
    );
    for app in ["config/argocd/teamgpu.yaml", "config/argocd/policies.yaml"] {
        let app: serde_json::Value = serde_saphyr::from_str(&read(app)).expect("YAML");
        assert_eq!(app["spec"]["source"]["targetRevision"], tag.as_str());
    }

    // The Deployment's command names the binary; the image puts it on distroless's PATH under
    // that name, and its ENTRYPOINT is the same file.
    let command = container["command"][0].as_str().expect("a command");
    let (_, _, instructions) = stages().pop().expect("a final stage");
    let installed = instructions
        .iter()
        .filter(|i| i.keyword == "COPY")
        .map(|i| copy_parts(i).2.to_owned())
        .find(|d| d.ends_with(&format!("/{command}")))
        .unwrap_or_else(|| panic!("the final stage installs no {command}"));
    let dir = &installed[..installed.rfind('/').expect("an absolute path")];
    // distroless's PATH.
    let path = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    assert!(path.contains(&dir), "{installed} is not on the PATH");
    let entrypoint = instructions
        .iter()
        .rfind(|i| i.keyword == "ENTRYPOINT")
        .map(|i| i.args.join(" "))
        .expect("an ENTRYPOINT");
    assert_eq!(entrypoint, format!("[\"{installed}\"]"));
}

fn dynamically_linked(binary: &Path) -> bool {
    let bytes = std::fs::read(binary).expect("the binary is readable");
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "a 64-bit ELF");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let u64_at =
        |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as usize;
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) == 3
    })
}

#[test]
fn the_final_base_has_the_libc_a_gnu_build_links_against() {
    let binary = teamgpu_binary();
    let (base, _, _) = stages().pop().expect("a final stage");
    let builder_targets_musl = instructions()
        .iter()
        .any(|i| i.args.iter().any(|a| a.contains("musl")));
    if dynamically_linked(&binary) && !builder_targets_musl {
        assert!(
            base.starts_with("gcr.io/distroless/cc-"),
            "a glibc-linked binary needs distroless/cc (glibc, libgcc_s), not {base}"
        );
    }
}

#[test]
fn plan_runs_without_home_or_environment_and_writes_nothing() {
    let binary = teamgpu_binary();
    let cwd = std::env::temp_dir().join(format!("teamgpu-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&cwd).expect("a temporary folder");
    let output = Command::new(&binary)
        .arg("plan")
        .env_clear()
        .current_dir(&cwd)
        .output()
        .expect("teamgpu runs");
    let left: Vec<_> = std::fs::read_dir(&cwd)
        .expect("readable")
        .map(|e| e.expect("readable").file_name())
        .collect();
    std::fs::remove_dir_all(&cwd).expect("cleanup");
    assert!(
        output.status.success(),
        "teamgpu plan failed without HOME: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).starts_with("TEAM "),
        "plan prints its table"
    );
    assert!(left.is_empty(), "teamgpu plan wrote {left:?}");
}
