//! Every object teamgpu generates is accepted by a real Kubernetes API server (a server-side
//! apply with `dryRun=All` and `fieldValidation=Strict`: schema, unknown fields, CEL rules and
//! defaulting, without storing anything), and so are the samples, by the generated CRDs.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams, ValidationDirective};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};
use teamgpu::core::plan::plan;
use teamgpu::core::state::ClusterState;
use teamgpu_e2e::TestCluster;

/// Applies `objects` with `dryRun=All` and strict field validation; returns what the server
/// refused.
async fn refused(cluster: &TestCluster, objects: &[Value]) -> Vec<String> {
    let client = cluster.client();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let params = PatchParams {
        dry_run: true,
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::apply("teamgpu").force()
    };
    let mut failures = Vec::new();
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let (resource, caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
            .unwrap_or_else(|| panic!("the server does not serve {api_version} {kind}"));
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) if caps.scope == Scope::Namespaced => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        if let Err(error) = api.patch(name, &params, &Patch::Apply(object)).await {
            failures.push(format!("{kind} {name}: {error}"));
        }
    }
    failures
}

/// Creates the namespaces the objects live in (they exist in any cluster teamgpu plans for).
async fn namespaces_of(cluster: &TestCluster, objects: &[Value]) {
    let api: Api<Namespace> = Api::all(cluster.client());
    for ns in objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
    {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        // The tests run in parallel: another one may have made it first.
        match api.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating namespace {ns}: {e}"),
        }
    }
}

/// Creates the objects' namespaces, then asserts the API server accepts every object.
async fn assert_accepted(cluster: &TestCluster, objects: &[Value]) {
    namespaces_of(cluster, objects).await;
    let failures = refused(cluster, objects).await;
    assert!(failures.is_empty(), "refused:\n{}", failures.join("\n"));
}

fn all_objects(state: &ClusterState) -> Vec<Value> {
    let planned = plan(state);
    teamgpu::core::diff::desired(&planned.objects)
        .into_values()
        .collect()
}

#[tokio::test]
async fn the_example_plan_is_accepted_by_the_api_server() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let objects = all_objects(&teamgpu::cli::example::state().unwrap());
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
    assert_accepted(&cluster, &objects).await;
}

#[tokio::test]
async fn every_sharing_strategy_and_device_type_is_accepted() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let mut state = teamgpu::cli::example::state().unwrap();
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
    assert_accepted(&cluster, &objects).await;
}

#[tokio::test]
async fn the_samples_are_accepted_by_the_generated_crds() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let samples = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(samples).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "kustomization.yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            docs.extend(teamgpu_e2e::fixtures::yaml_documents_str(&text).unwrap());
        }
    }
    assert_eq!(docs.len(), 5);
    assert_accepted(&cluster, &docs).await;
}

#[tokio::test]
async fn an_object_the_schema_rejects_is_refused() {
    // The judge can fail: an unknown field and a wrong type are refused.
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    let bad = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "bad.teamgpu.io"},
        "spec": {"selectors": [{"cel": {"expression": 42}}], "unknownField": true}});
    let failures = refused(&cluster, &[bad]).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
}

#[tokio::test]
async fn the_admission_policies_of_a_hundred_teams_with_members_are_accepted() {
    let Some(cluster) = TestCluster::start_or_skip().await else {
        return;
    };
    // The namespace-membership policy takes every team as params: the API server must accept
    // (type-check and cost-estimate) the policies, and evaluate the membership policy once per
    // team within its runtime budget, at a realistic number of teams.
    let mut state = teamgpu_synthetic::synthetic(teamgpu_synthetic::Scale {
        teams: 100,
        namespaces_per_team: 1,
        sharing_policies: 20,
        nodes: 10,
        claims: 0,
        counter_sets: false,
        departments: 0,
    })
    .unwrap();
    for (i, team) in state.teams.iter_mut().enumerate() {
        team.spec.members = serde_json::from_value(json!([
            {"kind": "Group", "name": format!("team-{i}")},
            {"kind": "User", "name": format!("lead-{i}@example.com")},
            {"kind": "ServiceAccount", "name": "argocd-application-controller", "namespace": "argocd"}
        ]))
        .unwrap();
    }
    let policies: Vec<Value> = all_objects(&state)
        .into_iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .collect();
    assert_eq!(policies.len(), 4);
    let membership = policies
        .iter()
        .find(|p| p["metadata"]["name"] == "teamgpu-namespace-membership")
        .unwrap();
    assert!(
        !membership.to_string().contains("lead-99@example.com"),
        "the teams are params, not compiled into the policy"
    );
    assert_accepted(&cluster, &policies).await;
    let teams: Api<teamgpu::api::TeamGpuPolicy> = Api::all(cluster.client());
    for team in &state.teams {
        teams
            .create(&PostParams::default(), &teamgpu_e2e::fixtures::fresh(team))
            .await
            .unwrap();
    }

    // In force (this binary's control plane has no operator), it stays within the API server's
    // runtime cost budget: members (a user, a ServiceAccount) join a namespace to team-099, a
    // non-member is refused.
    let client = cluster.client();
    let params = PatchParams::apply("teamgpu").force();
    let vap: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
        >(&()),
    );
    let binding: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::erase::<
            k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
        >(&()),
    );
    let name = "teamgpu-namespace-membership";
    vap.patch(name, &params, &Patch::Apply(membership))
        .await
        .unwrap();
    let bound = serde_json::to_value(
        teamgpu::core::plan::namespace_admission::membership_binding(
            teamgpu::core::plan::admission::Enforcement::Deny,
        ),
    )
    .unwrap();
    let mut bound = bound;
    bound["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    bound["kind"] = json!("ValidatingAdmissionPolicyBinding");
    binding
        .patch(name, &params, &Patch::Apply(&bound))
        .await
        .unwrap();
    let as_user = |user: &str| {
        let mut config = cluster.config().clone();
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
        kube::Client::try_from(config).unwrap()
    };
    // Both may create namespaces (RBAC), only one is team-099's member.
    let rbac = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "e2e-namespace-creators"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "lead-99@example.com"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:serviceaccount:argocd:argocd-application-controller"}]});
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .patch("e2e-namespace-creators", &params, &Patch::Apply(&rbac))
        .await
        .unwrap();
    let labelled = |name: &str| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name,
            "labels": {"teamgpu.io/team": "team-099"}}}))
        .unwrap()
    };
    // Dry runs: admission runs, nothing is stored.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let refusal = loop {
        // Admission sees a new binding a moment after it is written, and so does RBAC: until
        // it does, the refusal is RBAC's.
        match Api::<Namespace>::all(as_user("mallory"))
            .create(&dry, &labelled("mallory-joins"))
            .await
        {
            Err(kube::Error::Api(s))
                if s.message.contains("cannot create resource")
                    && started.elapsed() < std::time::Duration::from_secs(20) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(kube::Error::Api(s)) => break s,
            Ok(_) if started.elapsed() < std::time::Duration::from_secs(20) => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Ok(_) => panic!("mallory joined team-099"),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(refusal.code, 403, "{refusal:?}");
    assert!(
        refusal
            .message
            .contains("only members of TeamGpuPolicy team-099"),
        "{refusal:?}"
    );
    Api::<Namespace>::all(as_user("lead-99@example.com"))
        .create(&dry, &labelled("lead-joins"))
        .await
        .unwrap();
    // A ServiceAccount member, told by its namespace and name.
    Api::<Namespace>::all(as_user(
        "system:serviceaccount:argocd:argocd-application-controller",
    ))
    .create(&dry, &labelled("argocd-joins"))
    .await
    .unwrap();
    binding.delete(name, &Default::default()).await.unwrap();
    vap.delete(name, &Default::default()).await.unwrap();
    for team in &state.teams {
        teams
            .delete(team.metadata.name.as_deref().unwrap(), &Default::default())
            .await
            .unwrap();
    }
}
