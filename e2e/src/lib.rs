//! End-to-end test support for teamgpu: an in-process stand-in for the Kubernetes API server
//! (see `README.md` for exactly what it implements) and validators of generated objects.

pub mod admission;
pub mod cluster;
pub mod controllers;
pub mod core;
pub mod faults;
pub mod fixtures;
pub mod openapi;
pub mod patch;
pub mod recording;
pub mod resources;
pub mod sandbox;
pub mod selectors;
pub mod server;
pub mod ssa;
pub mod status;
pub mod store;

pub use cluster::{ClusterError, ClusterOptions, TestCluster};
pub use faults::Faults;
