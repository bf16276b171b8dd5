//! The OpenAPI validator against upstream fixtures.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use teamgpu_e2e::fixtures::{upstream_dir, yaml_documents};
use teamgpu_e2e::openapi::{Schemas, prune};

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            out.push(p);
        }
    }
}

fn api_version_kind(o: &Value) -> (&str, &str) {
    (
        o["apiVersion"].as_str().unwrap(),
        o["kind"].as_str().unwrap(),
    )
}

fn crd_schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

fn nvidia(rel: &str) -> PathBuf {
    upstream_dir().join("nvidia-dra-driver-gpu").join(rel)
}

#[test]
fn nvidia_fixtures_and_demo_specs_validate() {
    let schemas = Schemas::upstream().unwrap();
    let mut files = Vec::new();
    yaml_files(&nvidia("demo-specs"), &mut files);
    files.push(nvidia("deviceclasses.rendered-v1.yaml"));
    files.push(nvidia(
        "resourceslice/resourceslice-8gpu-node.assembled.yaml",
    ));
    let compute_domains =
        yaml_documents(&nvidia("crds/resource.nvidia.com_computedomains.yaml")).unwrap();
    let mut checked = 0;
    for f in &files {
        for doc in yaml_documents(f).unwrap() {
            let (av, kind) = api_version_kind(&doc);
            let result = if kind == "ComputeDomain" {
                schemas.validate_structural(crd_schema(&compute_domains[0]), &doc)
            } else if schemas.schema_for(av, kind).is_some() {
                schemas.validate(av, kind, &doc)
            } else {
                // apps/v1 Deployment: not among the served documents.
                assert_eq!(kind, "Deployment", "{}", f.display());
                continue;
            };
            assert_eq!(
                result,
                Ok(()),
                "{} {kind} {}",
                f.display(),
                doc["metadata"]["name"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 45, "checked {checked}");
}

#[test]
fn device_entries_from_docs_validate_as_devices() {
    let schemas = Schemas::upstream().unwrap();
    for f in ["gpu", "mig", "vfio"] {
        let devices = yaml_documents(&nvidia(&format!(
            "resourceslice/device-entry-{f}.from-docs.yaml"
        )))
        .unwrap();
        let slice = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices[0]}
        });
        assert_eq!(
            schemas.validate("resource.k8s.io/v1", "ResourceSlice", &slice),
            Ok(()),
            "{f}"
        );
    }
}

fn demo_claim_template() -> Value {
    let docs = yaml_documents(&nvidia("demo-specs/quickstart-v1/gpu-test1.yaml")).unwrap();
    docs.into_iter()
        .find(|d| d["kind"] == "ResourceClaimTemplate")
        .unwrap()
}

#[test]
fn wrong_type_is_reported_with_its_path() {
    let schemas = Schemas::upstream().unwrap();
    let mut t = demo_claim_template();
    t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!("two");
    let errs = schemas
        .validate("resource.k8s.io/v1", "ResourceClaimTemplate", &t)
        .unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("spec.spec.devices.requests[0].exactly.count: Invalid value"),
        "{errs:?}"
    );
    assert!(errs[0].contains("must be of type integer"), "{errs:?}");
}

#[test]
fn missing_required_and_unknown_fields_are_reported() {
    let schemas = Schemas::upstream().unwrap();
    let mut t = demo_claim_template();
    t["spec"]["spec"]["devices"]["requests"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["devicClassName"] = json!("typo");
    let errs = schemas
        .validate("resource.k8s.io/v1", "ResourceClaimTemplate", &t)
        .unwrap_err();
    assert!(
        errs.contains(&"spec.spec.devices.requests[0].name: Required value".to_string()),
        "{errs:?}"
    );
    assert!(
        errs.contains(
            &"unknown field \"spec.spec.devices.requests[0].exactly.devicClassName\"".to_string()
        ),
        "{errs:?}"
    );
    // `check` separates them so that the server can prune unknown fields (fieldValidation=Warn).
    let report = schemas
        .check("resource.k8s.io/v1", "ResourceClaimTemplate", &t)
        .unwrap();
    assert_eq!(
        report.unknown_fields,
        vec!["spec.spec.devices.requests[0].exactly.devicClassName"]
    );
    prune(&mut t, &report.unknown_fields);
    assert!(
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            .get("devicClassName")
            .is_none()
    );
}

#[test]
fn formats_enums_quantities_and_list_maps() {
    let schemas = Schemas::upstream().unwrap();
    let pod = |spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec});
    let ok = pod(json!({"containers": [{"name": "c", "image": "i",
        "resources": {"limits": {"cpu": "1500m", "memory": 1024}}}],
        "terminationGracePeriodSeconds": 30, "restartPolicy": "Never"}));
    assert_eq!(schemas.validate("v1", "Pod", &ok), Ok(()));

    let bad_quantity =
        pod(json!({"containers": [{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]}));
    let errs = schemas.validate("v1", "Pod", &bad_quantity).unwrap_err();
    assert!(
        errs[0].starts_with("spec.containers[0].resources.limits[cpu]: Invalid value: \"lots\""),
        "{errs:?}"
    );

    let bad_enum = pod(json!({"containers": [{"name": "c"}], "restartPolicy": "Sometimes"}));
    let errs = schemas.validate("v1", "Pod", &bad_enum).unwrap_err();
    assert!(
        errs[0].starts_with("spec.restartPolicy: Unsupported value: \"Sometimes\""),
        "{errs:?}"
    );

    // containers is a list-map keyed by name.
    let dup = pod(json!({"containers": [{"name": "c"}, {"name": "c"}]}));
    let errs = schemas.validate("v1", "Pod", &dup).unwrap_err();
    assert!(
        errs[0].starts_with("spec.containers[1]: Duplicate value"),
        "{errs:?}"
    );

    // int32 range (ResourceSlice pool generation is int64, resourceSliceCount int64; Pod priority int32).
    let big = pod(json!({"containers": [{"name": "c"}], "priority": 4_000_000_000u64}));
    let errs = schemas.validate("v1", "Pod", &big).unwrap_err();
    assert!(
        errs[0].starts_with("spec.priority: Invalid value: 4000000000"),
        "{errs:?}"
    );

    let bad_time = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "n", "creationTimestamp": "yesterday"}});
    let errs = schemas.validate("v1", "Namespace", &bad_time).unwrap_err();
    assert!(
        errs[0].starts_with("metadata.creationTimestamp: Invalid value"),
        "{errs:?}"
    );

    // IntOrString (PodDisruptionBudget.spec.maxUnavailable) and free-form FieldsV1.
    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "p", "managedFields": [{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:maxUnavailable": {}}}}]},
        "spec": {"maxUnavailable": "50%"}});
    assert_eq!(
        schemas.validate("policy/v1", "PodDisruptionBudget", &pdb),
        Ok(())
    );
    let mut pdb2 = pdb.clone();
    pdb2["spec"]["maxUnavailable"] = json!(true);
    assert!(
        schemas
            .validate("policy/v1", "PodDisruptionBudget", &pdb2)
            .is_err()
    );
}

#[test]
fn unknown_kind_is_an_error() {
    let schemas = Schemas::upstream().unwrap();
    let errs = schemas
        .validate("apps/v1", "Deployment", &json!({}))
        .unwrap_err();
    assert_eq!(errs, vec!["no schema for apps/v1 Deployment".to_string()]);
}

#[test]
fn crd_structural_schema_with_constraints() {
    let schemas = Schemas::upstream().unwrap();
    let crd = &yaml_documents(&nvidia("crds/resource.nvidia.com_computedomains.yaml")).unwrap()[0];
    let schema = crd_schema(crd);
    let ok = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
        "metadata": {"name": "cd", "namespace": "default"},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "t"}}}});
    assert_eq!(schemas.validate_structural(schema, &ok), Ok(()));
    let mut bad = ok.clone();
    bad["spec"]["bogus"] = json!(1);
    bad["metadata"]["labels"] = json!({"a": 1});
    let errs = schemas.validate_structural(schema, &bad).unwrap_err();
    assert!(
        errs.iter().any(|e| e == "unknown field \"spec.bogus\""),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("metadata.labels[a]: Invalid value: 1")),
        "{errs:?}"
    );
}

#[test]
fn structural_extensions_embedded_resources_preserve_unknown_and_int_or_string() {
    let schemas = Schemas::upstream().unwrap();
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
            "properties": {"spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "closed": {"type": "object"},
        "size": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "mode": {"type": "string", "enum": ["A", "B"], "nullable": true},
        "items": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "maxItems": 2}}}}});
    let ok = json!({"apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "x"}, "spec": {
        "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"replicas": 1}},
        "free": {"anything": [1, {"goes": true}]},
        "size": "50%", "mode": null, "items": ["a", "b"]}});
    assert_eq!(schemas.validate_structural(&schema, &ok), Ok(()));
    let mut bad = ok.clone();
    bad["spec"]["template"]["metadata"]["labels"] = json!("not-a-map");
    bad["spec"]["closed"] = json!({"x": 1});
    bad["spec"]["size"] = json!(1.5);
    bad["spec"]["items"] = json!(["a", "a", "b"]);
    let errs = schemas.validate_structural(&schema, &bad).unwrap_err();
    let has = |p: &str| errs.iter().any(|e| e.starts_with(p) || e.contains(p));
    assert!(
        has("spec.template.metadata.labels: Invalid value"),
        "{errs:?}"
    );
    assert!(has("unknown field \"spec.closed.x\""), "{errs:?}");
    assert!(has("spec.size: Invalid value: 1.5"), "{errs:?}");
    assert!(has("spec.items[1]: Duplicate value"), "{errs:?}");
    assert!(
        has("spec.items: Too many: 3: must have at most 2 items"),
        "{errs:?}"
    );
}
