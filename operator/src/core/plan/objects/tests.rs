use super::*;
use crate::api::{GpuSharingPolicySpec, MemorySlices, Mps, Sharing, TimeSlicing};

fn policy(strategy: SharingStrategy) -> GpuSharingPolicy {
    let mut spec: GpuSharingPolicySpec =
        serde_json::from_value(json!({"claimTemplates": {"counts": [4, 1, 2]}})).unwrap();
    spec.sharing = Sharing {
        strategy,
        time_slicing: (strategy == SharingStrategy::TimeSlicing).then_some(TimeSlicing {
            interval: TimeSliceInterval::Long,
        }),
        mps: (strategy == SharingStrategy::Mps).then(|| Mps {
            default_active_thread_percentage: Some(50),
            default_pinned_device_memory_limit: Some("10Gi".into()),
        }),
        memory_slices: (strategy == SharingStrategy::MemorySlices).then(|| MemorySlices {
            size: "10Gi".into(),
            placement: Default::default(),
        }),
    };
    let mut p = GpuSharingPolicy::new("a100", spec);
    p.metadata.uid = Some("uid-1".into());
    p
}

#[test]
fn a_quota_is_applied_in_its_namespace_with_the_hash_of_its_spec() {
    let team: TeamGpuPolicy = serde_json::from_value(json!({
        "metadata": {"name": "ml", "uid": "uid-ml"},
        "spec": {"namespaces": ["ml-dev"], "quotas": [
            {"sharingPolicy": "b", "guaranteed": 2},
            {"sharingPolicy": "a", "guaranteed": 4, "limit": 8}]}
    }))
    .unwrap();
    let hard: BTreeMap<Arc<str>, u32> = [
        (
            Arc::from("b.teamgpu.io.deviceclass.resource.k8s.io/devices"),
            0,
        ),
        (
            Arc::from("a.teamgpu.io.deviceclass.resource.k8s.io/devices"),
            4,
        ),
    ]
    .into();
    let classes = ["a.teamgpu.io".to_owned()];
    let quota =
        resource_quota(Arc::new(quota_meta(&team, &classes, &[])), "ml-dev", &hard).to_object();
    assert_eq!(quota.metadata.name.as_deref(), Some("teamgpu"));
    assert_eq!(quota.metadata.namespace.as_deref(), Some("ml-dev"));
    assert_eq!(
        quota.metadata.labels.as_ref().unwrap()[OWNER_LABEL],
        "TeamGpuPolicy.ml"
    );
    assert_eq!(
        quota.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-ml"
    );
    let spec = quota.spec.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(spec).unwrap(),
        json!({"hard": {"a.teamgpu.io.deviceclass.resource.k8s.io/devices": "4",
                        "b.teamgpu.io.deviceclass.resource.k8s.io/devices": "0"}})
    );
    // What the team admission policy reads, with the quota as its params.
    let annotations = quota.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["teamgpu.io/team"], "ml");
    assert_eq!(annotations["teamgpu.io/device-classes"], "a.teamgpu.io");
    // What a member with `view` in the namespace reads of the team (b's class is not usable).
    assert_eq!(annotations["teamgpu.io/quotas"], "a: guaranteed 4, limit 8");
    // The hash covers those annotations too: a team's classes can change while every hard
    // stays the same.
    let mut read = annotations.clone();
    read.remove(CONTENT_HASH_ANNOTATION);
    assert_eq!(
        annotations[CONTENT_HASH_ANNOTATION],
        content_hash(&(Some(read), &quota.spec))
    );
}

#[test]
fn device_class_carries_its_expressions_owner_and_sharing_config() {
    let class = device_class(&policy(SharingStrategy::TimeSlicing), &["true".into()]);
    assert_eq!(class.metadata.name.as_deref(), Some("a100.teamgpu.io"));
    let labels = class.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[OWNER_LABEL], "GpuSharingPolicy.a100");
    assert_eq!(labels[MANAGED_BY_LABEL], "teamgpu");
    assert!(!labels.contains_key("app.kubernetes.io/instance"));
    let owner = &class.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("GpuSharingPolicy", "uid-1")
    );
    let config = class.spec.config.as_ref().unwrap()[0]
        .opaque
        .as_ref()
        .unwrap();
    assert_eq!(config.driver, "gpu.nvidia.com");
    assert_eq!(
        config.parameters.0,
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}})
    );
}

#[test]
fn mps_config_matches_the_nvidia_demo_and_exclusive_has_none() {
    let mps = sharing_config(&policy(SharingStrategy::Mps)).unwrap();
    assert_eq!(
        mps["sharing"],
        json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
               "defaultPinnedDeviceMemoryLimit": "10Gi"}})
    );
    assert_eq!(sharing_config(&policy(SharingStrategy::Exclusive)), None);
    let mut other_driver = policy(SharingStrategy::Mps);
    other_driver.spec.driver = "gpu.example.com".into();
    assert_eq!(sharing_config(&other_driver), None);
}

#[test]
fn one_template_per_count_named_by_count_with_a_content_hash() {
    let team = TeamGpuPolicy::new(
        "ml",
        serde_json::from_value(json!({"namespaces": ["ml"]})).unwrap(),
    );
    let templates = claim_templates(&team, &template_shapes(&policy(SharingStrategy::Exclusive)));
    let names: Vec<_> = templates
        .iter()
        .map(|t| t.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a100", "a100-x2", "a100-x4"]);
    let exactly = |t: &ResourceClaimTemplate| {
        t.spec
            .spec
            .devices
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()[0]
            .exactly
            .clone()
            .unwrap()
    };
    assert_eq!(exactly(&templates[2]).count, Some(4));
    assert_eq!(exactly(&templates[2]).device_class_name, "a100.teamgpu.io");
    // No uid on the team (planned from a file): no ownerReference rather than an invalid one.
    assert_eq!(templates[0].metadata.owner_references, None);
    let hashes: Vec<_> = templates
        .iter()
        .map(|t| t.metadata.annotations.as_ref().unwrap()[CONTENT_HASH_ANNOTATION].clone())
        .collect();
    assert_ne!(hashes[0], hashes[1]);
    assert_eq!(
        hashes[0],
        claim_templates(&team, &template_shapes(&policy(SharingStrategy::Mps)))[0]
            .metadata
            .annotations
            .as_ref()
            .unwrap()[CONTENT_HASH_ANNOTATION]
    );
}

#[test]
fn names_follow_the_documented_scheme() {
    assert_eq!(template_name("a100", 1), "a100");
    assert_eq!(template_name("a100", 8), "a100-x8");
    assert!(is_teamgpu_class("x.teamgpu.io"));
    assert!(!is_teamgpu_class("gpu.nvidia.com"));
}
