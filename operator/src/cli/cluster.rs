//! Reading a cluster for the command line (`teamgpu plan --live`, `teamgpu top`, `teamgpu
//! why`). Needs a client; only lists, never writes. What the operator reads from its watch caches
//! (`controller::Reconciler::snapshot`), read here with one list per kind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{DynamicObject, ListParams};
use kube::core::ApiResource;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use crate::api::{GpuSharingPolicy, TeamGpuPolicy};
use crate::core::diff::{Kind, ObjectKey};
use crate::core::plan::admission::{self, Enforcement};
use crate::core::plan::objects::{MANAGED_BY, MANAGED_BY_LABEL, QUOTA_NAME, is_managed};
use crate::core::plan::pending;
use crate::core::state::{ClusterState, NamespaceInfo, PendingDemand};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "the teamgpu CRDs are not installed in this cluster ({0}); install teamgpu with \
         `teamgpu manifests | kubectl apply --server-side -f -`"
    )]
    CrdsMissing(String),
    #[error("listing {what}: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("pod {namespace}/{name} not found")]
    PodNotFound { namespace: String, name: String },
    #[error("reading pod {namespace}/{name}: {source}")]
    GetPod {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("reading {what}: {source}")]
    Get {
        what: &'static str,
        source: kube::Error,
    },
}

/// The policies as the cluster has them, with their status.
#[derive(Debug, Default)]
pub struct Policies {
    pub sharing_policies: Vec<GpuSharingPolicy>,
    pub teams: Vec<TeamGpuPolicy>,
    /// Policies skipped: being deleted, or not readable as their type.
    pub notes: Vec<String>,
}

/// What `plan --live` reads.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The planner's input, as the operator would see it.
    pub state: ClusterState,
    /// Every object labelled `app.kubernetes.io/managed-by=teamgpu`, as listed (with
    /// `apiVersion` and `kind`, without `managedFields`).
    pub managed: BTreeMap<ObjectKey, Value>,
    pub notes: Vec<String>,
}

async fn list<K>(api: Api<K>, lp: &ListParams, what: &'static str) -> Result<Vec<K>, ReadError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(lp)
        .await
        .map(|l| l.items)
        .map_err(|source| ReadError::List { what, source })
}

/// A policy kind, read leniently: a policy that does not fit its type (written by a newer
/// version, say) is noted and skipped, as the operator does.
async fn policies_of<K>(
    client: &Client,
    what: &'static str,
    notes: &mut Vec<String>,
) -> Result<Vec<K>, ReadError>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let items = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(ReadError::CrdsMissing(status.message));
        }
        Err(source) => return Err(ReadError::List { what, source }),
    };
    let mut out = Vec::new();
    for object in items {
        let name = object.name_any();
        if object.metadata.deletion_timestamp.is_some() {
            notes.push(format!(
                "{} {name} is being deleted: left out",
                resource.kind
            ));
            continue;
        }
        match object.try_parse::<K>() {
            Ok(policy) => out.push(policy),
            Err(error) => notes.push(format!(
                "{} {name} cannot be read as a {}: left out ({error})",
                resource.kind, resource.kind
            )),
        }
    }
    Ok(out)
}

/// Both kinds of policy, with their status.
pub async fn policies(client: &Client) -> Result<Policies, ReadError> {
    let mut notes = Vec::new();
    let sharing_policies = policies_of(client, "GpuSharingPolicies", &mut notes).await?;
    let teams = policies_of(client, "TeamGpuPolicies", &mut notes).await?;
    Ok(Policies {
        sharing_policies,
        teams,
        notes,
    })
}

/// The object as listed, as [`crate::core::diff::writes`] compares it: items of a list carry no
/// `apiVersion` and `kind`, and `managedFields` says nothing the plan does.
fn listed_json(kind: Kind, object: &impl serde::Serialize) -> Option<Value> {
    let mut value = serde_json::to_value(object).ok()?;
    let resource = kind.api_resource();
    let fields = value.as_object_mut()?;
    fields.insert("apiVersion".into(), resource.api_version.into());
    fields.insert("kind".into(), resource.kind.into());
    if let Some(Value::Object(meta)) = fields.get_mut("metadata") {
        meta.remove("managedFields");
    }
    Some(value)
}

/// Everything the planner reads, and the objects teamgpu manages. `operator_user` and
/// `admin_groups` are the operator's (`None`: its defaults), as `teamgpu run` is started.
pub async fn read(
    client: &Client,
    operator_user: Option<String>,
    admin_groups: Option<Vec<String>>,
) -> Result<Snapshot, ReadError> {
    let Policies {
        sharing_policies,
        teams,
        mut notes,
    } = policies(client).await?;
    let all = ListParams::default();

    let namespaces = list(Api::<Namespace>::all(client.clone()), &all, "Namespaces")
        .await?
        .into_iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| {
            Arc::new(NamespaceInfo {
                name: n.name_any(),
                labels: n.labels().clone(),
            })
        })
        .collect();
    let device_classes: Vec<DeviceClass> =
        list(Api::all(client.clone()), &all, "DeviceClasses").await?;
    let slices: Vec<ResourceSlice> = list(Api::all(client.clone()), &all, "ResourceSlices").await?;
    let claims: Vec<ResourceClaim> = list(Api::all(client.clone()), &all, "ResourceClaims").await?;

    let device_taints = device_taints(client, &mut notes).await?;
    let (managed, templates) = managed_objects(client, &device_classes).await?;
    let pending = pending_demand(client, &templates, &claims).await?;
    if sharing_policies.is_empty() && teams.is_empty() {
        notes.push("the cluster has no GpuSharingPolicy and no TeamGpuPolicy".into());
    }
    Ok(Snapshot {
        state: ClusterState {
            sharing_policies,
            teams,
            namespaces,
            device_classes,
            slices,
            claims,
            pending,
            operator_user,
            admin_groups,
            // Listed as their types: a policy that does not fit fails the read with its error.
            unreadable_sharing_policies: Vec::new(),
            unreadable_teams: Vec::new(),
            enforcement: enforcement_of(&managed),
            // The CRDs as owners: the diff ignores what the plan leaves out.
            crd_owners: None,
            device_taints,
        },
        managed,
        notes,
    })
}

/// The taints on devices from outside their slices, as the operator reads them: the
/// DeviceTaintRules where the API server serves them, and the devices running Pods report
/// unhealthy (see [`crate::core::plan::taints`]).
async fn device_taints(
    client: &Client,
    notes: &mut Vec<String>,
) -> Result<Vec<crate::core::plan::inventory::ExtraTaint>, ReadError> {
    let mut rules = Vec::new();
    if let Some(resource) = crate::controller::taint_rules::served(client).await {
        let api = Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource);
        let listed = list_or_note(
            api,
            &ListParams::default(),
            "DeviceTaintRules",
            notes,
            || "DeviceTaintRules cannot be listed: devices they taint are counted".to_owned(),
        )
        .await?;
        rules.extend(
            (listed.into_iter().flatten()).filter_map(|r| crate::controller::taint_rules::view(&r)),
        );
    }
    let running = ListParams::default().fields("status.phase=Running");
    let pods = list_or_note(
        Api::<Pod>::all(client.clone()),
        &running,
        "Pods",
        notes,
        || "Pods cannot be listed: devices they report unhealthy are counted".to_owned(),
    )
    .await?;
    let unhealthy: Vec<_> = (pods.iter().flatten())
        .flat_map(crate::core::plan::taints::unhealthy)
        .collect();
    Ok(crate::core::plan::taints::device_taints(&rules, &unhealthy))
}

/// Every object teamgpu manages (the managed DeviceClasses of `device_classes`, the other kinds
/// listed by the managed-by label), as listed, and the ResourceClaimTemplates among them.
async fn managed_objects(
    client: &Client,
    device_classes: &[DeviceClass],
) -> Result<(BTreeMap<ObjectKey, Value>, Vec<ResourceClaimTemplate>), ReadError> {
    let managed_lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let mut managed = BTreeMap::new();
    let mut keep = |kind: Kind, value: Option<Value>| {
        if let Some(value) = value {
            let meta = &value["metadata"];
            let key = ObjectKey {
                kind,
                namespace: meta["namespace"].as_str().map(str::to_owned),
                name: meta["name"].as_str().unwrap_or_default().to_owned(),
            };
            managed.insert(key, value);
        }
    };
    for class in device_classes {
        if is_managed(class) {
            keep(Kind::DeviceClass, listed_json(Kind::DeviceClass, class));
        }
    }
    let mut templates: Vec<ResourceClaimTemplate> = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| *k != Kind::DeviceClass) {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
        let what = match kind {
            Kind::ValidatingAdmissionPolicy => "ValidatingAdmissionPolicies",
            Kind::ValidatingAdmissionPolicyBinding => "ValidatingAdmissionPolicyBindings",
            Kind::ResourceQuota => "ResourceQuotas",
            Kind::ClusterRole => "ClusterRoles",
            Kind::ClusterRoleBinding => "ClusterRoleBindings",
            _ => "ResourceClaimTemplates",
        };
        for object in list(api, &managed_lp, what).await? {
            keep(kind, listed_json(kind, &object));
            if kind == Kind::ResourceClaimTemplate
                && let Ok(template) = object.try_parse::<ResourceClaimTemplate>()
            {
                templates.push(template);
            }
        }
    }
    Ok((managed, templates))
}

/// Pending demand, as the operator counts it: Pods waiting, their claims (of `claims`), and the
/// templates teamgpu made in their namespaces (of `templates`).
async fn pending_demand(
    client: &Client,
    templates: &[ResourceClaimTemplate],
    claims: &[ResourceClaim],
) -> Result<Vec<PendingDemand>, ReadError> {
    let pods: Vec<Pod> = list(
        Api::all(client.clone()),
        &ListParams::default().fields("status.phase=Pending"),
        "pending Pods",
    )
    .await?;
    let waiting: BTreeSet<String> = pods.iter().filter_map(|p| p.namespace()).collect();
    let templates: Vec<&ResourceClaimTemplate> = templates
        .iter()
        .filter(|t| t.namespace().is_some_and(|ns| waiting.contains(&ns)))
        .collect();
    let mut names = crate::core::plan::usage::Names::default();
    let claim_views: Vec<crate::core::plan::usage::ClaimView> = claims
        .iter()
        .map(|c| crate::core::plan::usage::ClaimView::project(c, &mut names))
        .collect();
    let charges = pending::template_charges(&templates);
    let pods: Vec<pending::PendingPodView> =
        pods.iter().map(pending::PendingPodView::project).collect();
    Ok(pending::pending_demand(
        &pods.iter().collect::<Vec<_>>(),
        pending::by_name(&claim_views.iter().collect::<Vec<_>>()),
        |ns, name| charges.get(&(ns.to_owned(), name.to_owned())).cloned(),
    ))
}

/// The operator's enforcement mode, as its team binding shows it (`Deny` when there is none).
fn enforcement_of(managed: &BTreeMap<ObjectKey, Value>) -> Enforcement {
    let binding = managed.get(&ObjectKey {
        kind: Kind::ValidatingAdmissionPolicyBinding,
        namespace: None,
        name: admission::TEAM_BINDING_NAME.to_owned(),
    });
    let actions = binding.map(|b| b["spec"]["validationActions"].clone());
    [Enforcement::Warn, Enforcement::Audit]
        .into_iter()
        .find(|mode| actions == Some(serde_json::json!(mode.validation_actions())))
        .unwrap_or_default()
}

/// What `teamgpu why` reads.
#[derive(Debug, Default)]
pub struct WhyRead {
    pub facts: crate::cli::why::Facts,
    /// What could not be read (the reading user may not list everything), and policies skipped.
    pub notes: Vec<String>,
}

fn forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// `list`, or `None` with a note when the reading user may not list `what` there.
async fn list_or_note<K>(
    api: Api<K>,
    lp: &ListParams,
    what: &'static str,
    notes: &mut Vec<String>,
    missing: impl FnOnce() -> String,
) -> Result<Option<Vec<K>>, ReadError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(lp).await {
        Ok(list) => Ok(Some(list.items)),
        Err(error) if forbidden(&error) => {
            notes.push(missing());
            Ok(None)
        }
        Err(source) => Err(ReadError::List { what, source }),
    }
}

/// [`list_or_note`] in `namespace`; nothing when the reading user may not list there.
async fn list_in_or_note<K>(
    client: &Client,
    namespace: &str,
    lp: &ListParams,
    what: &'static str,
    notes: &mut Vec<String>,
    missing: impl FnOnce() -> String,
) -> Result<Vec<K>, ReadError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    Ok(list_or_note(api, lp, what, notes, missing)
        .await?
        .unwrap_or_default())
}

/// The facts for [`crate::cli::why::diagnose()`] of Pod `namespace/name`: the Pod, the policies, the
/// namespace's `teamgpu` ResourceQuota and the Events about the Pod; the claims, templates and
/// Pending Pods of the team's namespaces; and the claims of every namespace, for who holds what
/// (a user who may not list them all gets the policies' status instead, with a note).
pub async fn why_facts(client: &Client, namespace: &str, name: &str) -> Result<WhyRead, ReadError> {
    let pod = read_pod(client, namespace, name).await?;
    let Policies {
        sharing_policies,
        teams,
        mut notes,
    } = policies(client).await?;
    let every_claim = claims_of_every_namespace(client, &mut notes).await?;
    let claims_of_every_team = every_claim.is_some();
    let team = read_team_namespaces(
        client,
        &team_namespaces(&teams, namespace),
        !claims_of_every_team,
        &mut notes,
    )
    .await?;
    let mut claims = every_claim.unwrap_or_default();
    claims.extend(team.claims);
    let quota = read_quota(client, namespace, &mut notes).await?;
    let events = pod_events(client, namespace, name, &mut notes).await?;
    Ok(WhyRead {
        facts: crate::cli::why::Facts {
            pod,
            claims,
            claims_of_every_team,
            templates: team.templates,
            quota,
            events,
            teams,
            sharing_policies,
            team_pods: team.pending_pods,
        },
        notes,
    })
}

async fn read_pod(client: &Client, namespace: &str, name: &str) -> Result<Pod, ReadError> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| ReadError::GetPod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        })?
        .ok_or_else(|| ReadError::PodNotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
}

/// The namespaces of the team `namespace` belongs to, `namespace` first (alone: no team).
fn team_namespaces(teams: &[TeamGpuPolicy], namespace: &str) -> Vec<String> {
    let mut namespaces = vec![namespace.to_owned()];
    if let Some(team) = teams.iter().find(|t| {
        t.status
            .as_ref()
            .is_some_and(|s| s.namespaces.iter().any(|n| n == namespace))
    }) {
        let others = team.status.iter().flat_map(|s| s.namespaces.iter());
        namespaces.extend(others.filter(|n| *n != namespace).cloned());
    }
    namespaces
}

/// The ResourceClaims of every namespace, or `None` (with a note) if the user may not list them.
async fn claims_of_every_namespace(
    client: &Client,
    notes: &mut Vec<String>,
) -> Result<Option<Vec<ResourceClaim>>, ReadError> {
    list_or_note(
        Api::all(client.clone()),
        &ListParams::default(),
        "ResourceClaims",
        notes,
        || {
            "cannot list the ResourceClaims of every namespace: who holds how many devices is \
             what the TeamGpuPolicies' status says"
                .into()
        },
    )
    .await
}

/// What `teamgpu why` reads of the team's namespaces.
#[derive(Default)]
struct TeamNamespaces {
    /// Only when the claims of every namespace could not be listed.
    claims: Vec<ResourceClaim>,
    templates: Vec<ResourceClaimTemplate>,
    pending_pods: Vec<Pod>,
}

async fn read_team_namespaces(
    client: &Client,
    namespaces: &[String],
    with_claims: bool,
    notes: &mut Vec<String>,
) -> Result<TeamNamespaces, ReadError> {
    let all = ListParams::default();
    let pending = ListParams::default().fields("status.phase=Pending");
    let mut read = TeamNamespaces::default();
    for ns in namespaces {
        if with_claims {
            read.claims.extend(
                list_in_or_note(client, ns, &all, "ResourceClaims", notes, || {
                    format!("cannot list the ResourceClaims of namespace {ns}")
                })
                .await?,
            );
        }
        read.templates.extend(
            list_in_or_note(client, ns, &all, "ResourceClaimTemplates", notes, || {
                format!("cannot list the ResourceClaimTemplates of namespace {ns}")
            })
            .await?,
        );
        read.pending_pods.extend(
            list_in_or_note(client, ns, &pending, "pending Pods", notes, || {
                format!(
                    "cannot list the Pods of namespace {ns}: its place in the queue leaves them out"
                )
            })
            .await?,
        );
    }
    Ok(read)
}

/// The namespace's `teamgpu` ResourceQuota; `None` with a note if the user may not read it.
async fn read_quota(
    client: &Client,
    namespace: &str,
    notes: &mut Vec<String>,
) -> Result<Option<ResourceQuota>, ReadError> {
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
    match quotas.get_opt(QUOTA_NAME).await {
        Ok(quota) => Ok(quota),
        Err(error) if forbidden(&error) => {
            notes.push(format!(
                "cannot read ResourceQuota {namespace}/{QUOTA_NAME}"
            ));
            Ok(None)
        }
        Err(source) => Err(ReadError::Get {
            what: "the ResourceQuota",
            source,
        }),
    }
}

/// The Events about Pod `name`.
async fn pod_events(
    client: &Client,
    namespace: &str,
    name: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<Event>, ReadError> {
    let about_the_pod = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    list_in_or_note(client, namespace, &about_the_pod, "Events", notes, || {
        format!("cannot list the Events of namespace {namespace}")
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_object_gets_its_type_and_loses_managed_fields() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "teamgpu", "namespace": "a",
                         "managedFields": [{"manager": "teamgpu"}]},
            "spec": {"hard": {"x": "1"}}
        }))
        .unwrap();
        let value = listed_json(Kind::ResourceQuota, &object).unwrap();
        assert_eq!(value["apiVersion"], "v1");
        assert_eq!(value["kind"], "ResourceQuota");
        assert_eq!(value["spec"]["hard"]["x"], "1");
        assert!(value["metadata"].get("managedFields").is_none());
    }
}
