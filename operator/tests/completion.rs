//! `teamgpu completion` and `kubectl teamgpu completion`, sourced in the real shells and asked to
//! complete a line, as a user's <TAB> would. A shell that is not installed is skipped with a
//! note (bash fails instead under CI=true).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary installed as the kubectl plugin (a symlink named `kubectl-teamgpu`), in a fresh
/// folder of its own.
fn plugin() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("teamgpu-completion-{}", std::process::id()));
    let link = dir.join("kubectl-teamgpu");
    if !link.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_teamgpu"), &link).unwrap();
    }
    link
}

/// The script that `program completion shell` prints, saved to a file.
fn script(program: &Path, shell: &str) -> PathBuf {
    let out = Command::new(program)
        .args(["completion", shell])
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{} completion {shell} failed ({}): {}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let name = program.file_name().unwrap().to_string_lossy();
    let path = std::env::temp_dir().join(format!(
        "teamgpu-completion-{}-{name}.{shell}",
        std::process::id()
    ));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// Whether `shell` is installed; if not, a note, and under CI=true a failure for bash.
fn have(shell: &str) -> bool {
    let found = Command::new(shell)
        .args(["-c", "exit 0"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            !(shell == "bash" && std::env::var("CI").as_deref() == Ok("true")),
            "bash is not installed, and CI=true needs the bash completion tested"
        );
        eprintln!("note: {shell} is not installed; its completion is not tested");
    }
    found
}

/// `shell -c code`'s standard output, one completion a line.
fn run(shell: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new(shell)
        .args(args)
        .output()
        .expect("the shell runs");
    assert!(
        out.status.success(),
        "{shell} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// What bash completes for `words`, the last being the word under the cursor, after sourcing
/// `script` (and first a stand-in for kubectl's own completion).
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let code = format!(
        r#"_stand_in_kubectl() {{ COMPREPLY=(kubectl-own-completion); }}
complete -o default -F _stand_in_kubectl kubectl
source {script}
COMP_WORDS=({words})
COMP_CWORD={cword}
func=$(complete -p {command} | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
"$func" {command} "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#,
        script = script.display(),
        words = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        cword = words.len() - 1,
        command = words[0],
    );
    run("bash", &["-c", &code])
}

fn contains_all(found: &[String], wanted: &[&str], what: &str) {
    for w in wanted {
        assert!(found.iter().any(|f| f == w), "{what}: no {w} in {found:?}");
    }
}

#[test]
fn bash_completes_kubectl_teamgpu_as_the_plugin_and_leaves_kubectl_alone() {
    if !have("bash") {
        return;
    }
    let script = script(&plugin(), "bash");
    let subcommands = bash_complete(&script, &["kubectl", "teamgpu", ""]);
    contains_all(
        &subcommands,
        &["plan", "top", "why", "completion"],
        "kubectl teamgpu <TAB>",
    );
    assert!(!subcommands.contains(&"kubectl-own-completion".to_owned()));
    assert_eq!(
        bash_complete(&script, &["kubectl", "teamgpu", "plan", "--li"]),
        ["--live"]
    );
    assert_eq!(
        bash_complete(&script, &["kubectl", "teamgpu", "plan", "-o", ""]),
        ["table", "yaml", "json"]
    );
    // Anything but `kubectl teamgpu` is still kubectl's.
    assert_eq!(
        bash_complete(&script, &["kubectl", "get", ""]),
        ["kubectl-own-completion"]
    );
    // Sourced twice (a second shell start in the same session): still kubectl's, no loop.
    let twice_path = script.with_extension("twice.bash");
    std::fs::write(
        &twice_path,
        format!("source {0}\nsource {0}\n", script.display()),
    )
    .unwrap();
    assert_eq!(
        bash_complete(&twice_path, &["kubectl", "get", ""]),
        ["kubectl-own-completion"]
    );
}

#[test]
fn bash_completes_teamgpu_without_touching_kubectl() {
    if !have("bash") {
        return;
    }
    let script = script(Path::new(env!("CARGO_BIN_EXE_teamgpu")), "bash");
    contains_all(
        &bash_complete(&script, &["teamgpu", ""]),
        &["plan", "top", "why"],
        "teamgpu <TAB>",
    );
    assert_eq!(
        bash_complete(&script, &["kubectl", "teamgpu", ""]),
        ["kubectl-own-completion"]
    );
}

/// Drives an interactive zsh on a pseudo-terminal (zsh/zpty), types `$2` and <TAB>, and prints
/// every match the completion system adds, one a line. The markers are split in the code so that
/// the terminal's echo of it never looks like output.
const ZSH_CAPTURE: &str = r#"
zmodload zsh/zpty || exit 2
zpty z zsh -f -i
zpty -w z "PROMPT=''"
zpty -w z 'autoload -U compinit && compinit -u -D'
zpty -w z "$3"
zpty -w z "source ${(q)1}"
zpty -w z 'bindkey "^I" complete-word'
zpty -w z 'zstyle ":completion:*" list-grouped false; zstyle ":completion:*" insert-tab false'
zpty -w z 'compadd () { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi; local -a __hits; builtin compadd -A __hits "$@"; local h; for h in $__hits; do print -r -- "<"match">$h"; done; builtin compadd "$@"; }'
zpty -w z 'comppostfuncs=( __done ); __done () { print -r -- "<"done">"; exit }'
zpty -w -n z "$2"$'\t'
local line
while zpty -r z line; do
  [[ $line == *'<done>'* ]] && break
  [[ $line == *'<match>'* ]] && print -r -- ${${line##*<match>}%$'\r'}
done
zpty -d z
"#;

fn zsh_complete(script: &Path, line: &str) -> Vec<String> {
    let capture = script.with_extension("capture.zsh");
    std::fs::write(&capture, ZSH_CAPTURE).unwrap();
    // A stand-in for kubectl's own completion, registered before the script is sourced.
    let stand_in =
        "_stand_in_kubectl() { compadd kubectl-own-completion }; compdef _stand_in_kubectl kubectl";
    let capture = capture.display().to_string();
    let script = script.display().to_string();
    run("zsh", &["-f", &capture, &script, line, stand_in])
}

#[test]
fn zsh_completes_kubectl_teamgpu_as_the_plugin_and_leaves_kubectl_alone() {
    if !have("zsh") {
        return;
    }
    let script = script(&plugin(), "zsh");
    let subcommands = zsh_complete(&script, "kubectl teamgpu ");
    contains_all(
        &subcommands,
        &["plan", "top", "why"],
        "kubectl teamgpu <TAB>",
    );
    assert_eq!(
        zsh_complete(&script, "kubectl teamgpu plan --li"),
        ["--live"]
    );
    assert_eq!(
        zsh_complete(&script, "kubectl get "),
        ["kubectl-own-completion"]
    );
    let plain = script_for_teamgpu("zsh");
    contains_all(
        &zsh_complete(&plain, "teamgpu "),
        &["plan", "top", "why"],
        "teamgpu <TAB>",
    );
    assert_eq!(
        zsh_complete(&plain, "kubectl get "),
        ["kubectl-own-completion"]
    );
}

fn script_for_teamgpu(shell: &str) -> PathBuf {
    script(Path::new(env!("CARGO_BIN_EXE_teamgpu")), shell)
}

fn fish_complete(script: &Path, line: &str) -> Vec<String> {
    let code = format!("source {}; complete -C '{line}'", script.display());
    run("fish", &["--no-config", "-c", &code])
        .into_iter()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn fish_completes_kubectl_teamgpu_as_the_plugin() {
    if !have("fish") {
        return;
    }
    let script = script(&plugin(), "fish");
    contains_all(
        &fish_complete(&script, "kubectl teamgpu "),
        &["plan", "top", "why"],
        "kubectl teamgpu <TAB>",
    );
    assert_eq!(
        fish_complete(&script, "kubectl teamgpu plan --li"),
        ["--live"]
    );
    contains_all(
        &fish_complete(&script_for_teamgpu("fish"), "teamgpu "),
        &["plan", "top", "why"],
        "teamgpu <TAB>",
    );
}
