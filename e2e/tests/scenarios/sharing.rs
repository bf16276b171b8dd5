//! Fair sharing on the real API server: idle devices lent and taken back, lending limits,
//! reclaim and its disruption budget, selectors that read new attributes.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_devices_are_lent_and_taken_back_when_their_owner_returns() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    // 16 PCIe GPUs; "owner" is guaranteed 8, "borrower" 4 and may borrow up to 16.
    world.owner_and_borrower().await;
    let _operator = world.operator();
    let key = "pcie.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let hard = |ns: &'static str| {
        let world = &world;
        async move {
            world
                .quota_hard(ns)
                .await
                .map(|h| h.get(key).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0))
        }
    };

    // The owner is idle: the borrower may use everything beyond the owner's... idle devices.
    let lent = eventually("the borrower may borrow", CONVERGE, || async {
        let h = hard("borrower").await?;
        if h > 4 {
            Ok(h)
        } else {
            Err(format!("hard {h}"))
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("borrower"));
    let borrowed = lent.min(12);
    for i in 0..borrowed {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("job-{i:02}"), "pcie"),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let allocated = |ns: &'static str| {
        let (client, ns) = (client.clone(), world.ns(ns));
        async move {
            let claims = Api::<ResourceClaim>::namespaced(client, &ns)
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok::<usize, String>(
                claims
                    .items
                    .iter()
                    .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
                    .count(),
            )
        }
    };
    eventually(
        "the borrower's pods get devices beyond its guarantee",
        CONVERGE,
        || async {
            let n = allocated("borrower").await?;
            if n as u32 == borrowed {
                Ok(())
            } else {
                Err(format!("{n} allocated"))
            }
        },
    )
    .await;

    // The owner comes back and wants its guarantee.
    let owner_pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("owner"));
    for i in 0..8 {
        owner_pods
            .create(
                &PostParams::default(),
                &gpu_pod(&format!("serve-{i}"), "pcie"),
            )
            .await
            .unwrap();
    }
    eventually(
        "the owner gets all 8 guaranteed devices",
        Duration::from_secs(30),
        || async {
            let n = allocated("owner").await?;
            if n == 8 {
                Ok(())
            } else {
                Err(format!("{n} allocated to the owner"))
            }
        },
    )
    .await;
    // The borrower's newest pods were evicted; its quota shrank so it cannot take them back.
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(left.len() as u32 <= 8, "{left:?}");
    assert!(
        left.iter().all(|p| p.as_str() < "job-08"),
        "the newest pods go first: {left:?}"
    );
    eventually(
        "the borrower's quota shrank to what the pool allows",
        CONVERGE,
        || async {
            let h = hard("borrower").await?;
            if h <= 8 {
                Ok(())
            } else {
                Err(format!("hard {h}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_devices_go_first_to_the_team_whose_pods_wait() {
    let Some(world) = World::new().await else {
        return;
    };
    // 16 PCIe GPUs. "alpha" (weight 3) is guaranteed nothing and may borrow all 16; "beta"
    // (weight 1) is guaranteed 4 and may hold 16.
    world.pcie_policy().await;
    for (name, guaranteed, weight) in [("alpha", 0, 3), ("beta", 4, 1)] {
        let quota = json!({"sharingPolicy": "pcie", "guaranteed": guaranteed, "limit": 16});
        world
            .create_team(name, json!({"quotas": [quota], "weight": weight}))
            .await;
    }
    let _operator = world.operator();
    // Nothing waits: the 16 idle devices go by weight to the team holding the least for it.
    // alpha (weight 3) rises to beta's 4 (weight 1) at 12, and the next device of each ties at
    // level 5: 15 to alpha, and 1 to beta beyond its 4.
    world.hard_is("alpha", "pcie", "15").await;
    world.hard_is("beta", "pcie", "5").await;

    // beta starts 14 one-GPU Pods: 5 fit its quota, 9 wait. By weight alone alpha (nothing
    // waiting, holding nothing) would be lent the 11 idle devices, pass after pass, and beta's
    // Pods would wait beside devices nobody uses. beta's waiting Pods are served first: all 14
    // get a device, and alpha may claim the 2 left.
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.ns("beta"));
    for i in 0..14 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("job-{i:02}"), "pcie"),
        )
        .await
        .unwrap();
    }
    world.allocated_in("beta", 14).await;
    world.hard_is("beta", "pcie", "14").await;
    world.hard_is("alpha", "pcie", "2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lending_limit_keeps_part_of_an_idle_guarantee_unlent() {
    let Some(world) = World::new().await else {
        return;
    };
    // 16 PCIe GPUs. "owner" is guaranteed 8 and lends at most 2 of them; "borrower" is
    // guaranteed 4 and may hold up to 16. Nobody uses anything.
    world
        .pcie_teams([
            (
                "owner",
                json!({"guaranteed": 8, "lendingLimit": 2}),
                json!({}),
            ),
            ("borrower", json!({"guaranteed": 4, "limit": 16}), json!({})),
        ])
        .await;
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let _operator = world.operator();
    let key = "pcie.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let hard = |ns: &'static str, want: &'static str| {
        let world = &world;
        async move {
            let h = world.quota_hard(ns).await?;
            match h.get(key) {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{ns}: {other:?}")),
            }
        }
    };
    // The borrower gets its 4, the 4 nobody is guaranteed and the owner's 2: 10, not 16.
    eventually("the borrower may borrow 6", CONVERGE, || {
        hard("borrower", "10")
    })
    .await;
    eventually("the owner keeps its 8", CONVERGE, || hard("owner", "8")).await;
    let owner = eventually(
        "the owner's status says 6 kept unlent",
        CONVERGE,
        || async {
            let s = world.team_status("owner").await?;
            let q = s.quotas.first().cloned().ok_or("no quota status")?;
            if q.reserved == 6 {
                Ok(q)
            } else {
                Err(format!("{q:?}"))
            }
        },
    )
    .await;
    assert!(
        owner.explanation.contains("lending limit 2"),
        "{}",
        owner.explanation
    );
    // Without the limit, everything idle may be lent.
    tgp.patch(
        "owner",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"quotas": [{"sharingPolicy": "pcie", "guaranteed": 8}]}})),
    )
    .await
    .unwrap();
    eventually("the borrower may borrow 12", CONVERGE, || {
        hard("borrower", "16")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_waits_for_a_pod_disruption_budget_and_stops_at_the_borrowers_guarantee() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    world.owner_and_borrower().await;
    let _operator = world.operator();
    let borrower = world.ns("borrower");
    // The borrower's Pods may not be disrupted at all.
    let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "no-disruption"},
        "spec": {"maxUnavailable": 0, "selector": {}}
    }))
    .unwrap();
    let pdbs = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        client.clone(),
        &borrower,
    );
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("the borrower may borrow 8 more", CONVERGE, || async {
        let q = world.quota_status("borrower", "pcie").await?;
        if q.entitlement >= 12 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &borrower);
    for i in 0..12 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("job-{i:02}"), "pcie"),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually("the borrower holds 12 devices", CONVERGE, || async {
        let q = world.quota_status("borrower", "pcie").await?;
        if q.allocated == 12 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;

    // The owner wants its 8: 4 are free, 4 must come back, but the budget refuses evictions.
    let owner_pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns("owner"));
    for i in 0..8 {
        owner_pods
            .create(
                &PostParams::default(),
                &gpu_pod(&format!("serve-{i}"), "pcie"),
            )
            .await
            .unwrap();
    }
    // Reclaim counts the budget before it asks for any eviction, and tells the owner.
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &world.ns("owner"));
    let kept = format!(
        "PodDisruptionBudget {borrower}/no-disruption, which allows no disruption now, keeps Pod \
         {borrower}/job-"
    );
    let blocked = eventually("the owner told why", Duration::from_secs(40), || async {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        (list.items.into_iter())
            .filter(|e| e.reason.as_deref() == Some("ReclaimBlocked"))
            .filter_map(|e| e.note)
            .find(|n| n.contains(&kept))
            .ok_or_else(|| "no ReclaimBlocked naming the budget".to_owned())
    })
    .await;
    // 12 Pods of their own: 5 named, then how many more.
    assert!(
        blocked.contains("devices of pcie are still short and reclaim cannot free them now")
            && blocked.ends_with(" and 7 more; reclaim looks again every 10 s"),
        "{blocked}"
    );
    let borrower_events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &borrower);
    let refused: Vec<_> = (borrower_events
        .list(&Default::default())
        .await
        .unwrap()
        .items)
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("EvictionRefused"))
        .collect();
    assert!(refused.is_empty(), "no eviction asked for: {refused:?}");
    assert_eq!(
        pods.list(&Default::default()).await.unwrap().items.len(),
        12
    );

    // Once the budget allows it, reclaim goes on by itself (no other change wakes it) and takes
    // exactly what was borrowed beyond the free devices: the borrower keeps 8, above its 4.
    pdbs.delete("no-disruption", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the owner gets all 8 guaranteed devices",
        Duration::from_secs(60),
        || async {
            let q = world.quota_status("owner", "pcie").await?;
            if q.allocated == 8 {
                Ok(())
            } else {
                Err(format!("{q:?}"))
            }
        },
    )
    .await;
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    assert_eq!(left.len(), 8, "4 go, no more: {left:?}");
}

/// The operator keeps of each device only the attributes some selector reads. A policy whose
/// selector reads attributes nothing read before must see them: the slices are listed again,
/// and its devices are counted as the whole device would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_reading_new_attributes_counts_devices_as_if_whole() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let devices_of = |name: &'static str, want: u32| {
        let gsp = gsp.clone();
        async move {
            eventually(
                &format!("{name} counts {want} devices"),
                CONVERGE,
                || async {
                    let p = gsp.get(name).await.map_err(|e| e.to_string())?;
                    let status = p.status.ok_or("no status")?;
                    let ready = condition(&status.conditions, "Ready").map(|c| c.status.clone());
                    if status.devices == want && ready.as_deref() == Some("True") {
                        Ok(())
                    } else {
                        Err(format!("{} devices, Ready {ready:?}", status.devices))
                    }
                },
            )
            .await;
        }
    };
    // No sample and no NVIDIA class reads `addressingMode`: every one of the 48 GPUs of the
    // six fixture nodes has `addressingMode: HMM`.
    let policy: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "hmm"},
        "spec": {"driver": "gpu.nvidia.com",
                 "selector": {"deviceType": "gpu",
                              "cel": ["device.attributes['gpu.nvidia.com'].addressingMode == 'HMM'"]},
                 "sharing": {"strategy": "Exclusive"}}
    }))
    .unwrap();
    gsp.create(&PostParams::default(), &policy).await.unwrap();
    devices_of("hmm", 48).await;
    // Nor `uuid`: the fixture nodes repeat the template slice's UUIDs, so gpu-0 of each of the
    // six nodes has this one.
    let patch = json!({"spec": {"selector": {"cel": [
        "device.attributes['gpu.nvidia.com'].uuid == 'GPU-2fa81118-5a5f-aa66-7660-471eed407181'"
    ]}}});
    gsp.patch("hmm", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    devices_of("hmm", 6).await;
    // The samples are counted as before.
    devices_of("a100-80gb", 32).await;
}
