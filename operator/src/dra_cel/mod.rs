//! The CEL expressions of DRA (a DeviceClass's or a request's `selectors`), evaluated with
//! kube-cel as Kubernetes evaluates them.
//!
//! The API is small:
//!
//! * [`CompiledExpressions::compile`] compiles the expressions of a DeviceClass (or a request)
//!   that must all be true; [`CompiledExpressions::matches`] evaluates them on a device
//!   and [`CompiledExpressions::reads`] says which parts of a device they read ([`DeviceReads`]);
//!   [`check_expression`] checks one expression alone, e.g. for a status.
//! * [`DeviceEnvs::project`] builds a device's CEL input ([`DeviceEnv`]) keeping only what the
//!   expressions read, and shares equal inputs: the 40,000 devices of a cluster hold a few
//!   dozen.
//! * [`parse_qualified_name`] splits an attribute name as the DRA API does.
//!
//! Every failure (an invalid expression, a failed evaluation, a device that cannot be a CEL
//! value) is an [`ExpressionError`].
//!
//! ```
//! use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
//! use teamgpu::dra_cel::{CompiledExpressions, DeviceEnvs};
//!
//! let expressions = CompiledExpressions::compile(&[
//!     "device.driver == 'gpu.nvidia.com'".to_owned(),
//!     "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-PCIE-40GB'".to_owned(),
//! ])?;
//! let device = Device {
//!     name: "gpu-0".to_owned(),
//!     attributes: Some([(
//!         "productName".to_owned(),
//!         DeviceAttribute { string: Some("NVIDIA A100-PCIE-40GB".to_owned()), ..Default::default() },
//!     )].into()),
//!     ..Default::default()
//! };
//! let mut envs = DeviceEnvs::default();
//! // Only `productName` (and the driver) of the device is kept: that is all the expressions read.
//! let env = envs.project("gpu.nvidia.com", &device, &expressions.reads());
//! assert_eq!(expressions.matches(&env), Ok(true));
//! # Ok::<(), teamgpu::dra_cel::ExpressionError>(())
//! ```
//!
//! The `device` variable mirrors the DRA CEL environment of Kubernetes
//! (`staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go`, `DeviceMatches`):
//!
//! * `device.driver`: the driver name of the device's ResourceSlice;
//! * `device.attributes[domain][id]`: every attribute, grouped by domain. A name without a `/`
//!   belongs to the driver's domain, a qualified name `domain/id` is split at its first `/`
//!   (`parseQualifiedName`). Values are typed: string, int, bool, or a semver for `version`
//!   (parsed strictly, like `semver.Parse` of blang/semver; an unparsable version makes every
//!   evaluation on that device fail, as upstream builds the whole map before evaluating);
//! * `device.capacity[domain][id]`: every capacity as a `quantity`;
//! * `device.allowMultipleAllocations`: the device's field, `false` when unset (Kubernetes
//!   1.34+ with DRAConsumableCapacity, documented on `CELDeviceSelector.expression`).
//!
//! Upstream looks up an unknown domain (`device.attributes['other.example.com']`) as an empty map
//! (`newStringInterfaceMapWithDefault`), so only an unknown *attribute* errors. cel-rust has no
//! defaulting map, so every domain an expression names with a literal is inserted as an empty map
//! when the device has none. A domain computed at runtime cannot be defaulted; that lookup
//! errors here where Kubernetes would see an empty map.
//!
//! `cel.bind(var, init, body)` (enabled upstream through `ext.Bindings`) is provided as a lazy
//! function that evaluates `body` with `var` bound, since cel-rust 0.13 has no such macro.
//! Optional syntax (`m.?x`, `m[?k]`), on in the Kubernetes base environment, is enabled.
//!
//! Differences that remain (cel-rust is not cel-go): there is no type checker, so compile-time
//! checking ([`check_expression`]) rejects syntax errors, undeclared variables, expressions over
//! 10 Ki and results that are evidently not bool, and everything else surfaces at evaluation
//! (an unknown function, a type mismatch); there is no cost limit; cel-go only functions
//! (e.g. the `includes()` of the alpha DRAListTypeAttributes) are missing.
//!
//! Performance: cel-rust deep-copies maps when they are bound or selected, so evaluating an
//! expression against a whole device costs tens of µs. Most expressions only read a few fixed
//! attributes (`device.attributes['gpu.nvidia.com'].productName`). [`CompiledExpressions`]
//! therefore analyses the AST: when every use of `device` is such a fixed path, the result
//! is a pure function of those few values, so it evaluates (with kube-cel) against a device
//! holding only them, and memoises the result by those values. Devices of one model share one
//! evaluation. Fixed paths are `device.driver`, `device.allowMultipleAllocations`,
//! `device.attributes[<lit>].<id>` / `[<lit>]` / `[?<lit>]` / `.?<id>`, `has(...)` of those, and
//! `<lit> in device.attributes[<lit>]` (same for `capacity`). Expressions that use `device` in any
//! other way (iterating or sizing a domain, `cel.bind` over a domain map, a computed key, ...) are
//! evaluated against the full device every time.
//!
//! The files: `expressions.rs` compiles and evaluates lists of expressions (with the memo),
//! `compile.rs` checks one expression, `reads.rs` analyses what an expression reads,
//! `device.rs` builds and shares the CEL input of devices, and `context.rs` holds the
//! kube-cel context, `cel.bind` and the parsing of versions and quantities.

mod compile;
mod context;
mod device;
mod expressions;
mod reads;
#[cfg(test)]
pub(crate) mod tests;

pub use compile::check_expression;
pub use device::{DeviceEnv, DeviceEnvs};
pub use expressions::CompiledExpressions;
pub use reads::DeviceReads;

/// Why an expression could not be used. `selector #i` in the messages is the DeviceClass's
/// `spec.selectors[i]`, as a person finds it there.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExpressionError {
    /// The expression does not compile (or can never yield a bool).
    #[error("selector #{index} `{expression}` is invalid: {message}")]
    Invalid {
        index: usize,
        expression: String,
        message: String,
    },
    /// The expression compiled but failed on a device. Kubernetes aborts the allocation of a
    /// claim when this happens.
    #[error("selector #{index} `{expression}` failed: {message}")]
    Evaluation {
        index: usize,
        expression: String,
        message: String,
    },
    /// The device itself cannot be turned into a CEL value (e.g. an unparsable version).
    #[error("device attribute or capacity {name}: {message}")]
    Device { name: String, message: String },
}

/// Splits a qualified name at its first `/`; a name without one is in `default_domain`
/// (upstream `parseQualifiedName`).
pub fn parse_qualified_name<'a>(name: &'a str, default_domain: &'a str) -> (&'a str, &'a str) {
    match name.find('/') {
        Some(i) => (&name[..i], &name[i + 1..]),
        None => (default_domain, name),
    }
}
