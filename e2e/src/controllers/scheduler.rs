//! A simplified, honest DRA scheduler plus a simulated kubelet.
//!
//! For each Pending Pod without `spec.nodeName` whose claims all exist (template claims
//! recorded in `status.resourceClaimStatuses`), the scheduler tries the nodes named by
//! ResourceSlices (`spec.nodeName`, sorted) and picks the first on which every unallocated claim
//! of the Pod can be allocated; already allocated claims pin the node. A request is satisfied by
//! devices of slices on that node that (1) no other claim has allocated, (2) match every CEL
//! selector of the request's DeviceClass and of the request itself (evaluated by
//! `teamgpu::plan::device_cel`, kube-cel based; an evaluation error fails the allocation on that
//! node, as in the structured allocator),
//! honouring `allocationMode` ExactCount (`count`) and All, and `firstAvailable` (first
//! satisfiable subrequest; result request `<request>/<subrequest>`). The claim gets
//! `status.allocation` (results, config from class and claim, node selector) and `reservedFor`
//! the Pod; then the Pod is bound (`spec.nodeName`, `PodScheduled=True`). Pods without claims are
//! bound to the first node (or the configured default node).
//!
//! `adminAccess` requests may use devices other claims hold (results marked `adminAccess`), and
//! do not take them.
//!
//! Not implemented: constraints (`matchAttribute`), consumable capacity, counters
//! and partitionable devices, taints/tolerations, `allNodes`/`nodeSelector` slices, node
//! affinity, resources other than DRA devices, scoring, preemption.
//!
//! The simulated kubelet turns a bound Pending Pod into Running with `Ready=True`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::resource::v1::Device;
use serde_json::{Value, json};
use teamgpu::plan::device_cel::{CompiledSelectors, DeviceEnv};

use crate::core::{Core, WriteOptions, meta_str, now};
use crate::status::ApiError;

/// (driver, pool, device).
type DeviceId = (String, String, String);

/// (index of the claim, device results, device config).
type Allocation = (usize, Vec<Value>, Vec<Value>);

struct Candidate {
    id: DeviceId,
    env: DeviceEnv,
}

fn selectors(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    s.pointer("/cel/expression")
                        .and_then(Value::as_str)
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a device matches every selector. Compiled selectors are cached per expression list
/// (`CompiledSelectors` also memoises results per device model), so that retrying pending Pods
/// on every pass stays cheap.
fn matches(exprs: &[String], env: &DeviceEnv) -> Result<bool, ()> {
    if exprs.is_empty() {
        return Ok(true);
    }
    type Cache = Mutex<HashMap<Vec<String>, Option<Arc<CompiledSelectors>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let compiled = {
        let mut cache = CACHE
            .get_or_init(Cache::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if cache.len() > 4096 {
            cache.clear();
        }
        cache
            .entry(exprs.to_vec())
            .or_insert_with(|| CompiledSelectors::compile(exprs).ok().map(Arc::new))
            .clone()
    };
    // An invalid expression or an evaluation error fails the allocation, as in the
    // structured allocator (`isSelectable` returns the error).
    match compiled {
        Some(c) => c.matches(env).map_err(|_| ()),
        None => Err(()),
    }
}

/// Devices allocated to any claim.
fn allocated(claims: &[Value]) -> BTreeSet<DeviceId> {
    let mut out = BTreeSet::new();
    for c in claims {
        for r in c
            .pointer("/status/allocation/devices/results")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            // Admin access does not take the device from others.
            if r["adminAccess"] == json!(true) {
                continue;
            }
            out.insert((
                r["driver"].as_str().unwrap_or("").into(),
                r["pool"].as_str().unwrap_or("").into(),
                r["device"].as_str().unwrap_or("").into(),
            ));
        }
    }
    out
}

fn node_devices(slices: &[Value], node: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    for s in slices {
        if s.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
            continue;
        }
        let driver = s
            .pointer("/spec/driver")
            .and_then(Value::as_str)
            .unwrap_or("");
        let pool = s
            .pointer("/spec/pool/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        for d in s
            .pointer("/spec/devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Ok(dev) = serde_json::from_value::<Device>(d.clone()) else {
                continue;
            };
            out.push(Candidate {
                id: (driver.into(), pool.into(), dev.name.clone()),
                env: DeviceEnv::new(driver, &dev),
            });
        }
    }
    out
}

/// Tries to allocate one claim from `devices`, not using `taken`. Returns the results.
fn allocate(
    claim: &Value,
    devices: &[Candidate],
    taken: &mut BTreeSet<DeviceId>,
    classes: &HashMap<String, Value>,
) -> Option<(Vec<Value>, Vec<Value>)> {
    let mut results = Vec::new();
    let mut config = Vec::new();
    let mut used_classes = Vec::new();
    let pick = |req_name: &str,
                r: &Value,
                taken: &mut BTreeSet<DeviceId>,
                results: &mut Vec<Value>|
     -> Option<String> {
        let class_name = r["deviceClassName"].as_str()?;
        let class = classes.get(class_name)?;
        let mut exprs = selectors(class.pointer("/spec/selectors"));
        exprs.extend(selectors(r.get("selectors")));
        // An admin-access request may use devices allocated to other claims, and does not
        // take them (DRAAdminAccess).
        let admin = r["adminAccess"] == json!(true);
        let mut fits: Vec<&Candidate> = Vec::new();
        for d in devices.iter().filter(|d| admin || !taken.contains(&d.id)) {
            if matches(&exprs, &d.env).ok()? {
                fits.push(d);
            }
        }
        let chosen: Vec<&Candidate> = match r["allocationMode"].as_str().unwrap_or("ExactCount") {
            "All" => {
                if fits.is_empty() {
                    return None;
                }
                fits
            }
            _ => {
                let n = r["count"].as_u64().unwrap_or(1) as usize;
                if fits.len() < n {
                    return None;
                }
                fits.into_iter().take(n).collect()
            }
        };
        for d in chosen {
            let mut result =
                json!({"request": req_name, "driver": d.id.0, "pool": d.id.1, "device": d.id.2});
            if admin {
                result["adminAccess"] = json!(true);
            } else {
                taken.insert(d.id.clone());
            }
            results.push(result);
        }
        Some(class_name.to_string())
    };
    for req in claim
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = req["name"].as_str().unwrap_or("");
        if let Some(e) = req.get("exactly") {
            used_classes.push(pick(name, e, taken, &mut results)?);
        } else if let Some(subs) = req.get("firstAvailable").and_then(Value::as_array) {
            let mut ok = false;
            for sub in subs {
                let full = format!("{name}/{}", sub["name"].as_str().unwrap_or(""));
                let mut trial = taken.clone();
                let mut trial_results = Vec::new();
                if let Some(c) = pick(&full, sub, &mut trial, &mut trial_results) {
                    *taken = trial;
                    results.extend(trial_results);
                    used_classes.push(c);
                    ok = true;
                    break;
                }
            }
            if !ok {
                return None;
            }
        } else {
            return None;
        }
    }
    for c in used_classes {
        for cfg in classes[&c]
            .pointer("/spec/config")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let mut x = cfg.clone();
            x["source"] = json!("FromClass");
            x["requests"] = json!([]);
            config.push(x);
        }
    }
    for cfg in claim
        .pointer("/spec/devices/config")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut x = cfg.clone();
        x["source"] = json!("FromClaim");
        config.push(x);
    }
    Some((results, config))
}

/// Claims a Pod uses: Some(names) when all are known, None when a template claim is not yet
/// created.
fn pod_claims(pod: &Value) -> Option<Vec<String>> {
    let statuses = pod
        .pointer("/status/resourceClaimStatuses")
        .and_then(Value::as_array);
    let mut out = Vec::new();
    for pc in pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = pc["resourceClaimName"].as_str() {
            out.push(n.to_string());
        } else if pc.get("resourceClaimTemplateName").is_some() {
            let s = statuses?.iter().find(|s| s["name"] == pc["name"])?;
            if let Some(n) = s["resourceClaimName"].as_str() {
                out.push(n.to_string());
            }
        }
    }
    Some(out)
}

/// One scheduling pass.
pub fn reconcile(core: &Core, default_node: &str) {
    let pods: Vec<Value> = super::objects(core, "/pods")
        .into_iter()
        .filter(|p| {
            p.pointer("/spec/nodeName").is_none()
                && p.pointer("/metadata/deletionTimestamp").is_none()
                && p.pointer("/status/phase").and_then(Value::as_str) == Some("Pending")
        })
        .collect();
    if pods.is_empty() {
        return;
    }
    let crt = super::rt(core, "resource.k8s.io", "resourceclaims");
    for pod in pods {
        let Some(claim_names) = pod_claims(&pod) else {
            continue;
        };
        let ns = meta_str(&pod, "namespace").to_string();
        let st = core.lock();
        let slices: Vec<Value> = st
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "resource.k8s.io/resourceslices")
            .map(|(_, v)| v.clone())
            .collect();
        let classes: HashMap<String, Value> = st
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "resource.k8s.io/deviceclasses")
            .map(|(k, v)| (k.2.clone(), v.clone()))
            .collect();
        let all_claims: Vec<Value> = st
            .objects
            .iter()
            .filter(|(k, _)| k.0 == "resource.k8s.io/resourceclaims")
            .map(|(_, v)| v.clone())
            .collect();
        let mut claims = Vec::new();
        for n in &claim_names {
            match all_claims
                .iter()
                .find(|c| meta_str(c, "namespace") == ns && meta_str(c, "name") == n)
            {
                Some(c) => claims.push(c.clone()),
                None => break,
            }
        }
        if claims.len() != claim_names.len() {
            continue;
        }
        let mut nodes: Vec<String> = slices
            .iter()
            .filter_map(|s| {
                s.pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if nodes.is_empty() {
            nodes.push(default_node.to_string());
        }
        // Already-allocated claims pin the node.
        let pinned: Option<String> = claims.iter().find_map(|c| {
            c.pointer("/status/allocation/nodeSelector/nodeSelectorTerms/0/matchFields/0/values/0")
                .and_then(Value::as_str)
                .map(String::from)
        });
        let mut chosen: Option<(String, Vec<Allocation>)> = None;
        for node in nodes
            .iter()
            .filter(|n| pinned.as_ref().is_none_or(|p| p == *n))
        {
            let devices = node_devices(&slices, node);
            let mut taken = allocated(&all_claims);
            let mut allocs = Vec::new();
            let mut ok = true;
            for (i, c) in claims.iter().enumerate() {
                if c.pointer("/status/allocation").is_some() {
                    continue;
                }
                match allocate(c, &devices, &mut taken, &classes) {
                    Some((results, config)) => allocs.push((i, results, config)),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                chosen = Some((node.clone(), allocs));
                break;
            }
        }
        let Some((node, allocs)) = chosen else {
            continue;
        };
        let pod_ref = json!({"resource": "pods", "name": meta_str(&pod, "name"), "uid": meta_str(&pod, "uid")});
        for (i, results, config) in allocs {
            let mut c = claims[i].clone();
            c["status"]["allocation"] = json!({
                "devices": {"results": results, "config": config},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": now(),
            });
            claims[i] = c;
        }
        for c in claims.iter_mut() {
            let mut reserved = c
                .pointer("/status/reservedFor")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !reserved.iter().any(|r| r["uid"] == pod_ref["uid"]) {
                reserved.push(pod_ref.clone());
            }
            c["status"]["reservedFor"] = json!(reserved);
        }
        drop(st);
        // Claim status goes through the status subresource like the scheduler's own update:
        // validated, recorded in managedFields, and refused on a stale resourceVersion (the
        // Pod is then retried on the next pass).
        let opts = WriteOptions::manager("kube-scheduler");
        let mut ok = true;
        for c in &claims {
            if let Err(e) = core.update(
                &crt,
                &ns,
                meta_str(c, "name"),
                c.clone(),
                Some("status"),
                &opts,
            ) {
                tracing::debug!(
                    claim = meta_str(c, "name"),
                    "claim status update failed: {e}"
                );
                ok = false;
                break;
            }
        }
        if !ok {
            continue;
        }
        let _ = bind(core, &ns, meta_str(&pod, "name"), &node);
    }
}

/// POST pods/{name}/binding: sets `spec.nodeName` and `PodScheduled=True`.
pub fn bind(core: &Core, ns: &str, name: &str, node: &str) -> Result<(), ApiError> {
    let prt = super::rt(core, "", "pods");
    let mut st = core.lock();
    let mut pod = st
        .objects
        .get(&("/pods".to_string(), ns.to_string(), name.to_string()))
        .cloned()
        .ok_or_else(|| ApiError::not_found(prt.gr(), name))?;
    if let Some(n) = pod.pointer("/spec/nodeName").and_then(Value::as_str) {
        return Err(ApiError::conflict_msg(
            prt.gr(),
            name,
            &format!("pod {name} is already assigned to node \"{n}\""),
        ));
    }
    pod["spec"]["nodeName"] = json!(node);
    let mut conds: Vec<Value> = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "PodScheduled")
        .collect();
    conds.push(json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}));
    pod["status"]["conditions"] = json!(conds);
    core.put_unchecked(&mut st, &prt, pod);
    Ok(())
}

/// Simulated kubelet: bound Pending Pods become Running and Ready; a deleted (terminating) Pod
/// is removed once `termination` (capped at its grace period) has passed since the kubelet saw
/// it terminating, like the kubelet's final delete with grace period 0 (with finalizers left, it
/// stays until they are removed). `seen` remembers when each terminating Pod (by uid) was first
/// seen (deletionTimestamp has only second precision).
pub fn kubelet(
    core: &Core,
    termination: std::time::Duration,
    seen: &mut HashMap<String, std::time::Instant>,
) {
    let prt = super::rt(core, "", "pods");
    let mut st = core.lock();
    let terminating: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, p)| {
            k.0 == "/pods"
                && p.pointer("/spec/nodeName").is_some()
                && p.pointer("/metadata/deletionTimestamp").is_some()
                && p.pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    > 0
        })
        .map(|(_, v)| v.clone())
        .collect();
    seen.retain(|uid, _| terminating.iter().any(|p| meta_str(p, "uid") == uid));
    let mut removed_any = false;
    for p in terminating {
        let grace = p
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let wait = termination.min(std::time::Duration::from_secs(grace.max(0) as u64));
        let first = *seen
            .entry(meta_str(&p, "uid").to_string())
            .or_insert_with(std::time::Instant::now);
        if first.elapsed() < wait {
            continue;
        }
        let key = (
            "/pods".to_string(),
            meta_str(&p, "namespace").to_string(),
            meta_str(&p, "name").to_string(),
        );
        if crate::core::finalizers(&p).is_empty() {
            st.remove(&key);
        } else {
            let mut p = p;
            p["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            st.put(key, p);
        }
        removed_any = true;
    }
    if removed_any {
        drop(st);
        core.put_notify();
        st = core.lock();
    }
    let pending: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, p)| {
            k.0 == "/pods"
                && p.pointer("/spec/nodeName").is_some()
                && p.pointer("/status/phase").and_then(Value::as_str) == Some("Pending")
                && p.pointer("/metadata/deletionTimestamp").is_none()
        })
        .map(|(_, v)| v.clone())
        .collect();
    for mut p in pending {
        let t = now();
        p["status"]["phase"] = json!("Running");
        p["status"]["startTime"] = json!(t);
        let mut conds: Vec<Value> = p["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for ty in ["Initialized", "ContainersReady", "Ready"] {
            conds.retain(|c| c["type"] != ty);
            conds.push(json!({"type": ty, "status": "True", "lastTransitionTime": t}));
        }
        p["status"]["conditions"] = json!(conds);
        core.put_unchecked(&mut st, &prt, p);
    }
}
