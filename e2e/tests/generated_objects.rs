//! Every object teamgpu generates validates against the OpenAPI schema served by a real
//! Kubernetes 1.36 API server (shared/fixtures/upstream), and the samples validate against the
//! generated CRDs.

use serde_json::{Value, json};
use teamgpu::plan::{ClusterState, plan};
use teamgpu_e2e::openapi::Schemas;

fn assert_valid(schemas: &Schemas, objects: &[Value]) {
    let mut failures = Vec::new();
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        if let Err(errors) = schemas.validate(api_version, kind, object) {
            failures.push(format!("{kind} {}: {errors:?}", object["metadata"]["name"]));
        }
    }
    assert!(
        failures.is_empty(),
        "objects the upstream schema rejects:\n{}",
        failures.join("\n")
    );
}

fn all_objects(state: &ClusterState) -> Vec<Value> {
    let planned = plan(state);
    teamgpu::sync::desired(&planned.objects)
        .into_values()
        .collect()
}

#[test]
fn the_example_plan_validates_against_the_upstream_schema() {
    let schemas = Schemas::upstream().expect("upstream OpenAPI documents load");
    let objects = all_objects(&teamgpu::example::state().unwrap());
    assert!(
        objects.len() > 30,
        "the example plans {} objects",
        objects.len()
    );
    for kind in [
        "DeviceClass",
        "ResourceClaimTemplate",
        "ResourceQuota",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(
            objects.iter().any(|o| o["kind"] == kind),
            "no {kind} planned"
        );
    }
    assert_valid(schemas, &objects);
}

#[test]
fn every_sharing_strategy_and_device_type_validates() {
    let schemas = Schemas::upstream().unwrap();
    let mut state = teamgpu::example::state().unwrap();
    let variants = [
        json!({"selector": {"deviceType": "mig", "migProfiles": ["1g.10gb", "3g.40gb"]},
               "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "5Gi"}}}),
        json!({"selector": {"deviceType": "mig"}, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}),
        json!({"selector": {"deviceType": "vfio", "minMemory": "40Gi"}, "claimTemplates": {"counts": [1, 2, 4, 8, 16, 32]}}),
        json!({"driver": "gpu.example.com", "selector": {
            "attributes": [{"name": "resource.kubernetes.io/pcieRoot", "string": "pci0000:64"},
                           {"name": "numa", "int": 1}, {"name": "nvlink", "bool": true}, {"name": "firmware", "version": "1.2.3"}],
            "cel": ["device.capacity['gpu.example.com'].memory.compareTo(quantity('1Gi')) > 0"]}}),
        json!({"selector": {"productNames": ["it's \"quoted\" \\ and ünïcode"], "architectures": ["Hopper", "Blackwell"], "minComputeCapability": "9.0"}}),
    ];
    for (i, spec) in variants.into_iter().enumerate() {
        state.sharing_policies.push(
            serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
                "metadata": {"name": format!("variant-{i}"), "uid": format!("uid-{i}")}, "spec": spec}))
            .unwrap(),
        );
        state.teams[0].spec.quotas.push(
            serde_json::from_value(
                json!({"sharingPolicy": format!("variant-{i}"), "guaranteed": 1}),
            )
            .unwrap(),
        );
    }
    // With uids, every object carries an ownerReference.
    for t in &mut state.teams {
        t.metadata.uid = Some(format!("team-{}", t.metadata.name.clone().unwrap()));
    }
    for p in &mut state.sharing_policies {
        p.metadata
            .uid
            .get_or_insert_with(|| format!("gsp-{}", p.metadata.name.clone().unwrap()));
    }
    let objects = all_objects(&state);
    assert!(objects.iter().all(|o| {
        o["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
            || o["metadata"]["ownerReferences"].is_array()
            || o["metadata"]["labels"]["teamgpu.io/owner"] == "teamgpu"
    }));
    assert_valid(schemas, &objects);
}

#[test]
fn the_samples_validate_against_the_generated_crds() {
    let schemas = Schemas::upstream().unwrap();
    let samples = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples");
    let crds: Vec<(String, Value)> = teamgpu::crd::all()
        .into_iter()
        .map(|(_, crd)| {
            let crd = serde_json::to_value(crd).unwrap();
            (
                crd["spec"]["names"]["kind"].as_str().unwrap().to_owned(),
                crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone(),
            )
        })
        .collect();
    let mut checked = 0;
    for entry in std::fs::read_dir(samples).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            continue;
        }
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for doc in docs {
            let (_, schema) = crds
                .iter()
                .find(|(k, _)| doc["kind"] == k.as_str())
                .unwrap();
            schemas
                .validate_structural(schema, &doc)
                .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
            checked += 1;
        }
    }
    assert_eq!(checked, 5);
}
