//! The teamgpu API: group `teamgpu.io`, version `v1alpha1`, both kinds cluster-scoped.

mod sharing;
mod team;

pub use sharing::*;
pub use team::*;

/// The API group of teamgpu's custom resources and the suffix of its DeviceClasses.
pub const GROUP: &str = "teamgpu.io";
