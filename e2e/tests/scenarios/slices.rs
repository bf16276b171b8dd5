//! Memory slices of GPUs that many claims share, on the real control plane: one node's four
//! H100 80GB GPUs as the NVIDIA driver publishes them with `--consumable-shares=memory`
//! (`allowMultipleAllocations`, 81559Mi of memory in 1Mi steps each). The real scheduler
//! allocates the slices and records what each consumes; the real quota counts them; the real
//! admission refuses what is not one slice. And a team budget in GPU-equivalents across the
//! slices and the example's whole A100s.

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::ListParams;

use super::*;

const FIXTURE: &str = include_str!(
    "../../../operator/testdata/nvidia-dra-driver-gpu/resourceslice/h100-consumable-memory-node.teamgpu.yaml"
);

/// Publishes the fixture's slice on the cluster's first Node, labelled for the sandbox to
/// delete.
async fn publish_h100_node(client: &Client) {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let node = nodes.items[0].name_any();
    let doc = (FIXTURE.split("\n---\n"))
        .find(|d| d.contains("kind: ResourceSlice"))
        .unwrap();
    let mut slice: ResourceSlice = serde_saphyr::from_str(doc).unwrap();
    slice.spec.node_name = Some(node);
    (slice.metadata.labels.get_or_insert_default())
        .insert(teamgpu_e2e::sandbox::E2E_LABEL.into(), "true".into());
    Api::<ResourceSlice>::all(client.clone())
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
}

async fn create_slices_policy(client: &Client) {
    let policy: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "h100-10g"},
        "spec": {"selector": {"productNames": ["NVIDIA H100 80GB HBM3"]},
                 "sharing": {"strategy": "MemorySlices", "memorySlices": {"size": "10Gi"}},
                 "claimTemplates": {"counts": [1, 2]}}}))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
}

/// The API server's refusal of `claim`. Admission reads the namespace's quota from a cache of
/// its own, a moment behind the quota teamgpu just wrote; a claim admitted meanwhile is deleted
/// and made again (and the time until the refusal printed).
async fn refused_once_admission_has_the_quota(
    claims: &Api<ResourceClaim>,
    claim: &ResourceClaim,
) -> String {
    let started = Instant::now();
    eventually("the claim refused", CONVERGE, || async {
        match claims.create(&PostParams::default(), claim).await {
            Err(refused) => {
                println!(
                    "refused {} ms after the first try",
                    started.elapsed().as_millis()
                );
                Ok(refused.to_string())
            }
            Ok(admitted) => {
                let name = admitted.name_any();
                let _ = claims.delete(&name, &DeleteParams::default()).await;
                eventually("gone", CONVERGE, || async {
                    match claims.get_opt(&name).await {
                        Ok(None) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                Err("admitted".to_owned())
            }
        }
    })
    .await
}

impl World {
    /// The memory each allocated claim of `ns` consumes, as the scheduler recorded it.
    async fn consumed(&self, ns: &str) -> Vec<String> {
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.ns(ns))
            .list(&ListParams::default())
            .await
            .unwrap();
        let mut out: Vec<String> = (claims.items.iter())
            .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
            .flat_map(|d| d.results.iter().flatten())
            .map(|r| {
                let memory = (r.consumed_capacity.as_ref())
                    .and_then(|c| c.get("memory"))
                    .map_or("none".to_owned(), |q| q.0.clone());
                format!("{}:{memory}", r.device)
            })
            .collect();
        out.sort();
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_slices_are_counted_allocated_and_held_to_the_quota_exactly() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    publish_h100_node(&client).await;
    create_slices_policy(&client).await;
    // 3 slices guaranteed, 5 at most, written in memory.
    world
        .create_team(
            "notebooks",
            json!({"quotas": [{"sharingPolicy": "h100-10g", "guaranteed": "30Gi", "limit": "50Gi"}]}),
        )
        .await;
    let _operator = world.operator();

    // 4 GPUs of 81559Mi: 7 slices of 10240Mi each (not 8), 28 in all; one slice is
    // 10240/81559 of a GPU, 0.125554 rounded up, and the 28 are 3.52 GPUs' worth.
    let gsp: Api<GpuSharingPolicy> = Api::all(client.clone());
    eventually("h100-10g counts 28 slices", CONVERGE, || async {
        let status =
            (gsp.get("h100-10g").await.map_err(|e| e.to_string())?.status).ok_or("no status")?;
        let ge = status.gpu_equivalents.clone().unwrap_or_default();
        if status.devices == 28 && ge.per_device == "0.13" && ge.devices == "3.52" {
            Ok(())
        } else {
            Err(format!("{} devices, {ge:?}", status.devices))
        }
    })
    .await;
    // Nobody else wants them: up to the limit, 50Gi = 5 slices.
    world.hard_is("notebooks", "h100-10g", "5").await;
    let template = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &world.ns("notebooks"))
        .get("h100-10g")
        .await
        .unwrap();
    let request = &template.spec.spec.devices.unwrap().requests.unwrap()[0];
    let capacity = request.exactly.as_ref().unwrap().capacity.clone().unwrap();
    assert_eq!(capacity.requests.unwrap()["memory"].0, "10Gi");

    let ns = world.ns("notebooks");
    // A claim of the class that asks for another amount, or for none, is refused by admission
    // (while the quota has room: quota admission may judge first).
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    for capacity in [json!({"requests": {"memory": "20Gi"}}), json!(null)] {
        let mut exactly = json!({"deviceClassName": "h100-10g.teamgpu.io"});
        if !capacity.is_null() {
            exactly["capacity"] = capacity.clone();
        }
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "odd"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}))
        .unwrap();
        let refused = refused_once_admission_has_the_quota(&claims, &claim).await;
        assert!(
            refused.contains(
                "a request of a memory-slice class must ask for exactly one slice per device"
            ),
            "{capacity}: {refused}"
        );
    }

    // Six one-slice Pods: the scheduler gives five of them a slice that consumes 10Gi; quota
    // refuses the sixth's claim.

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..6 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("nb-{i}"), "h100-10g"),
        )
        .await
        .unwrap();
    }
    eventually("5 slices allocated", Duration::from_secs(60), || async {
        let consumed = world.consumed("notebooks").await;
        if consumed.len() == 5 && consumed.iter().all(|c| c.ends_with(":10Gi")) {
            Ok(())
        } else {
            Err(format!("{consumed:?}"))
        }
    })
    .await;
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .get("teamgpu")
        .await
        .unwrap();
    let used = quota.status.unwrap().used.unwrap();
    assert_eq!(
        used["h100-10g.teamgpu.io.deviceclass.resource.k8s.io/devices"].0,
        "5"
    );
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        claims.items.len(),
        5,
        "the sixth claim was refused by quota"
    );
    eventually("the team's status counts 5 slices", CONVERGE, || async {
        let q = world.quota_status("notebooks", "h100-10g").await?;
        let ge = q.gpu_equivalents.clone().unwrap_or_default();
        // 5 × 0.125554.
        if (q.guaranteed, q.limit, q.allocated) == (3, 5, 5) && ge.allocated == "0.63" {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_in_gpu_equivalents_holds_whole_gpus_and_slices_together() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    publish_h100_node(&client).await;
    create_slices_policy(&client).await;
    let whole: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "a100-80gb"},
        "spec": {"selector": {"productNames": ["NVIDIA A100-SXM4-80GB"]}}}))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .create(&PostParams::default(), &whole)
        .await
        .unwrap();
    // 2 GPU-equivalents across whole A100s (1 each) and 10Gi slices (0.125554 each).
    world
        .create_team(
            "mixed",
            json!({"budget": {"gpuEquivalents": 2}, "quotas": [
                {"sharingPolicy": "a100-80gb", "guaranteed": 0, "limit": 8},
                {"sharingPolicy": "h100-10g", "guaranteed": 0, "limit": 20}]}),
        )
        .await;
    let _operator = world.operator();
    // Nothing in use: 2 whole GPUs, or floor(2 / 0.125554) = 15 slices.
    world.hard_is("mixed", "a100-80gb", "2").await;
    world.hard_is("mixed", "h100-10g", "15").await;

    // One whole GPU in use leaves 1: one more whole GPU, or 7 slices.
    let ns = world.ns("mixed");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &gpu_pod("train", "a100-80gb"))
        .await
        .unwrap();
    world.hard_is("mixed", "a100-80gb", "2").await;
    world.hard_is("mixed", "h100-10g", "7").await;
    eventually("the budget says 1 of 2 in use", CONVERGE, || async {
        let status = world.team_status("mixed").await?;
        let budget = status.budget.clone().ok_or("no budget status")?;
        let ok = condition(&status.conditions, "Budget").is_some_and(|c| c.status == "True");
        if (budget.in_use.as_str(), budget.left.as_str()) == ("1", "1") && ok {
            Ok(())
        } else {
            Err(format!("{budget:?}"))
        }
    })
    .await;

    // The budget lowered below what runs: nothing is evicted, nothing new fits, and status says
    // by how much the team is over.
    Api::<TeamGpuPolicy>::all(client.clone())
        .patch(
            "mixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"budget": {"gpuEquivalents": 0}}})),
        )
        .await
        .unwrap();
    world.hard_is("mixed", "a100-80gb", "1").await;
    world.hard_is("mixed", "h100-10g", "0").await;
    eventually("over budget, said", CONVERGE, || async {
        let status = world.team_status("mixed").await?;
        match condition(&status.conditions, "Budget") {
            Some(c) if c.status == "False" && c.reason == "OverBudget" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let train = pods.get("train").await.unwrap();
    assert!(
        train.metadata.deletion_timestamp.is_none() && train.spec.unwrap().node_name.is_some(),
        "the running Pod keeps its GPU"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_team_gpus_no_gpu_holds_slices_of_two_teams() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    publish_h100_node(&client).await;
    let policy: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "h100-own"},
        "spec": {"selector": {"productNames": ["NVIDIA H100 80GB HBM3"]},
                 "sharing": {"strategy": "MemorySlices",
                             "memorySlices": {"size": "10Gi", "placement": "TeamGpus"}}}}))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // 10 slices (two GPUs of 7) and 5 (one GPU).
    for (team, slices) in [("notebooks", 10), ("inference", 5)] {
        world
            .create_team(
                team,
                json!({"quotas": [{"sharingPolicy": "h100-own", "guaranteed": slices, "limit": slices}]}),
            )
            .await;
    }
    let _operator = world.operator();
    world.hard_is("notebooks", "h100-own", "10").await;
    world.hard_is("inference", "h100-own", "5").await;
    // Slices of both teams, as their Pods come.
    for (team, n) in [("notebooks", 8), ("inference", 4)] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns(team));
        for i in 0..n {
            pods.create(
                &PostParams::default(),
                &gpu_pod(&format!("{team}-{i}"), "h100-own"),
            )
            .await
            .unwrap();
        }
    }
    let gpus_of = |team: &'static str| {
        let world = &world;
        async move {
            let held = world.consumed(team).await;
            (held.iter())
                .map(|d| d.split(':').next().unwrap().to_owned())
                .collect::<BTreeSet<String>>()
        }
    };
    eventually("12 slices allocated", Duration::from_secs(60), || async {
        let (nb, inf) = (
            world.consumed("notebooks").await,
            world.consumed("inference").await,
        );
        if nb.len() == 8 && inf.len() == 4 {
            Ok(())
        } else {
            Err(format!("{nb:?} {inf:?}"))
        }
    })
    .await;
    let (notebooks, inference) = (gpus_of("notebooks").await, gpus_of("inference").await);
    assert!(
        notebooks.len() <= 2 && inference.len() == 1 && notebooks.is_disjoint(&inference),
        "notebooks on {notebooks:?}, inference on {inference:?}"
    );
    let gsp: Api<GpuSharingPolicy> = Api::all(client.clone());
    let status = gsp.get("h100-own").await.unwrap().status.unwrap();
    let shared = condition(&status.conditions, "GpusSharedByTeams").unwrap();
    assert_eq!(shared.status, "False", "{}", shared.message);

    // A claim of the class that selects no GPUs, or others, is refused.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &world.ns("inference"));
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "anywhere"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "h100-own.teamgpu.io",
            "capacity": {"requests": {"memory": "10Gi"}}}}]}}}))
    .unwrap();
    let refused = refused_once_admission_has_the_quota(&claims, &claim).await;
    assert!(
        refused.contains("must select the team's GPUs exactly as its ResourceClaimTemplates do"),
        "{refused}"
    );
}
