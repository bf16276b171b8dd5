//! Running as a kubectl plugin: the same binary installed as `kubectl-teamgpu` is
//! `kubectl teamgpu ...` (kubectl runs it with the arguments after `teamgpu`), and the shell
//! completion of either. Pure.

use std::ffi::OsStr;
use std::path::Path;

use clap_complete::Shell;

/// The file name kubectl looks for on the PATH to run `kubectl teamgpu`.
pub const PLUGIN_FILE: &str = "kubectl-teamgpu";

/// What the usage and help call the program: `kubectl teamgpu` when started as the plugin
/// (`argv[0]` ends in `kubectl-teamgpu`, with or without `.exe`), `teamgpu` otherwise.
pub fn program_name(argv0: Option<&OsStr>) -> &'static str {
    let file = argv0
        .map(Path::new)
        .and_then(Path::file_stem)
        .and_then(OsStr::to_str);
    if file == Some(PLUGIN_FILE) {
        "kubectl teamgpu"
    } else {
        "teamgpu"
    }
}

/// The completion script for `shell`: the one of `teamgpu ...`, and as the plugin (`program`
/// `kubectl teamgpu`) a hook that completes `kubectl teamgpu ...` as `teamgpu ...`, leaving
/// every other `kubectl` completion to kubectl's own script (source it after kubectl's). The
/// script's functions are named after `teamgpu` either way: clap names bash's functions
/// inconsistently for a name with a dash, and a name with a space is no function name at all.
pub fn completion_script(shell: Shell, command: &clap::Command, program: &str) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command.clone(), "teamgpu", &mut script);
    if program != "teamgpu" {
        script.extend_from_slice(match shell {
            Shell::Bash => BASH_KUBECTL_HOOK.as_bytes(),
            Shell::Zsh => ZSH_KUBECTL_HOOK.as_bytes(),
            Shell::Fish => FISH_KUBECTL_HOOK.as_bytes(),
            _ => NO_KUBECTL_HOOK.as_bytes(),
        });
    }
    script
}

/// kubectl's bash completion is one function for all of `kubectl`: wrap it, and hand the words
/// after `kubectl teamgpu` to `_teamgpu` as if `teamgpu` had been typed.
const BASH_KUBECTL_HOOK: &str = r#"
# `kubectl teamgpu <TAB>`: the words after `teamgpu` complete as teamgpu's; the rest of
# `kubectl` keeps kubectl's own completion (source this after `kubectl completion bash`).
if [[ "$(complete -p kubectl 2>/dev/null)" =~ -F\ ([^ ]+) ]] && [[ "${BASH_REMATCH[1]}" != __kubectl_teamgpu ]]; then
    __kubectl_teamgpu_previous="${BASH_REMATCH[1]}"
fi
__kubectl_teamgpu() {
    if [[ ${COMP_CWORD} -ge 2 && "${COMP_WORDS[1]}" == teamgpu ]]; then
        COMP_WORDS=(teamgpu "${COMP_WORDS[@]:2}")
        COMP_CWORD=$((COMP_CWORD - 1))
        _teamgpu teamgpu "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    elif [[ -n "${__kubectl_teamgpu_previous:-}" ]]; then
        "${__kubectl_teamgpu_previous}" "$@"
    fi
}
complete -o default -F __kubectl_teamgpu kubectl
"#;

/// zsh: the same wrapping of kubectl's completion function, with `words` and `CURRENT` shifted
/// as `_precommand` does.
const ZSH_KUBECTL_HOOK: &str = r#"
# `kubectl teamgpu <TAB>`: the words after `teamgpu` complete as teamgpu's; the rest of
# `kubectl` keeps kubectl's own completion (source this after `kubectl completion zsh`).
if [[ -n ${_comps[kubectl]:-} && ${_comps[kubectl]} != __kubectl_teamgpu ]]; then
    typeset -g __kubectl_teamgpu_previous=${_comps[kubectl]}
fi
__kubectl_teamgpu() {
    if (( CURRENT > 2 )) && [[ ${words[2]} == teamgpu ]]; then
        shift words
        words[1]=teamgpu
        (( CURRENT-- ))
        _teamgpu "$@"
    elif [[ -n ${__kubectl_teamgpu_previous:-} ]]; then
        ${__kubectl_teamgpu_previous} "$@"
    fi
}
compdef __kubectl_teamgpu kubectl
"#;

/// fish: completions of `kubectl` add up, so one more for `kubectl teamgpu ...` that asks fish
/// to complete the same line as `teamgpu ...`.
const FISH_KUBECTL_HOOK: &str = r#"
# `kubectl teamgpu <TAB>`: the words after `teamgpu` complete as teamgpu's.
function __kubectl_teamgpu_using
    set -l words (commandline -opc)
    test (count $words) -ge 2; and test "$words[2]" = teamgpu
end
function __kubectl_teamgpu_complete
    set -l words (commandline -opc)
    set -e words[1..2]
    complete -C (string join ' ' -- teamgpu (string escape -- $words) (commandline -ct))
end
# kubectl's own completion, if any, starts by erasing every other: load it first.
type -q kubectl; and complete -C 'kubectl ' >/dev/null 2>&1
complete -c kubectl -n __kubectl_teamgpu_using -f -a '(__kubectl_teamgpu_complete)'
"#;

const NO_KUBECTL_HOOK: &str = "
# This script completes `teamgpu`; it does not hook into `kubectl teamgpu` in this shell.
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_file_is_called_kubectl_teamgpu() {
        let name = |s: &str| program_name(Some(OsStr::new(s)));
        assert_eq!(
            name("/home/me/.local/bin/kubectl-teamgpu"),
            "kubectl teamgpu"
        );
        assert_eq!(name("kubectl-teamgpu.exe"), "kubectl teamgpu");
        assert_eq!(name("/usr/bin/teamgpu"), "teamgpu");
        assert_eq!(name("kubectl-teamgpu-old"), "teamgpu");
        assert_eq!(program_name(None), "teamgpu");
    }
}
