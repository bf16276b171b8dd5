//! End-to-end test support for teamgpu.
