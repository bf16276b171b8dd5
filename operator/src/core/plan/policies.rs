//! Phase 1, the sharing policies: sorted by name, their class expressions compiled (once per
//! change of a policy's expressions), and whether a DeviceClass of their name is someone else's.

use std::collections::BTreeMap;
use std::hash::BuildHasher;

use k8s_openapi::api::resource::v1::DeviceClass;

use super::cache::Cache;
use super::cel;
use super::identity::name_of;
use super::objects::{device_class_name, is_managed};
use crate::api::GpuSharingPolicy;
use crate::dra_cel::{CompiledExpressions, ExpressionError};

/// Compiled class expressions by policy name, kept until the policy's expressions change.
pub type CompiledClasses = Cache<String, Vec<String>, Result<CompiledExpressions, ExpressionError>>;

/// A sharing policy with its class expressions, once validated.
#[derive(Debug)]
pub struct CompiledPolicy<'a> {
    pub policy: &'a GpuSharingPolicy,
    pub name: String,
    pub expressions: Vec<String>,
    /// `Ok` when every expression compiles (the compiled form is in [`CompiledClasses`]).
    pub compiled: Result<(), ExpressionError>,
    /// A live DeviceClass of this name that teamgpu does not manage.
    pub foreign_class: bool,
}

impl CompiledPolicy<'_> {
    /// Whether teamgpu makes and governs this policy's class.
    pub fn usable(&self) -> bool {
        self.compiled.is_ok() && !self.foreign_class
    }

    /// The memory of one device of a MemorySlices policy (its devices are slices).
    pub fn slice(&self) -> Option<&str> {
        self.policy.spec.sharing.slice_size()
    }
}

/// The policies sorted by name, with their class expressions compiled into `classes`.
pub fn compile<'a>(
    classes: &mut CompiledClasses,
    policies: &'a [GpuSharingPolicy],
    live_classes: &BTreeMap<String, &DeviceClass>,
) -> Vec<CompiledPolicy<'a>> {
    let mut sorted: Vec<&GpuSharingPolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| name_of(*p));
    let compiled = sorted
        .into_iter()
        .map(|policy| {
            let name = name_of(policy);
            let expressions = cel::class_expressions(&policy.spec);
            let compiled = classes
                .get(name.clone(), expressions.clone(), |e| {
                    CompiledExpressions::compile(e)
                })
                .as_ref()
                .map(drop)
                .map_err(Clone::clone);
            let foreign_class = live_classes
                .get(&device_class_name(&name))
                .is_some_and(|c| !is_managed(*c));
            CompiledPolicy {
                policy,
                name,
                expressions,
                compiled,
                foreign_class,
            }
        })
        .collect();
    classes.sweep();
    compiled
}

/// The MemorySlices policies: their slice sizes, and those whose teams get GPUs of their own.
#[derive(Debug, Default, Hash)]
pub struct Slicing {
    /// The slice size, in nano-units of memory, of every MemorySlices policy whose size parses
    /// (the CRD makes sure it does).
    pub sizes: BTreeMap<String, i128>,
    /// The policies of `placement: TeamGpus`.
    pub team_gpus: std::collections::BTreeSet<String>,
}

impl Slicing {
    pub fn of(policies: &[CompiledPolicy]) -> Self {
        let mut out = Slicing::default();
        for p in policies {
            if let Some(size) = p.slice().and_then(|s| crate::quantity::parse_nanos(s).ok()) {
                out.sizes.insert(p.name.clone(), size);
            }
            if p.policy.spec.sharing.team_gpus() {
                out.team_gpus.insert(p.name.clone());
            }
        }
        out
    }
}

/// The compiled class expressions of every policy whose expressions compile, by policy name.
pub fn expression_sets(classes: &CompiledClasses) -> BTreeMap<String, &CompiledExpressions> {
    classes
        .values()
        .filter_map(|(name, compiled)| Some((name.clone(), compiled.as_ref().ok()?)))
        .collect()
}

/// The identity of every compiled policy's class expressions: what matching devices depends on.
pub fn expressions_identity(policies: &[CompiledPolicy]) -> u64 {
    let matched_for: BTreeMap<&str, &[String]> = policies
        .iter()
        .filter(|p| p.compiled.is_ok())
        .map(|p| (p.name.as_str(), p.expressions.as_slice()))
        .collect();
    std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(&matched_for)
}
