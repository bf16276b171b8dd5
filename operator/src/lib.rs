//! teamgpu: fair multi-team GPU sharing on Kubernetes Dynamic Resource Allocation.
//!
//! The desired state is computed by pure functions ([`plan`], [`fairshare`], [`sync`]); the
//! Kubernetes I/O around them ([`controller`]) is thin.

pub mod api;
pub mod controller;
pub mod crd;
pub mod example;
pub mod fairshare;
pub mod input;
pub mod output;
pub mod plan;
pub mod sync;
