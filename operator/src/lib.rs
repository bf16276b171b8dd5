//! teamgpu: fair multi-team GPU sharing on Kubernetes Dynamic Resource Allocation.
//!
//! Every decision is a pure function in [`crate::core`] (plan, diff, effects), over the DRA
//! CEL evaluation of [`dra_cel`]; the Kubernetes I/O around them ([`controller`] for
//! `teamgpu run`, [`live`] for the command line's reads) is thin. `docs/architecture.md` draws
//! the pipeline.

pub mod api;
pub mod controller;
pub mod core;
pub mod crd;
pub mod dra_cel;
pub mod example;
pub mod input;
pub mod intern;
pub mod live;
pub mod manifests;
pub mod output;
pub mod plugin;
pub mod top;
pub mod validate;
pub mod whatif;
pub mod why;
