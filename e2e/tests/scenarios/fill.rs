//! The real scheduler as the judge of what teamgpu counts on partitionable devices: one node's
//! two A100-40GB GPUs with dynamic MIG (the fixture of `counters.rs`), three policies over the
//! same GPUs (whole GPUs, 3g.20gb and 1g.5gb slices) and no team, so nothing but the hardware
//! limits what the scheduler allocates. Claims in an exempt namespace are made through the
//! generated DeviceClasses until the scheduler refuses; then each policy's capacity must be
//! what the scheduler allocated of it. The expected numbers are the A100-40GB's MIG geometry
//! (NVIDIA's MIG user guide: 7 compute and 8 memory slices; 1g.5gb takes one of each, 3g.20gb
//! three and four, at placements 0 and 4 only), written here.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;

use super::counters::{allocated_devices, publish_mig_node};
use super::*;

const POLICIES: [(&str, &str); 3] = [
    ("a100-40gb", "gpu"),
    ("mig-3g", "3g.20gb"),
    ("mig-1g", "1g.5gb"),
];

/// A Pod that uses ResourceClaim `claim` (made by the test, not from a template).
fn claim_pod(name: &str, claim: &str) -> Pod {
    let mut pod = gpu_pod(name, "unused");
    let claims = pod.spec.as_mut().unwrap().resource_claims.as_mut().unwrap();
    claims[0].resource_claim_template_name = None;
    claims[0].resource_claim_name = Some(claim.to_owned());
    pod
}

/// What the scheduler decided for a Pod: its claim allocated, or the Pod unschedulable.
#[derive(Debug, PartialEq)]
enum Decision {
    Allocated,
    Refused,
}

struct Filler<'a> {
    world: &'a World,
    ns: String,
}

impl Filler<'_> {
    /// Creates a claim for `count` devices of `class` and a Pod that uses it, and waits for the
    /// scheduler's decision.
    async fn claim(&self, name: &str, class: &str, count: i64) -> Decision {
        let client = &self.world.client;
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &self.ns);
        // Admission takes a moment to see the namespace's exempt label.
        eventually(&format!("claim {name} admitted"), CONVERGE, || async {
            match claims
                .create(&PostParams::default(), &claim(name, class, count))
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.ns);
        pods.create(&PostParams::default(), &claim_pod(name, name))
            .await
            .unwrap();
        eventually(
            &format!("the scheduler decides {name}"),
            Duration::from_secs(60),
            || async {
                let claim = claims.get(name).await.map_err(|e| e.to_string())?;
                if claim.status.and_then(|s| s.allocation).is_some() {
                    return Ok(Decision::Allocated);
                }
                let pod = pods.get(name).await.map_err(|e| e.to_string())?;
                let unschedulable = (pod.status.and_then(|s| s.conditions).unwrap_or_default())
                    .iter()
                    .any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    });
                if unschedulable {
                    Ok(Decision::Refused)
                } else {
                    Err("pending".to_owned())
                }
            },
        )
        .await
    }

    /// The devices the scheduler allocated of each policy's class, in [`POLICIES`] order.
    async fn allocated(&self) -> [u32; 3] {
        let devices = allocated_devices(&self.world.client, &self.ns).await;
        POLICIES.map(|(_, profile)| {
            let of = |d: &&String| match profile {
                "gpu" => !d.contains("-mig-"),
                // The driver's device names drop the profile's dot: `gpu-0-mig-3g20gb-9-0`.
                p => d.contains(&format!("-mig-{}-", p.replace('.', ""))),
            };
            u32::try_from(devices.iter().filter(of).count()).unwrap()
        })
    }

    /// Deletes every Pod and claim of the namespace (no kubelet: at once) and waits until the
    /// claims are gone.
    async fn empty(&self) {
        let client = &self.world.client;
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let all = ListParams::default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.ns);
        pods.delete_collection(&now, &all).await.unwrap();
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &self.ns);
        claims.delete_collection(&now, &all).await.unwrap();
        eventually("the claims are gone", Duration::from_secs(60), || async {
            let left = claims
                .list(&all)
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        })
        .await;
    }

    /// Each policy's capacity as teamgpu reports it, once it is `expected` (in [`POLICIES`]
    /// order), with SharedCounters `contested` ("True": free counters that fit devices of
    /// several policies; "False": none).
    async fn counts(&self, expected: [u32; 3], contested: &str) {
        for ((policy, _), devices) in POLICIES.iter().zip(expected) {
            self.world.counted(policy, devices, contested).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filled_until_the_scheduler_refuses_each_policy_counts_what_it_allocated() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    publish_mig_node(&client).await;
    for (name, profile) in POLICIES {
        let selector = match profile {
            "gpu" => json!({"deviceType": "gpu", "productNames": ["NVIDIA A100-SXM4-40GB"]}),
            p => json!({"deviceType": "mig", "migProfiles": [p]}),
        };
        let spec = json!({"driver": "gpu.nvidia.com", "selector": selector,
                          "sharing": {"strategy": "Exclusive"}});
        world.sharing_policy(name, spec).await;
    }
    world.namespace("batch", None).await;
    let ns = world.ns("batch");
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"teamgpu.io/exempt": "true"}}})),
        )
        .await
        .unwrap();
    let _operator = world.operator();
    let fill = Filler { world: &world, ns };
    let class = |policy: &str| format!("{policy}.teamgpu.io");

    // Nothing allocated, no guarantee and no demand: each GPU could be cut any of the three
    // ways, so each is given whole to one policy, one by one in name order (docs/fair-sharing.md,
    // "Shared counters"), and together they never count more than the two GPUs.
    let idle = [1, 0, 7];
    fill.counts(idle, "True").await;

    // 1g slices, three at a time: four claims fit in 14 slices, the fifth does not; then two
    // single slices fill the GPUs and a third is refused.
    let mut decisions = Vec::new();
    for i in 0..5 {
        decisions.push(
            fill.claim(&format!("triple-{i}"), &class("mig-1g"), 3)
                .await,
        );
    }
    for i in 0..3 {
        decisions.push(
            fill.claim(&format!("single-{i}"), &class("mig-1g"), 1)
                .await,
        );
    }
    let refused = decisions
        .iter()
        .filter(|d| **d == Decision::Refused)
        .count();
    assert_eq!(refused, 2, "{decisions:?}");
    assert_eq!(fill.allocated().await, [0, 0, 14]);
    // Full: no free counters are left to contest.
    fill.counts([0, 0, 14], "False").await;

    // Released, the GPUs count as before.
    fill.empty().await;
    fill.counts(idle, "True").await;

    // A whole GPU, then 3g slices: the other GPU takes two, the third is refused.
    assert_eq!(
        fill.claim("whole", &class("a100-40gb"), 1).await,
        Decision::Allocated
    );
    let threes = [
        fill.claim("three-0", &class("mig-3g"), 1).await,
        fill.claim("three-1", &class("mig-3g"), 1).await,
        fill.claim("three-2", &class("mig-3g"), 1).await,
    ];
    use Decision::{Allocated, Refused};
    assert_eq!(threes, [Allocated, Allocated, Refused]);
    assert_eq!(fill.allocated().await, [1, 2, 0]);
    fill.counts([1, 2, 0], "False").await;
    fill.empty().await;
}
