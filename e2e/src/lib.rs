//! End-to-end test support for teamgpu, against a real Kubernetes API server: a control plane
//! started from release binaries (`TEAMGPU_E2E_ASSETS`) with a node agent playing the kubelet's
//! API part, or a throwaway cluster (`TEAMGPU_E2E_KUBECONFIG`); a fault-injecting proxy in front
//! of it; request counting; and the sandbox that isolates the operator scenarios.

pub mod cluster;
pub mod control_plane;
pub mod fixtures;
pub mod node_agent;
pub mod operator;
pub mod proxy;
pub mod recording;
pub mod sandbox;

pub use cluster::{ClusterError, TestCluster};
pub use proxy::{FaultProxy, Faults};
