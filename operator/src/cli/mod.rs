//! The command line's library: everything only `teamgpu` subcommands use (reading files and the
//! cluster, the built-in example, output, `what-if`, `top`, `why`, the manifests and CRDs it
//! prints, the kubectl plugin). `main.rs` parses the arguments and calls in here; the operator
//! (`teamgpu run`) needs none of it.

pub mod cluster;
pub mod crd;
pub mod example;
pub mod input;
pub mod manifests;
pub mod output;
pub mod plugin;
pub mod top;
pub mod validate;
pub mod whatif;
pub mod why;
