//! Policies to objects: installing the samples, joining and leaving a team, claims up to the
//! entitlement, policy edits and deletion, conflicts, managed objects undone, bad input.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installing_the_samples_creates_device_classes_and_ready_policies() {
    let Some(world) = World::new().await else {
        return;
    };
    let _operator = world.operator();
    world.install_samples().await;

    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    let shared = eventually("DeviceClass a100-shared.teamgpu.io", CONVERGE, || async {
        classes
            .get_opt("a100-shared.teamgpu.io")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("missing".to_owned())
    })
    .await;
    let exprs: Vec<_> = shared
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .map(|c| c.expression.clone())
        .collect();
    assert!(
        exprs.iter().any(|e| e.contains("'NVIDIA A100-PCIE-40GB'")),
        "{exprs:?}"
    );
    let config = &shared.spec.config.as_ref().unwrap()[0]
        .opaque
        .as_ref()
        .unwrap()
        .parameters
        .0;
    assert_eq!(config["sharing"]["strategy"], "TimeSlicing");
    assert_eq!(config["sharing"]["timeSlicingConfig"]["interval"], "Long");
    assert_eq!(shared.labels()["app.kubernetes.io/managed-by"], "teamgpu");

    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    for name in ["a100-80gb", "a100-shared"] {
        eventually(
            &format!("GpuSharingPolicy {name} Ready"),
            CONVERGE,
            || async {
                let p = gsp.get(name).await.map_err(|e| e.to_string())?;
                let status = p.status.clone().ok_or("no status")?;
                match condition(&status.conditions, "Ready") {
                    Some(c) if c.status == "True" && status.devices > 0 => Ok(()),
                    other => Err(format!("{other:?} devices {}", status.devices)),
                }
            },
        )
        .await;
    }
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let ml = eventually("TeamGpuPolicy ml-research Ready", CONVERGE, || async {
        let t = tgp.get("ml-research").await.map_err(|e| e.to_string())?;
        let status = t.status.clone().ok_or("no status")?;
        match condition(&status.conditions, "Ready") {
            Some(c) if c.status == "True" => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        ml.namespaces[..],
        [world.ns("ml-research-dev"), world.ns("ml-research-train")]
    );
    let q = ml
        .quotas
        .iter()
        .find(|q| q.sharing_policy == "a100-80gb")
        .unwrap();
    assert_eq!((q.guaranteed, q.limit, q.capacity), (8, 16, 32));
    assert_eq!(
        world.templates("ml-research-dev").await,
        [
            "a100-80gb",
            "a100-80gb-x2",
            "a100-80gb-x4",
            "a100-80gb-x8",
            "a100-shared"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_a_namespace_joins_the_team_and_unlabelling_leaves_it() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };

    world.namespace("ml-new", None).await;
    world.label("ml-new", Some("ml-research")).await;
    let joined = Instant::now();
    eventually(
        "ml-new gets templates, quota and binding",
        // A timeout on a shared 2-core machine, not a speed target: the join time is printed
        // (and the scale example reports claim -> status latency).
        Duration::from_secs(20),
        || async {
            let templates = world.templates("ml-new").await;
            let quota = world.quota_hard("ml-new").await;
            let bound = world.admitted_as_team_namespace("ml-new").await;
            if templates.len() == 5 && quota.is_ok() && bound {
                Ok(())
            } else {
                Err(format!("{templates:?} {quota:?} {bound}"))
            }
        },
    )
    .await;
    eprintln!("self-service join took {:?}", joined.elapsed());

    world.label("ml-new", None).await;
    eventually(
        "ml-new loses everything",
        // A timeout on a shared 2-core machine, not a speed target: the join time is printed
        // (and the scale example reports claim -> status latency).
        Duration::from_secs(20),
        || async {
            let templates = world.templates("ml-new").await;
            let quota = world.quota_hard("ml-new").await;
            let bound = world.admitted_as_team_namespace("ml-new").await;
            if templates.is_empty() && quota.is_err() && !bound {
                Ok(())
            } else {
                Err(format!("{templates:?} {quota:?} {bound}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_up_to_the_entitlement_are_admitted_and_the_next_is_refused() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // ml-research has a100-shared guaranteed 2 = limit 2 (nothing to borrow), split over its two
    // namespaces; as one namespace uses its share, the team's headroom moves to it. So the team
    // can create exactly 2 claims in ml-research-dev, and the third is refused for good.
    let claims: Api<ResourceClaim> =
        Api::namespaced(world.client.clone(), &world.ns("ml-research-dev"));
    let create = |name: &'static str| {
        let claims = claims.clone();
        async move {
            claims
                .create(
                    &PostParams::default(),
                    &claim(name, "a100-shared.teamgpu.io", 1),
                )
                .await
        }
    };
    for name in ["first", "second"] {
        // A refusal may only mean the quota has not followed the team's headroom yet.
        eventually(&format!("claim {name} admitted"), CONVERGE, || async {
            create(name).await.map(drop).map_err(|e| e.to_string())
        })
        .await;
    }
    // Once the operator has seen both claims, the team's entitlement is used up: the third
    // claim is refused, and stays refused.
    eventually("status counts both claims", CONVERGE, || async {
        let q = world.quota_status("ml-research", "a100-shared").await?;
        if q.requested == 2 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    for _ in 0..5 {
        match create("one-too-many").await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403);
                assert!(s.message.contains("exceeded quota"), "{}", s.message);
            }
            other => panic!("the team's third claim must be refused by quota, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admitted = 2;
    let allowed = admitted;
    // The driver's own class is closed to the team: by admission policy, before quota.
    let bypass = claims
        .create(
            &PostParams::default(),
            &claim("bypass", "gpu.nvidia.com", 1),
        )
        .await
        .unwrap_err();
    assert!(
        bypass
            .to_string()
            .contains("belongs to TeamGpuPolicy ml-research"),
        "{bypass}"
    );
    eventually("status counts the claims", CONVERGE, || async {
        let q = world.quota_status("ml-research", "a100-shared").await?;
        if i64::from(q.requested) == allowed {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_flow_to_quotas_classes_and_templates_and_deletion_cleans_up() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let key = "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let sum = |ns_hard: Vec<BTreeMap<String, String>>| {
        ns_hard
            .iter()
            .map(|h| h[key].parse::<u32>().unwrap())
            .sum::<u32>()
    };

    // Raising ml-research's a100-shared limit from 2 to 6 raises its quotas.
    let before = sum(vec![
        world.quota_hard("ml-research-dev").await.unwrap(),
        world.quota_hard("ml-research-train").await.unwrap(),
    ]);
    let patch = json!({"spec": {"quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 16},
                                           {"sharingPolicy": "a100-shared", "guaranteed": 2, "limit": 6}]}});
    tgp.patch(
        "ml-research",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    eventually("quotas rise", CONVERGE, || async {
        let after = sum(vec![
            world.quota_hard("ml-research-dev").await?,
            world.quota_hard("ml-research-train").await?,
        ]);
        if after > before {
            Ok(())
        } else {
            Err(format!("{before} -> {after}"))
        }
    })
    .await;

    // Changing the sharing strategy updates the DeviceClass.
    let patch = json!({"spec": {"sharing": {"strategy": "MPS", "timeSlicing": null, "mps": {"defaultActiveThreadPercentage": 25}}}});
    gsp.patch(
        "a100-shared",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    eventually("DeviceClass switches to MPS", CONVERGE, || async {
        let c = classes
            .get("a100-shared.teamgpu.io")
            .await
            .map_err(|e| e.to_string())?;
        let p = c
            .spec
            .config
            .as_ref()
            .and_then(|c| c[0].opaque.as_ref())
            .map(|o| o.parameters.0.clone())
            .unwrap_or_default();
        if p["sharing"]["strategy"] == "MPS" && p["sharing"].get("timeSlicingConfig").is_none() {
            Ok(())
        } else {
            Err(p.to_string())
        }
    })
    .await;

    // Changing the offered counts recreates the templates.
    let dev_templates: Api<ResourceClaimTemplate> =
        Api::namespaced(world.client.clone(), &world.ns("ml-research-dev"));
    let old_uid = dev_templates.get("a100-80gb").await.unwrap().uid();
    gsp.patch(
        "a100-80gb",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"claimTemplates": {"counts": [1, 3]}}})),
    )
    .await
    .unwrap();
    eventually("templates follow the counts", CONVERGE, || async {
        let t = world.templates("ml-research-dev").await;
        if t == ["a100-80gb", "a100-80gb-x3", "a100-shared"] {
            Ok(())
        } else {
            Err(format!("{t:?}"))
        }
    })
    .await;
    let new_uid = dev_templates.get("a100-80gb").await.unwrap().uid();
    assert_eq!(old_uid, new_uid, "an unchanged template is left alone");

    // Deleting the team removes everything made for it.
    tgp.delete("ml-research", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ml-research's objects are gone", CONVERGE, || async {
        let team_namespaces = [world.ns("ml-research-dev"), world.ns("ml-research-train")];
        let left: Vec<_> = world
            .owned_objects()
            .await?
            .into_iter()
            .filter(|o| {
                team_namespaces
                    .iter()
                    .any(|ns| o.contains(&format!("/{ns}/")))
            })
            .collect();
        let mut bound = Vec::new();
        for ns in ["ml-research-dev", "ml-research-train"] {
            if world.admitted_as_team_namespace(ns).await {
                bound.push(ns);
            }
        }
        // Outside every team now: each guarded by a quota of 0, and nothing else.
        let guarded: Vec<String> = (team_namespaces.iter())
            .map(|ns| format!("resourcequota/{ns}/teamgpu-outside-teams"))
            .collect();
        if left == guarded && bound.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?} {bound:?}"))
        }
    })
    .await;
}

/// The `Conflict` messages of `teams`, once every one of them reports one.
async fn conflicts(world: &World, teams: [&str; 2]) -> Result<Vec<String>, String> {
    let mut messages = Vec::new();
    for team in teams {
        let s = world.team_status(team).await?;
        match condition(&s.conditions, "Conflict") {
            Some(c) if c.status == "True" => messages.push(c.message.clone()),
            other => return Err(format!("{team}: {other:?}")),
        }
    }
    Ok(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_claimed_twice_stays_with_its_team_or_gets_nothing_until_fixed() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let naming = |name: &str, namespace: &str| -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy", "metadata": {"name": name},
            "spec": {"namespaces": [world.ns(namespace)], "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 1}]}
        }))
        .unwrap()
    };
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());

    // rogue names ml-research-dev, which ml-research has: it stays ml-research's, whole.
    let dev = world.ns("ml-research-dev");
    let quota = world.quota_hard("ml-research-dev").await.unwrap();
    tgp.create(&PostParams::default(), &naming("rogue", "ml-research-dev"))
        .await
        .unwrap();
    let messages = eventually("both report Conflict", CONVERGE, || async {
        conflicts(&world, ["ml-research", "rogue"]).await
    })
    .await;
    assert_eq!(
        messages,
        [
            format!(
                "namespace {dev} is also claimed by rogue (it stays with ml-research, which had it)"
            ),
            format!(
                "namespace {dev} is also claimed by ml-research (it stays with ml-research, which had it)"
            ),
        ]
    );
    assert_eq!(world.templates("ml-research-dev").await.len(), 5);
    assert_eq!(world.quota_hard("ml-research-dev").await.unwrap(), quota);
    assert!(
        world
            .team_status("rogue")
            .await
            .unwrap()
            .namespaces
            .is_empty()
    );
    tgp.delete("rogue", &DeleteParams::default()).await.unwrap();
    eventually("resolved", CONVERGE, || async {
        let s = world.team_status("ml-research").await?;
        match condition(&s.conditions, "Conflict") {
            Some(c) if c.status == "False" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Two teams naming a namespace before it exists: when it comes, neither had it, and it
    // gets nothing until one lets go.
    for team in ["rogue-a", "rogue-b"] {
        tgp.create(&PostParams::default(), &naming(team, "contested"))
            .await
            .unwrap();
    }
    world.namespace("contested", None).await;
    let contested = world.ns("contested");
    let messages = eventually("both report Conflict", CONVERGE, || async {
        conflicts(&world, ["rogue-a", "rogue-b"]).await
    })
    .await;
    assert_eq!(
        messages[0],
        format!(
            "namespace {contested} is also claimed by rogue-b (it belongs to no team until the overlap is resolved)"
        )
    );
    assert!(world.quota_hard("contested").await.is_err());
    tgp.delete("rogue-b", &DeleteParams::default())
        .await
        .unwrap();
    eventually("contested is rogue-a's", CONVERGE, || async {
        let s = world.team_status("rogue-a").await?;
        let quota = world.quota_hard("contested").await;
        if s.namespaces[..] == [contested.clone()] && quota.is_ok() {
            Ok(())
        } else {
            Err(format!("{:?} {quota:?}", s.namespaces))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_and_deletions_of_managed_objects_are_undone() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let quotas: Api<ResourceQuota> =
        Api::namespaced(world.client.clone(), &world.ns("data-science"));
    let original = world.quota_hard("data-science").await.unwrap();
    let key = "a100-shared.teamgpu.io.deviceclass.resource.k8s.io/devices";
    quotas
        .patch(
            "teamgpu",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hard": {key: "99"}}})),
        )
        .await
        .unwrap();
    eventually("quota edit undone", CONVERGE, || async {
        let h = world.quota_hard("data-science").await?;
        if h == original {
            Ok(())
        } else {
            Err(format!("{h:?}"))
        }
    })
    .await;
    let templates: Api<ResourceClaimTemplate> =
        Api::namespaced(world.client.clone(), &world.ns("data-science"));
    templates
        .delete("a100-shared", &DeleteParams::default())
        .await
        .unwrap();
    eventually("template restored", CONVERGE, || async {
        templates
            .get_opt("a100-shared")
            .await
            .map_err(|e| e.to_string())?
            .map(drop)
            .ok_or("missing".to_owned())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_reported_and_other_policies_are_unaffected() {
    let Some(world) = World::new().await else {
        return;
    };
    let _operator = world.operator();
    world.install_samples().await;
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let bad_cel: GpuSharingPolicy = serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "broken"}, "spec": {"selector": {"cel": ["device.attributes['gpu.nvidia.com'].productName =="]}}})).unwrap();
    let nothing: GpuSharingPolicy = serde_json::from_value(
        json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "b200"}, "spec": {"selector": {"productNames": ["NVIDIA B200"]}}}),
    )
    .unwrap();
    let missing: TeamGpuPolicy = serde_json::from_value(json!({"apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": "robotics"}, "spec": {"namespaces": [world.ns("web")], "quotas": [{"sharingPolicy": "h100", "guaranteed": 2}]}})).unwrap();
    gsp.create(&PostParams::default(), &bad_cel).await.unwrap();
    gsp.create(&PostParams::default(), &nothing).await.unwrap();
    tgp.create(&PostParams::default(), &missing).await.unwrap();

    let sharing_condition = |name: &'static str, type_: &'static str| {
        let gsp = gsp.clone();
        async move {
            let s = gsp
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .ok_or("no status")?;
            condition(&s.conditions, type_)
                .cloned()
                .ok_or_else(|| format!("no {type_}"))
        }
    };
    let invalid = eventually("broken reports its selector", CONVERGE, || {
        sharing_condition("broken", "SelectorValid")
    })
    .await;
    assert_eq!(invalid.status, "False");
    assert!(
        invalid.message.contains("productName =="),
        "{}",
        invalid.message
    );
    let found = eventually("b200 reports no devices", CONVERGE, || {
        sharing_condition("b200", "DevicesFound")
    })
    .await;
    assert_eq!(found.status, "False");
    let robotics = eventually("robotics reports the missing policy", CONVERGE, || async {
        let s = world.team_status("robotics").await?;
        condition(&s.conditions, "SharingPoliciesResolved")
            .cloned()
            .ok_or("no condition".to_owned())
    })
    .await;
    assert_eq!(robotics.status, "False");
    assert!(robotics.message.contains("h100"), "{}", robotics.message);
    world.converged().await;
    let ready = world.team_status("ml-research").await.unwrap();
    assert_eq!(
        condition(&ready.conditions, "Ready").unwrap().status,
        "True"
    );
}
