//! Devices that draw on shared counters, on the real control plane: one node's two A100-40GB
//! GPUs as the NVIDIA driver publishes them with dynamic MIG (a counter set per GPU; the full
//! GPU and 14 MIG placements per GPU drawing on it), a whole-GPU policy and a 1g-slice policy
//! over the same GPUs. The real scheduler allocates the slices; what teamgpu counts must be
//! what the allocator can still give.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::ListParams;

use super::*;

const FIXTURE: &str = include_str!(
    "../../../operator/testdata/nvidia-dra-driver-gpu/resourceslice/a100-dynamic-mig-node.teamgpu.yaml"
);

/// Publishes the fixture's slices on the cluster's first Node (one pool, one node, as the
/// driver does), labelled for the sandbox to delete.
pub(crate) async fn publish_mig_node(client: &Client) {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let node = nodes.items[0].name_any();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for doc in FIXTURE
        .split("\n---\n")
        .filter(|d| d.contains("kind: ResourceSlice"))
    {
        let mut slice: ResourceSlice = serde_saphyr::from_str(doc).unwrap();
        slice.spec.node_name = Some(node.clone());
        (slice.metadata.labels.get_or_insert_default())
            .insert(teamgpu_e2e::sandbox::E2E_LABEL.into(), "true".into());
        api.create(&PostParams::default(), &slice).await.unwrap();
    }
}

impl World {
    /// `name`'s `status.devices` and its SharedCounters condition, once it has them.
    pub(crate) async fn counted(&self, name: &str, devices: u32, shared: &str) {
        let gsp: Api<GpuSharingPolicy> = Api::all(self.client.clone());
        eventually(&format!("{name} counts {devices}"), CONVERGE, || async {
            let status =
                (gsp.get(name).await.map_err(|e| e.to_string())?.status).ok_or("no status")?;
            let condition =
                condition(&status.conditions, "SharedCounters").map(|c| c.status.clone());
            if status.devices == devices && condition.as_deref() == Some(shared) {
                Ok(())
            } else {
                Err(format!(
                    "{} devices, SharedCounters {condition:?}",
                    status.devices
                ))
            }
        })
        .await;
    }
}

/// The devices allocated to `ns`'s claims.
pub(crate) async fn allocated_devices(client: &Client, ns: &str) -> Vec<String> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    (claims.items.iter())
        .filter_map(|c| {
            c.status
                .as_ref()?
                .allocation
                .as_ref()?
                .devices
                .as_ref()?
                .results
                .as_ref()
        })
        .flatten()
        .map(|r| r.device.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_gpus_and_mig_slices_of_the_same_gpus_never_promise_a_gpu_twice() {
    let Some(world) = World::new().await else {
        return;
    };
    let client = world.client.clone();
    publish_mig_node(&client).await;
    for (name, selector) in [
        (
            "a100-40gb",
            json!({"deviceType": "gpu", "productNames": ["NVIDIA A100-SXM4-40GB"]}),
        ),
        (
            "mig-1g",
            json!({"deviceType": "mig", "migProfiles": ["1g.5gb"]}),
        ),
    ] {
        let spec = json!({"driver": "gpu.nvidia.com", "selector": selector,
                          "sharing": {"strategy": "Exclusive"}});
        world.sharing_policy(name, spec).await;
    }
    for (team, policy, guaranteed, limit) in [
        ("training", "a100-40gb", 1, 2),
        ("notebooks", "mig-1g", 7, 14),
    ] {
        let quota = json!({"sharingPolicy": policy, "guaranteed": guaranteed, "limit": limit});
        world.create_team(team, json!({"quotas": [quota]})).await;
    }
    let _operator = world.operator();

    // Alone, each policy would count both GPUs: 2 whole, or 14 slices. Together each GPU
    // counts for one: training's guarantee gets one, the notebooks' the other.
    world.counted("a100-40gb", 1, "True").await;
    world.counted("mig-1g", 7, "True").await;
    let hard = |ns: &'static str, class: &'static str, want: &'static str| {
        let world = &world;
        async move {
            eventually(
                &format!("{ns} may hold {want} of {class}"),
                CONVERGE,
                || async {
                    let hard = world.quota_hard(ns).await?;
                    let key = format!("{class}.teamgpu.io.deviceclass.resource.k8s.io/devices");
                    match hard.get(&key) {
                        Some(v) if v == want => Ok(()),
                        other => Err(format!("{key}: {other:?}")),
                    }
                },
            )
            .await;
        }
    };
    hard("training", "a100-40gb", "1").await;
    hard("notebooks", "mig-1g", "7").await;

    // The notebooks run 7 one-slice Pods: the scheduler allocates them on the GPUs' counters.
    let notebooks = world.ns("notebooks");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &notebooks);
    for i in 0..7 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("nb-{i}"), "mig-1g"),
        )
        .await
        .unwrap();
    }
    eventually("7 slices allocated", Duration::from_secs(60), || async {
        let n = allocated_devices(&client, &notebooks).await.len();
        if n == 7 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    let on: BTreeSet<String> = (allocated_devices(&client, &notebooks).await.iter())
        .map(|d| d.split("-mig-").next().unwrap().to_owned())
        .collect();
    // The allocator fills one GPU's 7 placements before the other's (it tries devices in
    // order); whatever it did, a GPU with a slice on it is no whole GPU any more.
    let whole_left = 2 - u32::try_from(on.len()).unwrap();
    world.counted("a100-40gb", whole_left, "True").await;

    // An eighth slice would take the GPU counted for training: quota refuses its claim.
    pods.create(&PostParams::default(), &gpu_pod("nb-7", "mig-1g"))
        .await
        .unwrap();
    // Training's guaranteed GPU can really be had: its Pod is bound to the free GPU.
    let training = world.ns("training");
    Api::<Pod>::namespaced(client.clone(), &training)
        .create(&PostParams::default(), &gpu_pod("train", "a100-40gb"))
        .await
        .unwrap();
    if whole_left == 1 {
        eventually(
            "training holds a whole GPU",
            Duration::from_secs(60),
            || async {
                let held = allocated_devices(&client, &training).await;
                match held.as_slice() {
                    [gpu] if !on.contains(gpu) && !gpu.contains("-mig-") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    let slices = allocated_devices(&client, &notebooks).await;
    assert_eq!(slices.len(), 7, "the notebooks hold {slices:?}");
}
