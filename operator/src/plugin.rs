//! Running as a kubectl plugin: the same binary installed as `kubectl-teamgpu` is
//! `kubectl teamgpu ...` (kubectl runs it with the arguments after `teamgpu`). Pure.

use std::ffi::OsStr;
use std::path::Path;

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
