//! The pure core of teamgpu: what the cluster should look like and what to write to get there,
//! as functions over plain data. Nothing here holds a `kube::Client`; `crate::controller` and
//! `crate::cli::cluster` do the I/O around it.

pub mod diff;
pub mod effects;
pub mod engine;
pub mod fairshare;
pub mod plan;
pub mod state;
