//! teamgpu: fair multi-team GPU sharing on Kubernetes Dynamic Resource Allocation.
//!
//! The desired state is computed by pure functions ([`plan`], [`fairshare`]); the Kubernetes I/O
//! around them is thin.

pub mod api;
pub mod crd;
