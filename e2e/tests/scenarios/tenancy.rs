//! Tenancy: what a team member can and cannot do, on the real API server, as that member.

use teamgpu_e2e::control_plane::{ControlPlane, Paused};

use super::*;

fn as_user(world: &World, user: &str, groups: &[&str]) -> Client {
    world.as_user(user, groups)
}

/// Binds the ClusterRole `role` to `user` in namespace `ns` (a RoleBinding, as a platform team
/// gives a team member `edit` in the team's namespaces).
async fn grant_in(world: &World, ns: &str, user: &str, role: &str) {
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::namespaced(world.client.clone(), &world.ns(ns))
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Binds the ClusterRole `role` to `user` cluster-wide, once per world; `rules` (when given)
/// first create that ClusterRole.
async fn grant_cluster(world: &World, user: &str, role: &str, rules: Option<serde_json::Value>) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let params = PatchParams::apply("teamgpu-e2e").force();
    let labels = json!({"teamgpu.io/e2e": "true"});
    if let Some(rules) = rules {
        let cluster_role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role, "labels": labels}, "rules": rules});
        Api::<ClusterRole>::all(world.client.clone())
            .patch(role, &params, &Patch::Apply(&cluster_role))
            .await
            .unwrap();
    }
    let name = world.ns(&format!("{user}-{role}"));
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
    Api::<ClusterRoleBinding>::all(world.client.clone())
        .patch(&name, &params, &Patch::Apply(&binding))
        .await
        .unwrap();
}

/// A Pod whose container asks for `resources` as requests and limits (extended resources must
/// have both equal).
fn extended_pod(name: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": resources, "limits": resources}}]}
    }))
    .unwrap()
}

/// What became of one attempt: `Ok` when admitted, else the API server's status code and message.
type Outcome = Result<(), (u16, String)>;

fn outcome<T>(result: Result<T, kube::Error>) -> Outcome {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => Err((0, e.to_string())),
    }
}

/// The refusal of the quota of 0 that guards a namespace outside every team.
const OUTSIDE_QUOTA: &str = "exceeded quota: teamgpu-outside-teams";

/// Waits until admission applies the policies the operator wrote (bindings take effect a moment
/// after they are written): a dry run of `claim` in `ns` is refused with `says`.
async fn admission_denies(world: &World, ns: &str, claim: &ResourceClaim, says: &str) {
    let api: Api<ResourceClaim> = Api::namespaced(world.client.clone(), &world.ns(ns));
    eventually(&format!("admission in {ns} applies"), CONVERGE, || async {
        match outcome(
            api.create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                claim,
            )
            .await,
        ) {
            Err((_, message)) if message.contains(says) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_member_with_edit_cannot_escape_the_entitlement() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // alice is in ml-research (a100-80gb and a100-shared) and in inference (a100-80gb only),
    // with the built-in `edit` role in two of their namespaces and in the non-team `web`.
    for ns in ["ml-research-dev", "inference-prod", "web"] {
        grant_in(&world, ns, "alice", "edit").await;
    }
    let alice = as_user(&world, "alice", &[]);
    let (dev, prod, web) = (
        world.ns("ml-research-dev"),
        world.ns("inference-prod"),
        world.ns("web"),
    );
    admission_denies(
        &world,
        "ml-research-dev",
        &claim("probe", "gpu.nvidia.com", 1),
        "belongs to TeamGpuPolicy",
    )
    .await;
    // Converged, web's quota of 0 is in force: it refuses, not the non-team policy.
    admission_denies(
        &world,
        "web",
        &claim("probe", "gpu.nvidia.com", 1),
        OUTSIDE_QUOTA,
    )
    .await;

    let claims = |ns: &str| Api::<ResourceClaim>::namespaced(alice.clone(), ns);
    let templates = |ns: &str| Api::<ResourceClaimTemplate>::namespaced(alice.clone(), ns);
    let pods = |ns: &str| Api::<Pod>::namespaced(alice.clone(), ns);
    let pp = PostParams::default();
    let devices = |d: serde_json::Value| -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": "escape"}, "spec": {"devices": d}}))
            .unwrap()
    };
    let exactly = |class: &str, extra: serde_json::Value| {
        let mut e = json!({"deviceClassName": class});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"requests": [{"name": "gpu", "exactly": e}]})
    };
    let in_team = "belongs to TeamGpuPolicy";
    let outside = OUTSIDE_QUOTA;
    let forbidden = "forbidden: User \"alice\" cannot";

    // (attempt, what the refusal must say, outcome)
    let mut table: Vec<(&str, &str, Outcome)> = Vec::new();
    table.push((
        "the driver's class gpu.nvidia.com in a team namespace",
        in_team,
        outcome(
            claims(&dev)
                .create(&pp, &claim("e1", "gpu.nvidia.com", 1))
                .await,
        ),
    ));
    table.push((
        "a class of another team's sharing policy (a100-shared in inference)",
        in_team,
        outcome(
            claims(&prod)
                .create(&pp, &claim("e2", "a100-shared.teamgpu.io", 1))
                .await,
        ),
    ));
    table.push((
        "more devices than the quota (a100-80gb x 40)",
        "exceeded quota",
        outcome(
            claims(&dev)
                .create(&pp, &claim("e3", "a100-80gb.teamgpu.io", 40))
                .await,
        ),
    ));
    table.push((
        "firstAvailable hiding gpu.nvidia.com behind the team's class",
        in_team,
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(json!({"requests": [{"name": "gpu", "firstAvailable": [
                    {"name": "ok", "deviceClassName": "a100-80gb.teamgpu.io"},
                    {"name": "bad", "deviceClassName": "gpu.nvidia.com"}]}]})),
                )
                .await,
        ),
    ));
    table.push((
        "opaque driver config overriding the sharing strategy",
        "opaque device config is not allowed",
        outcome(
            claims(&dev)
                .create(&pp, &{
                    let mut d = exactly("a100-80gb.teamgpu.io", json!({}));
                    d["config"] = json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing"}}}}]);
                    devices(d)
                })
                .await,
        ),
    ));
    table.push((
        "adminAccess on the team's class",
        // The API server itself refuses it first unless the namespace carries
        // `resource.kubernetes.io/admin-access`, which `edit` cannot set; teamgpu's policy too.
        "adminAccess",
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(exactly(
                        "a100-80gb.teamgpu.io",
                        json!({"adminAccess": true}),
                    )),
                )
                .await,
        ),
    ));
    table.push((
        "allocationMode All on the team's class",
        "allocationMode All is not allowed",
        outcome(
            claims(&dev)
                .create(
                    &pp,
                    &devices(exactly(
                        "a100-80gb.teamgpu.io",
                        json!({"allocationMode": "All"}),
                    )),
                )
                .await,
        ),
    ));
    table.push((
        "the driver's MIG class mig.nvidia.com",
        in_team,
        outcome(
            claims(&dev)
                .create(&pp, &claim("e8", "mig.nvidia.com", 1))
                .await,
        ),
    ));
    table.push((
        "the member's own template naming gpu.nvidia.com",
        in_team,
        outcome(
            templates(&dev)
                .create(
                    &pp,
                    &serde_json::from_value(json!({"metadata": {"name": "mine"},
                        "spec": {"spec": {"devices": exactly("gpu.nvidia.com", json!({}))}}}))
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a Pod asking for nvidia.com/gpu (the driver class's extended resource)",
        "extended resource outside the team's quotas",
        outcome(
            pods(&dev)
                .create(&pp, &extended_pod("e10", json!({"nvidia.com/gpu": "1"})))
                .await,
        ),
    ));
    table.push((
        "a Pod asking for deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "extended resource outside the team's quotas",
        outcome(
            pods(&dev)
                .create(
                    &pp,
                    &extended_pod(
                        "e11",
                        json!({"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}),
                    ),
                )
                .await,
        ),
    ));
    table.push((
        "deleting the team's ResourceQuota",
        forbidden,
        outcome(
            Api::<ResourceQuota>::namespaced(alice.clone(), &dev)
                .delete("teamgpu", &DeleteParams::default())
                .await,
        ),
    ));
    table.push((
        "relabelling the namespace into another team",
        forbidden,
        outcome(
            Api::<Namespace>::all(alice.clone())
                .patch(
                    &dev,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"labels": {TEAM_LABEL: "inference"}}})),
                )
                .await,
        ),
    ));
    table.push((
        "creating a DeviceClass of her own",
        forbidden,
        outcome(
            Api::<DeviceClass>::all(alice.clone())
                .create(
                    &pp,
                    &serde_json::from_value(
                        json!({"metadata": {"name": "alice.example.com"}, "spec": {}}),
                    )
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a teamgpu class in a namespace outside every team",
        outside,
        outcome(
            claims(&web)
                .create(&pp, &claim("e15", "a100-80gb.teamgpu.io", 1))
                .await,
        ),
    ));
    table.push((
        "the driver's class gpu.nvidia.com outside every team",
        outside,
        outcome(
            claims(&web)
                .create(&pp, &claim("e16", "gpu.nvidia.com", 4))
                .await,
        ),
    ));
    // A template is admitted outside teams (quota charges claims, not templates): the claim
    // the resourceclaim controller makes from it is what is refused.
    table.push((
        "a claim with mig.nvidia.com in firstAvailable outside every team",
        outside,
        outcome(
            claims(&web)
                .create(
                    &pp,
                    &serde_json::from_value(json!({"metadata": {"name": "mine"},
                        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                            {"name": "nic", "deviceClassName": "nic.example.com"},
                            {"name": "mig", "deviceClassName": "mig.nvidia.com"}]}]}}}))
                    .unwrap(),
                )
                .await,
        ),
    ));
    table.push((
        "a Pod asking for nvidia.com/gpu outside every team",
        outside,
        outcome(
            pods(&web)
                .create(&pp, &extended_pod("e18", json!({"nvidia.com/gpu": "2"})))
                .await,
        ),
    ));
    table.push((
        "a Pod asking for deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io outside every team",
        outside,
        outcome(
            pods(&web)
                .create(&pp, &extended_pod("e19", json!({"deviceclass.resource.kubernetes.io/a100-80gb.teamgpu.io": "1"})))
                .await,
        ),
    ));
    table.push((
        "labelling web as exempt",
        forbidden,
        outcome(
            Api::<Namespace>::all(alice.clone())
                .patch(
                    &web,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
                )
                .await,
        ),
    ));
    println!("\n| # | escape attempt (as alice, `edit`) | result |\n|---|---|---|");
    for (i, (attempt, _, outcome)) in table.iter().enumerate() {
        let result = match outcome {
            Ok(()) => "**admitted**".to_owned(),
            Err((code, message)) => format!(
                "refused {code}: {}",
                message.chars().take(140).collect::<String>()
            ),
        };
        println!("| {} | {attempt} | {result} |", i + 1);
    }
    for (attempt, says, outcome) in &table {
        match outcome {
            Err((_, message)) => assert!(
                message.contains(says),
                "{attempt}: refused, but saying {message:?} instead of {says:?}"
            ),
            Ok(()) => panic!("{attempt}: admitted"),
        }
    }

    // What she may do still works: her team's class, other devices outside teams, and reading
    // her team's events and quota.
    claims(&dev)
        .create(&pp, &claim("fine", "a100-80gb.teamgpu.io", 1))
        .await
        .unwrap();
    claims(&web)
        .create(&pp, &claim("nic", "nic.example.com", 1))
        .await
        .unwrap();
    pods(&web)
        .create(
            &pp,
            &extended_pod("dongle", json!({"example.com/dongle": "1"})),
        )
        .await
        .unwrap();
    let quota = Api::<ResourceQuota>::namespaced(alice.clone(), &dev)
        .get("teamgpu")
        .await
        .unwrap();
    assert!(quota.spec.is_some());
    // Events about her team are recorded in her namespace, about its quota.
    let events = eventually("team events in ml-research-dev", CONVERGE, || async {
        let list = Api::<k8s_openapi::api::events::v1::Event>::namespaced(alice.clone(), &dev)
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let ours: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("QuotaChanged"))
            .collect();
        if ours.is_empty() {
            Err("no QuotaChanged event".to_owned())
        } else {
            Ok(ours)
        }
    })
    .await;
    let event = &events[0];
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("ResourceQuota"), Some("teamgpu"))
    );
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .starts_with("TeamGpuPolicy ml-research: "),
        "{event:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_members_move_namespaces_into_and_out_of_their_team() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    // ml-research's members: alice, and the group ml-leads. Both alice and bob may label
    // namespaces (a ClusterRole of their own), as in a cluster where teams self-serve.
    let patch = json!({"spec": {"members": [
        {"kind": "User", "name": "alice"}, {"kind": "Group", "name": "ml-leads"}]}});
    Api::<TeamGpuPolicy>::all(world.client.clone())
        .patch(
            "ml-research",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    for user in ["alice", "bob", "carol"] {
        grant_cluster(
            &world,
            user,
            "e2e-namespace-labeller",
            Some(json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "patch", "update"]}])),
        )
        .await;
    }
    let namespaces = |client: &Client| Api::<Namespace>::all(client.clone());
    let label =
        |team: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {TEAM_LABEL: team}}}));
    let alice = as_user(&world, "alice", &[]);
    let bob = as_user(&world, "bob", &[]);
    let carol = as_user(&world, "carol", &["ml-leads"]);
    world.namespace("ml-alice", None).await;
    world.namespace("ml-bob", None).await;
    let (ml_alice, ml_bob) = (world.ns("ml-alice"), world.ns("ml-bob"));
    let pp = PatchParams::default();

    // Admission has the policy with the new members once alice's dry run passes (the samples'
    // members did not name her, so until then she is refused too).
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("admission knows alice is a member", CONVERGE, || async {
        namespaces(&alice)
            .patch(&ml_alice, &dry, &label(Some("ml-research")))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
    // bob is no member: refused.
    let refused = eventually("bob is refused", CONVERGE, || async {
        match outcome(
            namespaces(&bob)
                .patch(&ml_bob, &pp, &label(Some("ml-research")))
                .await,
        ) {
            Err((code, message)) => Ok((code, message)),
            Ok(()) => {
                // Admitted before admission saw the policy: undo and try again.
                world.label("ml-bob", None).await;
                Err("admitted".to_owned())
            }
        }
    })
    .await;
    assert_eq!(refused.0, 403, "{refused:?}");
    assert!(
        refused.1.contains(
            "only members of TeamGpuPolicy ml-research (spec.members) or cluster admins may add a namespace to the team"
        ),
        "{refused:?}"
    );
    // alice (by name) and carol (by group) may.
    namespaces(&alice)
        .patch(&ml_alice, &pp, &label(Some("ml-research")))
        .await
        .unwrap();
    namespaces(&carol)
        .patch(&ml_bob, &pp, &label(Some("ml-research")))
        .await
        .unwrap();
    // An unrelated label on a team namespace is anyone's business.
    namespaces(&bob)
        .patch(
            &ml_alice,
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"cost-center": "42"}}})),
        )
        .await
        .unwrap();
    // Taking a namespace out, or over to another team, needs membership too.
    let left = outcome(namespaces(&bob).patch(&ml_alice, &pp, &label(None)).await);
    assert!(
        matches!(&left, Err((403, m)) if m.contains("may take a namespace out of the team")),
        "{left:?}"
    );
    let moved = outcome(
        namespaces(&alice)
            .patch(&ml_alice, &pp, &label(Some("inference")))
            .await,
    );
    assert!(
        matches!(&moved, Err((403, m)) if m.contains("only members of TeamGpuPolicy inference")),
        "{moved:?}"
    );
    namespaces(&alice)
        .patch(&ml_alice, &pp, &label(None))
        .await
        .unwrap();
    // The exemption is the admins' alone.
    let exempt = Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}}));
    let by_alice = outcome(namespaces(&alice).patch(&ml_alice, &pp, &exempt).await);
    assert!(
        matches!(&by_alice, Err((403, m)) if m.contains("only cluster admins may set or change the label teamgpu.io/exempt")),
        "{by_alice:?}"
    );
    // The guard label of a namespace outside teams is the operator's alone: set, it would
    // take the namespace out of the non-team policy.
    let guard = Patch::Merge(json!({"metadata": {"labels": {GUARD_LABEL: "0123456789abcdef"}}}));
    let by_alice = outcome(namespaces(&alice).patch(&ml_alice, &pp, &guard).await);
    assert!(
        matches!(&by_alice, Err((403, m)) if m.contains(&format!("only the teamgpu operator sets the label {GUARD_LABEL}"))),
        "{by_alice:?}"
    );
    namespaces(&world.client)
        .patch(&ml_alice, &pp, &exempt)
        .await
        .unwrap();

    // A member list naming an unknown kind is refused by the CRD, saying what is allowed.
    let robot = json!({"spec": {"members": [{"kind": "Robot", "name": "r2d2"}]}});
    let bad = outcome(
        Api::<TeamGpuPolicy>::all(world.client.clone())
            .patch("ml-research", &pp, &Patch::Merge(&robot))
            .await,
    );
    assert!(
        matches!(&bad, Err((422, m)) if m.contains("spec.members[0].kind: Unsupported value: \"Robot\"")
            && m.contains("\"User\", \"Group\", \"ServiceAccount\"")),
        "{bad:?}"
    );
    let sa = json!({"spec": {"members": [{"kind": "ServiceAccount", "name": "argocd"}]}});
    let bad = outcome(
        Api::<TeamGpuPolicy>::all(world.client.clone())
            .patch("ml-research", &pp, &Patch::Merge(&sa))
            .await,
    );
    assert!(
        matches!(&bad, Err((422, m)) if m.contains("namespace is required for a ServiceAccount member")),
        "{bad:?}"
    );

    // Members read their team's policy through `view`, which teamgpu-viewer is aggregated into.
    let read = outcome(
        Api::<TeamGpuPolicy>::all(bob.clone())
            .get("ml-research")
            .await,
    );
    assert!(matches!(&read, Err((403, _))), "{read:?}");
    grant_cluster(&world, "bob", "view", None).await;
    eventually(
        "bob reads TeamGpuPolicies through view",
        CONVERGE,
        || async {
            Api::<TeamGpuPolicy>::all(bob.clone())
                .get("ml-research")
                .await
                .map(drop)
                .map_err(|e| e.to_string())?;
            Api::<GpuSharingPolicy>::all(bob.clone())
                .list(&Default::default())
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_namespace_may_use_governed_devices_and_teams_see_them_used_outside() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let client = world.client.clone();
    world.namespace("monitoring", None).await;
    let monitoring = world.ns("monitoring");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &monitoring);
    let pp = PostParams::default();
    // New: refused by the non-team policy, or by its quota of 0 once that is in force.
    let probe = claim("probe", "gpu.nvidia.com", 1);
    eventually("admission in monitoring refuses", CONVERGE, || async {
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        match outcome(claims.create(&dry_run, &probe).await) {
            Err((403, message)) if teamgpu_e2e::refused_outside_teams(&message) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // An admin exempts the namespace; admission lets the driver's class through there.
    Api::<Namespace>::all(client.clone())
        .patch(
            &monitoring,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
        )
        .await
        .unwrap();
    let admitted = eventually(
        "the exempt namespace may claim gpu.nvidia.com",
        CONVERGE,
        || async {
            claims
                .create(&pp, &claim("dcgm", "gpu.nvidia.com", 2))
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    // Two A100-80GB devices (as the server lists them) are allocated to it, as the scheduler would.
    let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(client.clone())
        .list(&kube::api::ListParams::default().labels("teamgpu.io/e2e=true"))
        .await
        .unwrap();
    let a100: Vec<(String, String)> = slices
        .items
        .iter()
        .flat_map(|s| {
            s.spec.devices.iter().flatten().filter_map(move |d| {
                let product = d.attributes.as_ref()?.get("productName")?.string.clone()?;
                (product == "NVIDIA A100-SXM4-80GB")
                    .then(|| (s.spec.pool.name.clone(), d.name.clone()))
            })
        })
        .take(2)
        .collect();
    assert_eq!(a100.len(), 2);
    let status = json!({"status": {"allocation": {"devices": {"results": a100.iter().map(|(pool, device)| json!({
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": device})).collect::<Vec<_>>()}}}});
    claims
        .patch_status(
            &admitted.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();
    // The sharing policy says so, and the teams share 30 of its 32 devices.
    let policy = eventually(
        "a100-80gb reports devices used outside teams",
        CONVERGE,
        || async {
            let p = Api::<GpuSharingPolicy>::all(client.clone())
                .get("a100-80gb")
                .await
                .map_err(|e| e.to_string())?;
            let status = p.status.clone().ok_or("no status")?;
            if status.used_outside_teams == 2 {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await;
    assert_eq!(policy.devices, 32);
    let c = condition(&policy.conditions, "UsedOutsideTeams").unwrap();
    assert_eq!(c.status, "True");
    assert_eq!(
        c.message,
        format!(
            "2 of 32 matching devices are allocated through other DeviceClasses, to {monitoring}/dcgm: teams share the other 30"
        )
    );
    eventually("teams count 30 devices", CONVERGE, || async {
        let q = world.quota_status("inference", "a100-80gb").await?;
        if q.capacity == 30 {
            Ok(())
        } else {
            Err(format!("{q:?}"))
        }
    })
    .await;
    // Once the claim is gone, the devices are the teams' again.
    claims
        .delete("dcgm", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the condition clears", CONVERGE, || async {
        let p = Api::<GpuSharingPolicy>::all(client.clone())
            .get("a100-80gb")
            .await
            .map_err(|e| e.to_string())?;
        let status = p.status.ok_or("no status")?;
        let c = condition(&status.conditions, "UsedOutsideTeams").ok_or("no condition")?;
        if status.used_outside_teams == 0 && c.status == "False" {
            Ok(())
        } else {
            Err(format!("{c:?}"))
        }
    })
    .await;
}

/// A namespace outside every team is guarded by a quota of 0 that the operator labels it for
/// once in force; a value of the label the quota does not back is replaced; joining a team takes
/// both off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_outside_teams_is_guarded_by_a_quota_until_it_joins_a_team() {
    let Some((world, _operator)) = World::with_samples().await else {
        return;
    };
    let web = world.ns("web");
    let quotas = Api::<ResourceQuota>::namespaced(world.client.clone(), &web);
    let namespaces = Api::<Namespace>::all(world.client.clone());
    let guard_of = |ns: Namespace| ns.labels().get(GUARD_LABEL).cloned();
    // What the quota says, as the server stores it: 0 of the driver's class, by claim and by
    // its extended resource, and of teamgpu's.
    let quota = quotas.get("teamgpu-outside-teams").await.unwrap();
    let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
    for resource in [
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices",
        "requests.nvidia.com/gpu",
        "requests.deviceclass.resource.kubernetes.io/gpu.nvidia.com",
        "a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices",
    ] {
        assert_eq!(
            hard.get(resource).map(|q| q.0.as_str()),
            Some("0"),
            "{resource}"
        );
    }
    let label = guard_of(namespaces.get(&web).await.unwrap()).expect("web is guarded");

    // An admin puts a value on web's label that no quota backs: the operator sets its own
    // back, as web's quota is in force.
    let bogus = json!({"metadata": {"labels": {GUARD_LABEL: "0123456789abcdef"}}});
    namespaces
        .patch(&web, &PatchParams::default(), &Patch::Merge(&bogus))
        .await
        .unwrap();
    eventually(
        "web's guard label is the operator's again",
        CONVERGE,
        || async {
            let ns = namespaces.get(&web).await.map_err(|e| e.to_string())?;
            match guard_of(ns) {
                Some(value) if value == label => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // web joins ml-research: its quota of 0 and its label go, the team's quota comes, and a
    // claim of the team's class is admitted there.
    world.label("web", Some("ml-research")).await;
    let probe = claim("probe", "a100-80gb.teamgpu.io", 1);
    let claims = Api::<ResourceClaim>::namespaced(world.client.clone(), &web);
    eventually("web is a team namespace", CONVERGE, || async {
        let ns = namespaces.get(&web).await.map_err(|e| e.to_string())?;
        let zero = quotas
            .get_opt("teamgpu-outside-teams")
            .await
            .map_err(|e| e.to_string())?;
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let admitted = outcome(claims.create(&dry_run, &probe).await);
        match (guard_of(ns), zero, admitted) {
            (None, None, Ok(())) => Ok(()),
            (label, zero, admitted) => Err(format!(
                "label {label:?}, quota of 0 {}, probe {admitted:?}",
                zero.is_some()
            )),
        }
    })
    .await;
    world.quota_hard("web").await.expect("the team's quota");
}

/// The team policy's refusal of a claim whose class's hard is not counted yet.
const NOT_COUNTED: &str = "ResourceQuota teamgpu is not in force yet";

/// Stops kube-controller-manager while `change` has the operator write ml's quota of `hard`
/// (of `pcie`), and waits until it is written (and, if `refused`, until admission refuses a
/// claim for it). The controller-manager goes on when the result is dropped.
async fn uncounted(
    world: &World,
    plane: &ControlPlane,
    hard: u32,
    change: impl std::future::Future<Output = ()>,
    refused: bool,
) -> Paused {
    let paused = (plane.pause("kube-controller-manager")).expect("a controller-manager");
    change.await;
    world.hard_is("ml", "pcie", &hard.to_string()).await;
    if refused {
        let probe = claim("probe", "pcie.teamgpu.io", 1);
        admission_denies(world, "ml", &probe, NOT_COUNTED).await;
    }
    paused
}

/// Quota admission judges by a quota's `status.hard`, which kube-controller-manager fills in: a
/// quota it has not counted yet limits nothing (upstream: kubernetes/kubernetes#73698), and a
/// lowered one still allows the old hard. With the controller-manager stopped, as when it is
/// down or far behind:
/// - a namespace that has just joined a team has the team's quota and templates, and its claims
///   are refused, not admitted without limit; once counted, exactly the hard is admitted;
/// - a lowered hard refuses what the old one would have let in;
/// - a raised hard is not held back by teamgpu: quota admission judges by the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_until_kube_controller_manager_has_counted_the_quota() {
    let Some(world) = World::new().await else {
        return;
    };
    let Some(plane) = world.cluster().control_plane() else {
        eprintln!("skipped: stopping kube-controller-manager needs the harness's control plane");
        return;
    };
    let _operator = world.operator();
    world.pcie_policy().await;
    let quota =
        |n: u32| json!({"quotas": [{"sharingPolicy": "pcie", "guaranteed": n, "limit": n}]});
    let claims = Api::<ResourceClaim>::namespaced(world.client.clone(), &world.ns("ml"));
    let create = |name: &str| {
        let claims = claims.clone();
        let claim = claim(name, "pcie.teamgpu.io", 1);
        async move { outcome(claims.create(&PostParams::default(), &claim).await) }
    };
    let exceeded = "exceeded quota: teamgpu";
    let refused_with = |outcome: &Outcome, says: &str| matches!(outcome, Err((403, message)) if message.contains(says));

    // A new team namespace, its quota of 3 not counted: nothing is admitted.
    let paused = uncounted(&world, plane, 3, world.create_team("ml", quota(3)), true).await;
    for name in ["c0", "c1", "c2", "c3"] {
        let refused = create(name).await;
        assert!(refused_with(&refused, NOT_COUNTED), "{name}: {refused:?}");
    }
    drop(paused);
    let judged = |name: &'static str| async move {
        eventually(
            &format!("claim {name} is judged by the quota"),
            CONVERGE,
            || async {
                match create(name).await {
                    Err((_, message)) if message.contains(NOT_COUNTED) => Err(message),
                    judged => Ok(judged),
                }
            },
        )
        .await
    };
    assert_eq!(judged("c0").await, Ok(()));
    assert_eq!(judged("c1").await, Ok(()));
    // kube-controller-manager counts from its informers' cache, and the count it writes when it
    // goes on replaces what admission charged: were c0 or c1 not in its cache at the stop, they
    // would not be counted (a gap of quota itself). Its watch brings them in well under this.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Lowered to 2 while not counted: the old hard of 3 would admit a third claim.
    let paused = uncounted(&world, plane, 2, world.edit_team("ml", quota(2)), true).await;
    let refused = create("c2").await;
    assert!(refused_with(&refused, NOT_COUNTED), "{refused:?}");
    drop(paused);
    let refused = judged("c2").await;
    assert!(
        refused_with(&refused, exceeded),
        "{refused:?}; {}",
        teamgpu_e2e::quota_and_claims(&world.client, &world.ns("ml"), "teamgpu").await
    );

    // Raised to 3 again while not counted: teamgpu's policy holds nothing back (quota
    // admission judges by the old hard, as it would without teamgpu); once counted, the third
    // claim is admitted.
    let paused = uncounted(&world, plane, 3, world.edit_team("ml", quota(3)), false).await;
    let judged_now = create("c2").await;
    assert!(!refused_with(&judged_now, NOT_COUNTED), "{judged_now:?}");
    drop(paused);
    eventually("c2 is admitted under the raised hard", CONVERGE, || async {
        match create("c2").await {
            Ok(()) | Err((409, _)) => Ok(()),
            Err((_, message)) => Err(message),
        }
    })
    .await;
}
