//! teamgpu: fair multi-team GPU sharing on Kubernetes Dynamic Resource Allocation.
//!
//! The desired state is computed by pure functions ([`plan`], [`fairshare`], [`sync`]); the
//! Kubernetes I/O around them ([`controller`] for `teamgpu run`, [`live`] for the command line's
//! reads) is thin.

pub mod api;
pub mod controller;
pub mod crd;
pub mod example;
pub mod fairshare;
pub mod input;
pub mod live;
pub mod manifests;
pub mod output;
pub mod plan;
pub mod plugin;
pub mod sync;
pub mod top;
pub mod whatif;
