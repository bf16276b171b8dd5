//! Namespaces outside every team, guarded by a ResourceQuota of 0 instead of an admission policy
//! evaluated on every write. Pure.
//!
//! Why: the non-team admission policy (`teamgpu-non-team-requests`) costs the API server 1.5-1.7x
//! the CPU of a claim or Pod written outside teams, and most of that is that a policy is evaluated
//! at all (docs/tenancy.md, measured on 1.36.2). A quota of 0 for every governed resource refuses
//! the same requests (claims by `exactly`, `firstAvailable` or `allocationMode: All`, Pods by
//! extended resource) for about 1.15x.
//!
//! How, in each namespace outside every team and not exempt, when the bindings deny:
//! 1. teamgpu applies the quota [`QUOTA_NAME`], a hard of 0 for every governed resource;
//! 2. once the quota controller has put those hards in the quota's status (admission ignores a
//!    quota whose `status.hard` is empty), teamgpu labels the namespace [`GUARD_LABEL`] with
//!    [`OutsideTeams::label`];
//! 3. the non-team binding leaves out the namespaces whose label has that value.
//!
//! A namespace without the quota in force (new, or created while teamgpu is down) has no label,
//! and the non-team policy still refuses there. The label's value is a hash of the hards: a
//! quota that lacks a new class is no longer left out. A label whose quota is not in force is
//! taken off before any object is written (a label left from an earlier install, whose quotas
//! went with its CRDs). Only the operator may set the label (the exemption policy,
//! [`super::namespace_admission`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::cache::{Cache, fingerprint, owners_key};
use super::objects::{IMPLICIT_EXTENDED_PREFIX, NamespacedQuota, content_hash, managed_labels};

/// The quota of 0 in each namespace outside every team.
pub const QUOTA_NAME: &str = "teamgpu-outside-teams";
/// The label on a namespace whose quota of 0 is in force.
pub const GUARD_LABEL: &str = "teamgpu.io/outside-teams-quota";
/// The annotation on the quota that tells a person who reads it why it is there.
const PURPOSE_ANNOTATION: &str = "teamgpu.io/purpose";
const PURPOSE: &str = "this namespace belongs to no TeamGpuPolicy, so it may not use GPUs that \
     teamgpu governs: label it for a team, or ask a cluster admin to exempt it with \
     teamgpu.io/exempt=true";
/// Owner label of the quotas: no single policy owns them.
const MANAGED_OWNER: &str = "teamgpu";

/// The guarded namespaces and the value of their label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutsideTeams {
    /// The namespaces that get the quota, sorted.
    pub namespaces: Vec<String>,
    /// The value of [`GUARD_LABEL`] on a namespace whose quota is in force, and the value the
    /// non-team binding leaves out: the hash of the quota's hards, as [`in_force`] hashes the
    /// quota's status.
    pub label: String,
}

impl OutsideTeams {
    /// The guard of `namespaces`, each limited to 0 of every resource of `zero_hard` (quota
    /// resource names). `None` without a resource to guard.
    pub fn new(namespaces: Vec<String>, zero_hard: &[Arc<str>]) -> Option<Self> {
        if zero_hard.is_empty() {
            return None;
        }
        let hard: BTreeMap<&str, &str> = zero_hard.iter().map(|r| (&**r, "0")).collect();
        Some(OutsideTeams {
            namespaces,
            label: content_hash(&hard),
        })
    }

    /// The quota of 0 in every guarded namespace.
    pub fn quotas(
        &self,
        zero_hard: &[Arc<str>],
        owners: Option<&Vec<OwnerReference>>,
    ) -> Vec<Arc<NamespacedQuota>> {
        let meta = Arc::new(ObjectMeta {
            name: Some(QUOTA_NAME.to_owned()),
            labels: Some(managed_labels(MANAGED_OWNER)),
            annotations: Some(BTreeMap::from([(
                PURPOSE_ANNOTATION.to_owned(),
                PURPOSE.to_owned(),
            )])),
            owner_references: owners.cloned(),
            ..ObjectMeta::default()
        });
        let hard = || zero_hard.iter().map(|r| (Arc::clone(r), 0));
        (self.namespaces.iter())
            .map(|namespace| Arc::new(NamespacedQuota::new(Arc::clone(&meta), namespace, hard())))
            .collect()
    }

    /// The label `namespace` is to carry, given the hash of its live quota's `status.hard`
    /// ([`in_force`]): [`OutsideTeams::label`] once the quota is in force, none before.
    pub fn label_of(&self, namespace: &str, status_hard: Option<&str>) -> Option<&str> {
        let guarded = self
            .namespaces
            .binary_search_by(|n| n.as_str().cmp(namespace));
        (guarded.is_ok() && status_hard == Some(self.label.as_str())).then_some(&*self.label)
    }
}

/// The guard and its quotas, kept between passes: built again only when the namespaces outside
/// teams, the governed resources or the CRDs change, not at every claim.
#[derive(Debug, Default)]
pub struct KeptGuard(Cache<(), u64, Option<Guard>>);

/// [`OutsideTeams`] and the quotas it asks for.
#[derive(Debug)]
pub struct Guard {
    pub outside: Arc<OutsideTeams>,
    pub quotas: Vec<Arc<NamespacedQuota>>,
}

impl KeptGuard {
    pub fn new(keep: bool) -> Self {
        Self(Cache::new(keep))
    }

    /// The guard of `namespaces` (outside every team, not exempt): a hard of 0 for each of
    /// `zero_hard` (every governed class's devices and named extended resource) and for the
    /// extended resource every governed class has (of `classes`); the quotas owned by the CRDs
    /// (`owners`).
    pub fn get<'a>(
        &mut self,
        namespaces: &[String],
        (zero_hard, classes): (&[Arc<str>], impl Iterator<Item = &'a String> + Clone),
        owners: Option<&Vec<OwnerReference>>,
    ) -> Option<&Guard> {
        let uids = owners_key(owners);
        let names: Vec<&String> = classes.clone().collect();
        let made_of = fingerprint(&(namespaces, zero_hard, names, uids));
        let guard = self.0.get((), made_of, |_| {
            // Under DRAExtendedResource a Pod asks for a class by this name too.
            let implicit =
                classes.map(|c| Arc::from(format!("requests.{IMPLICIT_EXTENDED_PREFIX}{c}")));
            let hard: Vec<Arc<str>> = zero_hard.iter().cloned().chain(implicit).collect();
            let outside = OutsideTeams::new(namespaces.to_vec(), &hard)?;
            let quotas = outside.quotas(&hard, owners);
            Some(Guard {
                outside: Arc::new(outside),
                quotas,
            })
        });
        guard.as_ref()
    }

    /// Forgets the guard when the last pass asked for none.
    pub fn sweep(&mut self) {
        self.0.sweep();
    }
}

/// The hash of a quota's `status.hard` (as the API server stores it), comparable with
/// [`OutsideTeams::label`].
pub fn in_force(status_hard: &serde_json::Value) -> Option<String> {
    let hard = status_hard.as_object()?;
    (!hard.is_empty()).then(|| content_hash(hard))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hard(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|n| Arc::from(*n)).collect()
    }

    #[test]
    fn a_namespace_is_labelled_only_once_its_quota_status_has_every_hard() {
        let zero = hard(&[
            "a100.teamgpu.io.deviceclass.resource.k8s.io/devices",
            "requests.deviceclass.resource.kubernetes.io/a100.teamgpu.io",
        ]);
        let outside = OutsideTeams::new(vec!["ci".into(), "default".into()], &zero).unwrap();
        // As the quota controller writes it, keys in its own order.
        let synced = serde_json::json!({
            "requests.deviceclass.resource.kubernetes.io/a100.teamgpu.io": "0",
            "a100.teamgpu.io.deviceclass.resource.k8s.io/devices": "0",
        });
        let stale = serde_json::json!({
            "a100.teamgpu.io.deviceclass.resource.k8s.io/devices": "0",
        });
        let synced = in_force(&synced);
        assert_eq!(
            outside.label_of("ci", synced.as_deref()),
            Some(&*outside.label)
        );
        assert_eq!(outside.label_of("ci", in_force(&stale).as_deref()), None);
        // Not synced yet: an empty status.hard is ignored by quota admission.
        assert_eq!(in_force(&serde_json::json!({})), None);
        assert_eq!(outside.label_of("ci", None), None);
        // Not guarded: a team's namespace, or an exempt one.
        assert_eq!(outside.label_of("team-a", synced.as_deref()), None);
    }

    #[test]
    fn the_label_changes_with_the_resources() {
        let one = hard(&["a.deviceclass.resource.k8s.io/devices"]);
        let two = hard(&[
            "a.deviceclass.resource.k8s.io/devices",
            "b.deviceclass.resource.k8s.io/devices",
        ]);
        let label = |hard: &[Arc<str>]| OutsideTeams::new(vec![], hard).unwrap().label;
        assert_eq!(label(&one), label(&one));
        assert_ne!(label(&one), label(&two));
        // A label value: at most 63 characters of [a-z0-9].
        let value = label(&two);
        assert!(value.len() <= 63 && value.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert!(OutsideTeams::new(vec!["ci".into()], &[]).is_none());
    }
}
