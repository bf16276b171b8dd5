//! The README's table of `teamgpu run` flags is the binary's: every flag with its environment
//! variable, and no flag the binary lacks.

use std::collections::BTreeMap;
use std::process::Command;

/// `--flag` → its environment variable (empty if none), from `teamgpu run --help`.
fn flags_of_the_binary() -> BTreeMap<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_teamgpu"))
        .args(["run", "--help"])
        .output()
        .expect("teamgpu runs");
    assert!(out.status.success(), "teamgpu run --help failed");
    let help = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let option_line = line.starts_with("  ") && trimmed.starts_with('-');
        if let Some(flag) = trimmed
            .split([' ', ','])
            .find(|word| word.starts_with("--") && *word != "--help")
            .filter(|_| option_line)
        {
            flags.insert(flag.to_owned(), String::new());
            current = Some(flag.to_owned());
        }
        if let (Some(flag), Some(at)) = (&current, line.find("[env: ")) {
            let env = &line[at + 6..];
            let env = env.split('=').next().unwrap_or_default();
            flags.insert(flag.clone(), env.to_owned());
        }
    }
    flags
}

/// `--flag` → its environment variable, from the README's table (`| `--flag` | `ENV` | ...`).
fn flags_of_the_readme() -> BTreeMap<String, String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md is readable");
    readme
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.trim_matches('`');
            if !flag.starts_with("--") || !flag[2..].starts_with(|c: char| c.is_ascii_lowercase()) {
                return None;
            }
            let env = cells.get(2)?.trim_matches('`');
            let env = if env == "—" || env == "-" { "" } else { env };
            Some((flag.to_owned(), env.to_owned()))
        })
        .collect()
}

#[test]
fn the_readme_lists_every_flag_of_teamgpu_run_with_its_environment_variable() {
    let binary = flags_of_the_binary();
    assert!(
        binary.len() >= 10,
        "found only {binary:?} in `teamgpu run --help`"
    );
    assert_eq!(
        flags_of_the_readme(),
        binary,
        "README.md's flag table (left) differs from `teamgpu run --help` (right)"
    );
}
