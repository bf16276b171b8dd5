//! Phase 1, the sharing policies: sorted by name, their selectors compiled (once per change of
//! a policy's expressions), and whether a DeviceClass of their name is someone else's.

use std::collections::BTreeMap;
use std::hash::BuildHasher;

use k8s_openapi::api::resource::v1::DeviceClass;

use super::cache::Cache;
use super::identity::name_of;
use super::objects::{device_class_name, is_managed};
use super::selector;
use crate::api::GpuSharingPolicy;
use crate::dra_cel::{CompiledSelectors, SelectorError};

/// Compiled selectors by policy name, kept until the policy's expressions change.
pub type Selectors = Cache<String, Vec<String>, Result<CompiledSelectors, SelectorError>>;

/// A sharing policy with its selectors, once validated.
pub struct CompiledPolicy<'a> {
    pub policy: &'a GpuSharingPolicy,
    pub name: String,
    pub selectors: Vec<String>,
    /// `Ok` when every selector compiles (the compiled form is in [`Selectors`]).
    pub compiled: Result<(), SelectorError>,
    /// A live DeviceClass of this name that teamgpu does not manage.
    pub foreign_class: bool,
}

impl CompiledPolicy<'_> {
    /// Whether teamgpu makes and governs this policy's class.
    pub fn usable(&self) -> bool {
        self.compiled.is_ok() && !self.foreign_class
    }
}

/// The policies sorted by name, with their selectors compiled into `selectors`.
pub fn compile<'a>(
    selectors: &mut Selectors,
    policies: &'a [GpuSharingPolicy],
    live_classes: &BTreeMap<String, &DeviceClass>,
) -> Vec<CompiledPolicy<'a>> {
    let mut sorted: Vec<&GpuSharingPolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| name_of(*p));
    let compiled = sorted
        .into_iter()
        .map(|policy| {
            let name = name_of(policy);
            let expressions = selector::device_class_selectors(&policy.spec);
            let compiled = selectors
                .get(name.clone(), expressions.clone(), |e| {
                    CompiledSelectors::compile(e)
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
                selectors: expressions,
                compiled,
                foreign_class,
            }
        })
        .collect();
    selectors.sweep();
    compiled
}

/// The compiled selectors of every policy whose selectors compile, by policy name.
pub fn selector_sets(selectors: &Selectors) -> BTreeMap<String, &CompiledSelectors> {
    selectors
        .values()
        .filter_map(|(name, compiled)| Some((name.clone(), compiled.as_ref().ok()?)))
        .collect()
}

/// The identity of every compiled policy's selectors: what matching devices depends on.
pub fn selectors_identity(policies: &[CompiledPolicy]) -> u64 {
    let matched_for: BTreeMap<&str, &[String]> = policies
        .iter()
        .filter(|p| p.compiled.is_ok())
        .map(|p| (p.name.as_str(), p.selectors.as_slice()))
        .collect();
    std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(&matched_for)
}
