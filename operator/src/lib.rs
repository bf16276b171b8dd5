//! teamgpu: fair multi-team GPU sharing on Kubernetes Dynamic Resource Allocation.
//!
//! Every decision is a pure function in [`crate::core`] (plan, diff, effects), over the DRA
//! CEL evaluation of [`dra_cel`]; the Kubernetes I/O around them ([`controller`] for
//! `teamgpu run`, [`cli`] for the command line) is thin. `docs/architecture.md` draws
//! the pipeline.

pub mod api;
pub mod cli;
pub mod controller;
pub mod core;
pub mod dra_cel;
pub mod intern;
pub mod quantity;
