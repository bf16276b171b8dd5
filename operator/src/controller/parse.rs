//! teamgpu's custom resources read from their watch caches (kept dynamic, so that one
//! malformed object is reported, not fatal) into their types.

use kube::api::DynamicObject;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::effects::{Malformed, PolicyKind};

/// A policy being deleted (waiting for finalizers or foreground deletion of its dependents) is
/// treated as gone: its objects are no longer wanted, and its status is no longer written.
fn is_terminating(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
}

/// The custom resources teamgpu reads, each with its [`PolicyKind`].
pub(super) trait Policy:
    kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned
{
    const KIND: PolicyKind;
}

impl Policy for GpuSharingPolicy {
    const KIND: PolicyKind = PolicyKind::GpuSharingPolicy;
}

impl Policy for TeamGpuPolicy {
    const KIND: PolicyKind = PolicyKind::TeamGpuPolicy;
}

/// Read a custom resource into its type; one that does not fit is reported, never fatal.
fn parse<K: Policy>(obj: &DynamicObject, malformed: &mut Vec<Malformed>) -> Option<K> {
    match obj.clone().try_parse::<K>() {
        Ok(k) => Some(k),
        Err(error) => {
            malformed.push(Malformed {
                object: obj.clone(),
                kind: K::KIND,
                message: format!("the object cannot be read as a {}: {error}", K::kind(&())),
            });
            None
        }
    }
}

/// Every policy of `store` not being deleted, read into its type; the ones that do not fit are
/// added to `malformed`.
pub(super) fn parse_all<K: Policy>(
    store: &kube::runtime::reflector::Store<DynamicObject>,
    malformed: &mut Vec<Malformed>,
) -> Vec<K> {
    store
        .state()
        .iter()
        .filter(|o| !is_terminating(o))
        .filter_map(|o| parse(o, malformed))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_policy_that_does_not_fit_its_type_is_skipped_and_reported() {
        let object = |spec: serde_json::Value| -> DynamicObject {
            serde_json::from_value(
                json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
                                          "metadata": {"name": "t"}, "spec": spec}),
            )
            .unwrap()
        };
        let mut malformed = Vec::new();
        assert!(
            parse::<TeamGpuPolicy>(&object(json!({"weight": "many"})), &mut malformed).is_none()
        );
        assert_eq!(malformed.len(), 1);
        assert!(
            malformed[0]
                .message
                .contains("cannot be read as a TeamGpuPolicy"),
            "{}",
            malformed[0].message
        );
        assert_eq!(malformed[0].kind.api_resource().plural, "teamgpupolicies");
        let good = parse::<TeamGpuPolicy>(&object(json!({"namespaces": ["a"]})), &mut malformed);
        assert_eq!(good.map(|t| t.spec.namespaces), Some(vec!["a".to_owned()]));
        assert_eq!(malformed.len(), 1);
    }
}
