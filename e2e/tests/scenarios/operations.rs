//! What an operator of teamgpu sees: the API calls are exactly what its RBAC grants, health,
//! metrics and the writes of a converge and of idle time.

use super::*;
use teamgpu_e2e::http::{free_local_addr, http_get};

/// The RBAC view of the requests a recorded client made: (API group, resource[/subresource],
/// verb), e.g. ("", "pods/eviction", "create") from the counters' ("create", "pods/eviction").
fn rbac_calls(requests: &Counters) -> BTreeSet<(String, String, String)> {
    requests
        .snapshot()
        .into_keys()
        .map(|(verb, resource)| {
            let (base, sub) = resource.split_once('/').unwrap_or((&resource, ""));
            let (plural, group) = base.split_once('.').unwrap_or((base, ""));
            let resource = if sub.is_empty() {
                plural.to_owned()
            } else {
                format!("{plural}/{sub}")
            };
            (group.to_owned(), resource, verb)
        })
        .collect()
}

/// The rules of `config/rbac`: (API groups, resources, verbs).
/// The rules `config/rbac` grants the operator's ServiceAccount: those of the roles its bindings
/// name (not, say, `teamgpu-viewer`, which is for people).
fn rbac_rules() -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    let docs = teamgpu_e2e::fixtures::rbac_manifests().unwrap();
    let bound: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| {
            d["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == teamgpu_e2e::cluster::OPERATOR_SERVICE_ACCOUNT
            })
        })
        .map(|d| {
            let role = &d["roleRef"];
            (
                role["kind"].as_str().unwrap_or_default().to_owned(),
                role["name"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut rules = Vec::new();
    for doc in docs.iter().filter(|d| {
        bound.contains(&(
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        ))
    }) {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            let strings = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            rules.push((strings("apiGroups"), strings("resources"), strings("verbs")));
        }
    }
    rules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_calls_exactly_what_its_rbac_grants() {
    let Some(world) = World::new().await else {
        return;
    };
    let (client, requests) = world.operator_client();
    // Everything the operator does: leader election, planning, applying, pruning, statuses,
    // events, pending demand and reclaim by eviction.
    let config = teamgpu::controller::Config {
        leader_elect: true,
        identity: "rbac".into(),
        ..world.config()
    };
    let operator = Operator::start(client, config);
    world.install_samples().await;
    world.converged().await;
    let tgp: Api<TeamGpuPolicy> = Api::all(world.client.clone());
    let patch = json!({"spec": {"reclaim": {"enabled": true, "gracePeriodSeconds": 0},
        "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 8}]}});
    tgp.patch(
        "data-science",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    let patch =
        json!({"spec": {"quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 32}]}});
    tgp.patch(
        "ml-research",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .unwrap();
    // ml-research borrows the whole 80GB pool while data-science is idle, in Jobs of two Pods
    // (whose budgets reclaim counts before it takes one back, by suspending it) ...
    let ml: Api<Job> = Api::namespaced(world.client.clone(), &world.ns("ml-research-train"));
    let mut started = 0;
    for i in 0..16 {
        let mut spec = gpu_pod("train", "a100-80gb").spec.unwrap();
        spec.restart_policy = Some("Never".into());
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": format!("pair-{i:02}")},
            "spec": {"parallelism": 2, "completions": 2, "template": {"spec": spec}}}))
        .unwrap();
        if ml.create(&PostParams::default(), &job).await.is_ok() {
            started += 1;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(started, 16);
    // ... until data-science wants its guarantee back, which takes an eviction.
    let ds: Api<Pod> = Api::namespaced(world.client.clone(), &world.ns("data-science"));
    for i in 0..4 {
        ds.create(
            &PostParams::default(),
            &gpu_pod(&format!("nb-{i}"), "a100-80gb"),
        )
        .await
        .unwrap();
    }
    eventually("an eviction happened", Duration::from_secs(20), || async {
        let budgets = requests.get("list", "poddisruptionbudgets.policy");
        let suspended = requests.get("patch", "jobs.batch");
        if requests.get("create", "pods/eviction") > 0 && budgets > 0 && suspended > 0 {
            Ok(())
        } else {
            Err(format!("{:?}", rbac_calls(&requests)))
        }
    })
    .await;
    world.label("ml-research-dev", None).await; // pruning: deletes
    eventually("pruned", CONVERGE, || async {
        if world.templates("ml-research-dev").await.is_empty() {
            Ok(())
        } else {
            Err("templates left".to_owned())
        }
    })
    .await;
    // A DeviceClass carrying teamgpu's label that no policy wants is pruned. (Deleting a policy
    // below need not show the operator's own delete: its DeviceClass may go to the garbage
    // collector first, when a pass re-applies the class between the orphaning and the policy's
    // removal reaching the cache.)
    let classes: Api<DeviceClass> = Api::all(world.client.clone());
    let stray: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "stray.teamgpu.io",
                     "labels": {"app.kubernetes.io/managed-by": "teamgpu"}},
        "spec": {}
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    eventually("the stray DeviceClass pruned", CONVERGE, || async {
        match classes.get_opt("stray.teamgpu.io").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Deleting every policy deletes every kind of generated object, admission policies included.
    // Orphaning keeps the garbage collector out of it: the operator's pruning does it all.
    for t in tgp.list(&Default::default()).await.unwrap().items {
        tgp.delete(&t.name_any(), &DeleteParams::orphan())
            .await
            .unwrap();
    }
    let gsp: Api<GpuSharingPolicy> = Api::all(world.client.clone());
    for p in gsp.list(&Default::default()).await.unwrap().items {
        gsp.delete(&p.name_any(), &DeleteParams::orphan())
            .await
            .unwrap();
    }
    eventually("everything generated is gone", CONVERGE, || async {
        let left = world.owned_objects().await?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    operator.stop().await;

    let rules = rbac_rules();
    let allowed = |(group, resource, verb): &(String, String, String)| {
        rules.iter().any(|(g, r, v)| {
            (g.contains(group) || g.iter().any(|x| x == "*"))
                && (r.contains(resource) || r.iter().any(|x| x == "*"))
                && (v.contains(verb) || v.iter().any(|x| x == "*"))
        })
    };
    // Every authenticated user may ask who it is (the `system:basic-user` ClusterRole): the
    // operator does, once at start, to exempt itself from its own admission policies.
    let granted_to_everyone = (
        "authentication.k8s.io".to_owned(),
        "selfsubjectreviews".to_owned(),
        "create".to_owned(),
    );
    let calls = rbac_calls(&requests);
    assert!(calls.contains(&granted_to_everyone), "{calls:?}");
    let denied: Vec<_> = calls
        .iter()
        .filter(|c| !allowed(c) && **c != granted_to_everyone)
        .collect();
    assert!(
        denied.is_empty(),
        "calls config/rbac does not grant: {denied:?}"
    );
    // And nothing granted goes unused (server-side apply's implicit `create` is the one grant a
    // PATCH needs without a POST).
    let mut unused = Vec::new();
    for (groups, resources, verbs) in &rules {
        for g in groups {
            for r in resources {
                for v in verbs {
                    let call = (g.clone(), r.clone(), v.clone());
                    let apply_create =
                        v == "create" && calls.contains(&(g.clone(), r.clone(), "patch".into()));
                    // A policy's `paramKind` and a binding's `paramRef.name` are authorized
                    // against `get` on the param kind.
                    let param_get = [("", "resourcequotas"), ("teamgpu.io", "teamgpupolicies")]
                        .contains(&(g.as_str(), r.as_str()))
                        && v == "get"
                        && calls.contains(&(
                            "admissionregistration.k8s.io".into(),
                            "validatingadmissionpolicybindings".into(),
                            "patch".into(),
                        ));
                    // Held so that the operator may grant it to members (RBAC escalation check).
                    let granted_on = g == "teamgpu.io" && r == "gpusharingpolicies" && v == "get";
                    if !calls.contains(&call) && !apply_create && !param_get && !granted_on {
                        unused.push(format!("{g}/{r}:{v}"));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "granted but never used: {unused:?}\nused: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_the_writes_of_a_converge_and_of_idle_time() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let (addr, health) = (free_local_addr(), free_local_addr());
    let (client, requests) = world.operator_client();
    let _operator = Operator::start(
        client,
        teamgpu::controller::Config {
            metrics_addr: addr,
            health_addr: Some(health),
            ..world.config()
        },
    );
    eventually("/healthz", CONVERGE, || async {
        let (code, _) = http_get(health, "/healthz").await?;
        if code == 200 {
            Ok(())
        } else {
            Err(code.to_string())
        }
    })
    .await;
    eventually("/readyz once the caches synced", CONVERGE, || async {
        let (code, body) = http_get(health, "/readyz").await?;
        if code == 200 {
            Ok(())
        } else {
            Err(format!("{code} {body}"))
        }
    })
    .await;
    world.converged().await;
    // The pass that wrote the last status may still be publishing its events: idle time starts
    // once the operator's writes have stopped for a while.
    let converged = settled_writes(&requests).await;
    let at_converge = requests.snapshot();
    let series = [
        r#"teamgpu_team_guaranteed_devices{team="ml-research",department="",sharing_policy="a100-80gb"} 8"#,
        r#"teamgpu_team_limit_devices{team="ml-research",department="",sharing_policy="a100-80gb"} 16"#,
        r#"teamgpu_sharing_policy_capacity_devices{sharing_policy="a100-80gb"} 32"#,
        "teamgpu_reconciles_total{controller=\"teamgpu\"}",
        "teamgpu_api_writes_total{kind=\"resourceclaimtemplate\",verb=\"apply\"}",
        "teamgpu_leader 1",
    ];
    eventually("/metrics has every series", CONVERGE, || async {
        let (code, body) = http_get(addr, "/metrics").await?;
        let missing: Vec<&str> = series
            .iter()
            .copied()
            .filter(|s| !body.contains(s))
            .collect();
        if code == 200 && missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{code}, lacking {missing:?} in:\n{body}"))
        }
    })
    .await;
    // Idle: nothing changes, so nothing is written (the restart scenario watches a minute), and
    // the reconciler sleeps.
    let reconciles = || async {
        let (_, body) = http_get(addr, "/metrics").await.unwrap();
        body.lines()
            .find_map(|l| l.strip_prefix("teamgpu_reconciles_total{controller=\"teamgpu\"} "))
            .and_then(|v| v.parse::<u64>().ok())
            .expect("teamgpu_reconciles_total")
    };
    // The watches are cluster-wide and the scenarios share the control plane: another world's
    // namespaces created meanwhile wake passes here too. A window of three is idle, unless the
    // operator wakes itself (a settled batch, a retry), which it then does in every window.
    let idle = Duration::from_secs(3);
    let mut idle_passes = Vec::new();
    for _ in 0..3 {
        let passes_before = reconciles().await;
        tokio::time::sleep(idle).await;
        idle_passes.push(reconciles().await - passes_before);
        if idle_passes.last() <= Some(&2) {
            break;
        }
    }
    assert!(
        idle_passes.last() <= Some(&2),
        "an idle operator makes no passes; it made {idle_passes:?} in windows of {idle:?}"
    );
    let now = requests.snapshot();
    let idle_writes = stored_writes(&requests) - converged;
    eprintln!(
        "converge: {converged} writes for {} objects and 5 statuses; idle {idle:?}: {idle_writes} writes",
        world.expected_objects().await.len(),
    );
    let by_verb = |from: &BTreeMap<(String, String), u64>, to: &BTreeMap<(String, String), u64>| {
        let mut out: BTreeMap<String, i64> = BTreeMap::new();
        for ((verb, _), n) in to {
            *out.entry(verb.clone()).or_insert(0) += *n as i64;
        }
        for ((verb, _), n) in from {
            *out.entry(verb.clone()).or_insert(0) -= *n as i64;
        }
        out.retain(|_, n| *n != 0);
        out
    };
    eprintln!(
        "requests by verb to converge: {:?}",
        by_verb(&BTreeMap::new(), &at_converge)
    );
    eprintln!(
        "requests by verb while idle for {idle:?}: {:?}",
        by_verb(&at_converge, &now)
    );
    let diff: Vec<_> = now
        .iter()
        .filter_map(|(k, v)| {
            let was = at_converge.get(k).copied().unwrap_or(0);
            (was != *v).then(|| format!("{} {}: {was} -> {v}", k.0, k.1))
        })
        .collect();
    assert_eq!(idle_writes, 0, "an idle operator writes nothing: {diff:?}");
}
