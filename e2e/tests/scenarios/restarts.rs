//! A restart, a converged restart and idle time write nothing; joins and deletions meet no
//! denied write; convergence through server faults; leader election.

use super::*;

/// Applies and creates the API server counted for what teamgpu writes (its generated kinds and
/// the policies' status), by (verb, resource), whoever sent them. Deletions are left out: the
/// namespace controller and the garbage collector delete these kinds too, when an earlier
/// scenario's namespaces terminate.
async fn server_writes_of_teamgpu_kinds(world: &World) -> BTreeMap<(String, String), u64> {
    const TEAMGPU_WRITES: [&str; 9] = [
        "clusterroles.rbac.authorization.k8s.io",
        "clusterrolebindings.rbac.authorization.k8s.io",
        "deviceclasses.resource.k8s.io",
        "resourceclaimtemplates.resource.k8s.io",
        "resourcequotas",
        "validatingadmissionpolicies.admissionregistration.k8s.io",
        "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        "teamgpupolicies.teamgpu.io/status",
        "gpusharingpolicies.teamgpu.io/status",
    ];
    world
        .cluster()
        .server_request_counts()
        .await
        .unwrap()
        .into_iter()
        .filter(|((verb, resource), _)| {
            ["patch", "create", "update"].contains(&verb.as_str())
                && TEAMGPU_WRITES.contains(&resource.as_str())
        })
        .collect()
}

/// How long the scenarios watch an idle operator: `TEAMGPU_E2E_IDLE_SECONDS`, a minute by default.
fn idle_time() -> Duration {
    Duration::from_secs(
        std::env::var("TEAMGPU_E2E_IDLE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_converges_and_a_converged_restart_and_an_idle_minute_write_nothing() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    // Killed while converging, at once.
    let first = world.operator();
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(first);
    let second = world.operator();
    world.converged().await;
    world.all_guarded().await;
    let expected = world.owned_objects().await.unwrap();
    assert_eq!(expected, world.expected_objects().await);
    second.stop().await;

    // A restart on the converged cluster, then idle time: the operator's client and the API
    // server's own counters (for what teamgpu writes, which no other client here writes) agree
    // that nothing is written.
    let server_before = server_writes_of_teamgpu_kinds(&world).await;
    let (client, requests) = world.operator_client();
    let restarted = Instant::now();
    let third = Operator::start(client, world.config());
    eventually(
        "the restarted operator lists the policies",
        CONVERGE,
        || async {
            if requests.get("list", "teamgpupolicies.teamgpu.io") > 0 {
                Ok(())
            } else {
                Err(format!("{:?}", requests.snapshot()))
            }
        },
    )
    .await;
    let idle = idle_time();
    tokio::time::sleep(idle).await;
    let server_after = server_writes_of_teamgpu_kinds(&world).await;
    eprintln!(
        "restart and {:?} idle: {} writes by the operator; API server: {:?} -> {:?}",
        restarted.elapsed(),
        stored_writes(&requests),
        server_before.values().sum::<u64>(),
        server_after.values().sum::<u64>(),
    );
    assert_eq!(
        stored_writes(&requests),
        0,
        "a restart on a converged cluster must not write: {:?}",
        requests.snapshot()
    );
    assert_eq!(
        server_after, server_before,
        "the API server counted applies of teamgpu's kinds"
    );
    assert_eq!(world.owned_objects().await.unwrap(), expected);
    third.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_team_and_deleting_a_team_meet_no_denied_write() {
    let Some((world, first)) = World::with_samples().await else {
        return;
    };
    first.stop().await;
    let (client, requests) = world.operator_client();
    let _operator = Operator::start(client, world.config());
    // A namespace joins a team: its templates are written right after its binding, before the
    // API server's admission has seen the binding.
    for name in ["join-a", "join-b", "join-c"] {
        world.namespace(name, Some("data-science")).await;
    }
    eventually(
        "the new namespaces get their templates",
        CONVERGE,
        || async {
            let mut counts = Vec::new();
            for name in ["join-a", "join-b", "join-c"] {
                counts.push(world.templates(name).await.len());
            }
            if counts == [5, 5, 5] {
                Ok(())
            } else {
                Err(format!("{counts:?}"))
            }
        },
    )
    .await;
    // The team is deleted in the foreground: it stays, with a deletionTimestamp, until the
    // garbage collector has deleted what it owns.
    Api::<TeamGpuPolicy>::all(world.client.clone())
        .delete("data-science", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("data-science's objects are gone", CONVERGE, || async {
        let ns = world.ns("join-a");
        let left: Vec<String> = world
            .owned_objects()
            .await?
            .into_iter()
            .filter(|o| o.contains(&format!("/{ns}/")) || o.contains("data-science"))
            // Outside every team now, the namespaces are guarded by a quota of 0.
            .filter(|o| !o.ends_with("/teamgpu-outside-teams"))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    let denied: Vec<String> = requests
        .errors()
        .into_iter()
        .filter(|e| e.starts_with("403") || e.starts_with("422"))
        .collect();
    assert!(
        denied.is_empty(),
        "the operator's writes were denied: {denied:?}"
    );
    eprintln!("answers to the operator: {:?}", requests.status_codes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_converges_through_server_errors_dropped_watches_and_gone_resource_versions() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let expected = world.expected_objects().await;
    // The operator talks to the API server through a proxy. For its first two seconds every
    // request fails with 500 (an API server that is not well yet: start-up must wait, not give
    // up); then 5% of its requests get 500 and 5% 429, every watch is cut after a second, and
    // 30% of watch resumptions get the 410 Expired event a compacted resourceVersion gets.
    let upstream = Client::try_from(world.operator.clone()).unwrap();
    let proxy = teamgpu_e2e::FaultProxy::start(
        upstream,
        teamgpu_e2e::Faults {
            rate_500: 1.0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let _operator = Operator::start(Client::try_from(proxy.config()).unwrap(), world.config());
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.set_faults(teamgpu_e2e::Faults {
        rate_500: 0.05,
        rate_429: 0.05,
        retry_after_secs: 1,
        watch_close_after: Some(Duration::from_secs(1)),
        rate_watch_gone: 0.3,
    });
    let started = Instant::now();
    eventually(
        "convergence under faults",
        Duration::from_secs(120),
        || async {
            let live = world.owned_objects().await?;
            if live == expected {
                Ok(())
            } else {
                Err(format!("{} of {} objects", live.len(), expected.len()))
            }
        },
    )
    .await;
    let injected = proxy.counters();
    eprintln!(
        "converged under faults in {:?}: {} requests forwarded, {} 500s, {} 429s, {} watches cut, {} 410s",
        started.elapsed(),
        injected.forwarded(),
        injected.injected_500(),
        injected.injected_429(),
        injected.watches_cut(),
        injected.watches_gone(),
    );
    assert!(injected.injected_500() + injected.injected_429() > 0);
    proxy.set_faults(teamgpu_e2e::Faults::default());
    // No duplicate and no orphan: exactly the expected objects, and every team reports Ready.
    assert_eq!(world.owned_objects().await.unwrap(), expected);
    world.converged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_a_killed_leader_is_replaced_quickly() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let replica = |name: &str| {
        Operator::start(
            world.operator_client().0,
            teamgpu::controller::Config {
                leader_elect: true,
                identity: name.into(),
                lease_duration: Duration::from_secs(6),
                ..world.config()
            },
        )
    };
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(world.client.clone(), OPERATOR_NAMESPACE);
    let lease_name = world.config().lease_name;
    let holder = || async {
        let lease = leases
            .get_opt(&lease_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no lease")?;
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .ok_or("no holder".to_owned())
    };
    let a = replica("replica-a");
    eventually("replica-a leads", CONVERGE, || async {
        let h = holder().await?;
        if h == "replica-a" { Ok(()) } else { Err(h) }
    })
    .await;
    let b = replica("replica-b");
    world.converged().await;
    assert_eq!(holder().await.unwrap(), "replica-a");

    // Kill the leader without letting it hand the lease back.
    drop(a);
    let killed = Instant::now();
    world.namespace("ml-late", Some("ml-research")).await;
    let took_lease = eventually(
        "replica-b takes the lease",
        Duration::from_secs(15),
        || async {
            let h = holder().await?;
            if h == "replica-b" {
                Ok(killed.elapsed())
            } else {
                Err(h)
            }
        },
    )
    .await;
    eprintln!("replica-b holds the lease {took_lease:?} after the crash");
    eventually(
        "replica-b takes over and reconciles",
        Duration::from_secs(15),
        || async {
            let h = holder().await?;
            let t = world.templates("ml-late").await;
            if h == "replica-b" && t.len() == 5 {
                Ok(())
            } else {
                Err(format!("holder {h}, templates {t:?}"))
            }
        },
    )
    .await;
    eprintln!("handover after a crash took {:?}", killed.elapsed());

    // A graceful stop hands the lease back at once.
    b.stop().await;
    let lease = leases.get(&lease_name).await.unwrap();
    let holder_after = lease.spec.and_then(|s| s.holder_identity);
    assert!(
        holder_after.is_none() || holder_after.as_deref() == Some(""),
        "{holder_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converge_in_batches_writes_every_object_once_then_nothing() {
    let Some(world) = World::new().await else {
        return;
    };
    world.install_samples().await;
    let expected = world.expected_objects().await;
    // Four object writes a batch: the samples' converge goes out in a dozen batches, each
    // after a pass over what the batch before did, as a first start at 1,000 namespaces does
    // with the default of 1,024.
    let (client, requests) = world.operator_client();
    let config = teamgpu::controller::Config {
        writes_per_batch: 4,
        ..world.config()
    };
    let operator = Operator::start(client, config);
    eventually("every object in place", CONVERGE, || async {
        let owned = world.owned_objects().await?;
        if owned == expected {
            Ok(())
        } else {
            Err(format!("{} of {}: {owned:?}", owned.len(), expected.len()))
        }
    })
    .await;
    world.converged().await;
    world.all_guarded().await;
    settled_writes(&requests).await;
    // Each object applied once, counted by the operator's client and by the API server.
    let object_resources: Vec<String> = (teamgpu::core::diff::Kind::ALL.iter())
        .map(|kind| {
            let resource = kind.api_resource();
            match resource.group.as_str() {
                "" => resource.plural,
                group => format!("{}.{group}", resource.plural),
            }
        })
        .collect();
    let applies: u64 = (object_resources.iter())
        .map(|resource| requests.get("patch", resource))
        .sum();
    assert_eq!(applies, expected.len() as u64, "{:?}", requests.snapshot());
    // Then nothing: an idle stretch writes nothing.
    let before = stored_writes(&requests);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        stored_writes(&requests),
        before,
        "{:?}",
        requests.snapshot()
    );
    operator.stop().await;
}
