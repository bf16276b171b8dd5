//! Departments delegated to their members, on the real API server: members write the teams
//! under their department (with the ClusterRole `config/rbac` ships, bound to their group),
//! within what the department guarantees; nobody else attaches a team to it; the top level
//! stays the admins'; a namespace another team has stays with it, whoever names it.

use super::*;

/// A TeamGpuPolicy `name` under `parent` (none: top level) with `guaranteed` and `limit`
/// a100-80gb, owning namespace `name` of the world.
fn team(
    world: &World,
    name: &str,
    parent: Option<&str>,
    guaranteed: u32,
    limit: u32,
) -> TeamGpuPolicy {
    serde_json::from_value(json!({
        "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
        "metadata": {"name": name},
        "spec": {"parent": parent, "namespaces": [world.ns(name)],
                 "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": guaranteed, "limit": limit}]}}))
    .unwrap()
}

impl World {
    /// Waits until department `name`'s status counts `devices` a100-80gb guaranteed by its
    /// members.
    async fn members_guarantee(&self, name: &str, devices: u32) {
        eventually(
            &format!("{name}'s members guarantee {devices}"),
            CONVERGE,
            || async {
                let status = self.team_status(name).await?;
                match status
                    .quotas
                    .iter()
                    .find(|q| q.sharing_policy == "a100-80gb")
                {
                    Some(q) if q.members_guaranteed == Some(devices) => Ok(()),
                    other => Err(format!("{:?}", other.map(|q| q.members_guaranteed))),
                }
            },
        )
        .await;
    }
}

/// Asserts that `result` is a refusal whose message says `because`.
fn refused_with<T>(result: Result<T, kube::Error>, because: &str) {
    let message = refusal(result).expect("refused");
    assert!(message.contains(because), "{message}");
}

/// Waits until `request` (a dry run) is refused with a message saying `because`. What admission
/// holds a member to comes from the department's status, which the API server's admission
/// reads from a cache a moment behind what a client reads.
async fn refused_once_seen<T, Fut>(what: &str, request: impl Fn() -> Fut, because: &str)
where
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    eventually(what, CONVERGE, || async {
        match refusal(request().await) {
            Some(message) if message.contains(because) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The message of a refused request, or `None` when it was admitted.
fn refusal<T>(result: Result<T, kube::Error>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => {
            println!("refused: {}", e.message);
            Some(e.message)
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn department_members_manage_its_teams_within_its_guarantee() {
    let Some(world) = World::new().await else {
        return;
    };
    let (operator_client, requests) = world.operator_client();
    let _operator = Operator::start(operator_client, world.config());
    world.install_samples().await;
    world.converged().await;
    let admin = Api::<TeamGpuPolicy>::all(world.client.clone());
    for (name, group, guaranteed, limit) in [
        ("research", "research-leads", 8, 12),
        ("production", "production-leads", 4, 4),
    ] {
        let department: TeamGpuPolicy = serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": name},
            "spec": {"department": true, "members": [{"kind": "Group", "name": group}],
                     "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": guaranteed, "limit": limit}]}}))
        .unwrap();
        admin
            .create(&PostParams::default(), &department)
            .await
            .unwrap();
        // The platform team's grant: the shipped ClusterRole, bound to the department's group.
        let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": world.ns(&format!("{group}-teams")), "labels": {"teamgpu.io/e2e": "true"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "teamgpu-department-member"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}))
        .unwrap();
        Api::all(world.client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    // alice leads research; mallory holds the same RBAC (a production lead) but no research
    // membership.
    let alice = Api::<TeamGpuPolicy>::all(world.as_user("alice", &["research-leads"]));
    let mallory = Api::<TeamGpuPolicy>::all(world.as_user("mallory", &["production-leads"]));
    let pp = PostParams::default();

    // The top level is the admins': refused once the operator's policy is in force (asked
    // without storing anything until then).
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let message = eventually("the top level is refused to alice", CONVERGE, || async {
        refusal(
            alice
                .create(&dry_run, &team(&world, "rogue", None, 1, 1))
                .await,
        )
        .ok_or_else(|| "admitted".to_owned())
    })
    .await;
    assert!(message.contains("top level"), "{message}");
    // Under another department: not hers.
    refused_with(
        alice
            .create(&pp, &team(&world, "sneaky", Some("production"), 1, 1))
            .await,
        "only members of department production",
    );

    // Within research's 8: admitted.
    alice
        .create(&pp, &team(&world, "vision", Some("research"), 5, 10))
        .await
        .unwrap();
    world.members_guarantee("research", 5).await;
    // Beyond it: refused, with the numbers.
    let speech = team(&world, "speech", Some("research"), 4, 4);
    refused_once_seen(
        "speech beyond research's guarantee",
        || alice.create(&dry_run, &speech),
        "a100-80gb: 4 asked, 3 left of 8",
    )
    .await;
    refused_with(
        alice
            .create(&pp, &team(&world, "speech", Some("research"), 3, 20))
            .await,
        "a100-80gb: limit 20",
    );
    alice
        .create(&pp, &team(&world, "speech", Some("research"), 3, 12))
        .await
        .unwrap();

    // A production lead with the same RBAC cannot touch research's teams.
    refused_with(
        mallory
            .create(&pp, &team(&world, "intruder", Some("research"), 1, 1))
            .await,
        "only members of department research",
    );
    refused_with(
        mallory.delete("vision", &DeleteParams::default()).await,
        "only members of department research",
    );
    // Nor can alice move a team of hers into production.
    let moved = json!({"spec": {"parent": "production"}});
    refused_with(
        alice
            .patch("speech", &PatchParams::default(), &Patch::Merge(&moved))
            .await,
        "only members of department production",
    );

    // Her own team she may delete.
    alice
        .delete("speech", &DeleteParams::default())
        .await
        .unwrap();

    // A team of hers naming a namespace another team has takes nothing: it stays inference's,
    // with its quota, and her team says why it got nothing there.
    let prod = world.ns("inference-prod");
    let owner_of_prod = || async {
        let quota = Api::<ResourceQuota>::namespaced(world.client.clone(), &prod)
            .get("teamgpu")
            .await
            .map_err(|e| e.to_string())?;
        let labels = quota.metadata.labels.unwrap_or_default();
        Ok::<_, String>((labels.get("teamgpu.io/owner").cloned(), quota.spec))
    };
    let before = owner_of_prod().await.unwrap();
    assert_eq!(before.0.as_deref(), Some("TeamGpuPolicy.inference"));
    world.members_guarantee("research", 5).await;
    let mut grabby = team(&world, "grabby", Some("research"), 1, 1);
    grabby.spec.namespaces = vec![prod.clone()];
    alice.create(&pp, &grabby).await.unwrap();
    let says = format!(
        "namespace {prod} is also claimed by inference (it stays with inference, which had it)"
    );
    eventually("grabby reports the conflict", CONVERGE, || async {
        let status = world.team_status("grabby").await?;
        match status.conditions.iter().find(|c| c.type_ == "Conflict") {
            Some(c) if c.message == says => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        owner_of_prod().await.unwrap(),
        before,
        "inference-prod's quota is unchanged"
    );
    assert!(
        world
            .team_status("grabby")
            .await
            .unwrap()
            .namespaces
            .is_empty()
    );
    alice
        .delete("grabby", &DeleteParams::default())
        .await
        .unwrap();

    // Amounts in memory count the whole slices they hold: research guarantees 80Gi of 10Gi
    // memory slices, so a member asking 90Gi is refused with the count in slices.
    let shares = world.ns("shares");
    world
        .sharing_policy(
            &shares,
            json!({"selector": {"productNames": ["NVIDIA H100 80GB HBM3"]},
                   "sharing": {"strategy": "MemorySlices", "memorySlices": {"size": "10Gi"}}}),
        )
        .await;
    let both = json!({"spec": {"quotas": [
        {"sharingPolicy": "a100-80gb", "guaranteed": 8, "limit": 12},
        {"sharingPolicy": shares, "guaranteed": "80Gi", "limit": "80Gi"}]}});
    admin
        .patch("research", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    eventually(
        "research's status says the slice size",
        CONVERGE,
        || async {
            let status = world.team_status("research").await?;
            let quota = status.quotas.iter().find(|q| q.sharing_policy == shares);
            match quota.and_then(|q| q.slice_size.as_deref()) {
                Some("10Gi") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let in_memory = |guaranteed: &str| -> TeamGpuPolicy {
        serde_json::from_value(json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "audio"},
            "spec": {"parent": "research", "namespaces": [world.ns("audio")],
                     "quotas": [{"sharingPolicy": shares, "guaranteed": guaranteed}]}}))
        .unwrap()
    };
    let audio = in_memory("90Gi");
    refused_once_seen(
        "90Gi beyond research's 80Gi",
        || alice.create(&dry_run, &audio),
        &format!("{shares}: 9 asked, 8 left of 8"),
    )
    .await;
    alice.create(&dry_run, &in_memory("80Gi")).await.unwrap();

    // Not even an admin lowers research below what its members guarantee while it refuses
    // overcommit; with overcommit: Warn the admin may, and status says what it costs.
    world.members_guarantee("research", 5).await;
    let lower = |overcommit: Option<&str>| {
        Patch::Merge(json!({"spec": {"overcommit": overcommit,
            "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 4, "limit": 12}]}}))
    };
    let dry_patch = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let lowered = lower(None);
    refused_once_seen(
        "research lowered below its members",
        || admin.patch("research", &dry_patch, &lowered),
        "a100-80gb: 4, its members guarantee 5",
    )
    .await;
    admin
        .patch("research", &PatchParams::default(), &lower(Some("Warn")))
        .await
        .unwrap();

    // Then the operator is quiet: what it stores (the department policies, the members'
    // guarantees in status) matches what the server holds.
    let settled = settled_writes(&requests).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        stored_writes(&requests) - settled,
        0,
        "{:?}",
        requests.snapshot()
    );
}
