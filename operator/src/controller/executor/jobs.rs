//! Reclaim takes a `batch/v1` Job's Pods back by suspending the Job for a moment, not by
//! evicting them. The job controller counts an evicted Pod as a failure: the Job's next Pods
//! wait its backoff (10 s, doubling per failure: 20 s after both Pods of a 2-Pod Job went), and
//! the failures spend its `backoffLimit`, so one eviction of a Job with more Pods than that (6
//! by default) fails it for good. A suspended Job's Pods are removed with no failure counted.
//! The engine resumes it once they and their claims are gone
//! ([`crate::core::effects::SuspendedJobs`]), and its new Pods wait for room like any other.
//!
//! A label marks the Jobs teamgpu suspended. An operator that stopped before it resumed one
//! resumes it when it leads again, once the job controller has suspended it
//! ([`Requests::resume_left_suspended`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::error::WriteError;
use super::requests::{Requests, bounded, merge_patch};
use super::{Outcome, WRITE_TIMEOUT};
use crate::core::effects::Taken;

/// On a Job teamgpu suspended and has not resumed yet.
const SUSPENDED_LABEL: &str = "teamgpu.io/suspended";
const SUSPENDED_VALUE: &str = "reclaim";

/// How long until a suspended Job is read again, at first (the job controller takes about
/// 0.1 s) and at most (while it does not act, say when it is down).
const FIRST_LOOK: Duration = Duration::from_millis(100);
const LAST_LOOK: Duration = Duration::from_secs(5);

impl Requests {
    /// Suspends Job `name` of `namespace`: [`Taken::Suspended`], for the engine to resume it
    /// once its Pods are gone; [`Taken::SuspendedAlready`] if someone else suspended it (its
    /// Pods are going, and it is not teamgpu's to resume). `None` if its Pods are to be evicted
    /// instead: the Job is gone, its `suspend` is another controller's ([`suspend_owned_by`]),
    /// or teamgpu may not patch Jobs.
    pub(super) async fn suspend_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Outcome>, WriteError> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let job = match bounded(WRITE_TIMEOUT, api.get_opt(name)).await {
            Ok(Some(job)) => job,
            Ok(None) => return Ok(None),
            Err(error) if error.code() == Some(403) => return Ok(None),
            Err(error) => return Err(error),
        };
        if let Some(owner) = suspend_owned_by(&job) {
            tracing::info!(job = %format!("{namespace}/{name}"), %owner,
                "the Job's suspend is not teamgpu's to set; evicting its Pods");
            return Ok(None);
        }
        if job.spec.as_ref().and_then(|s| s.suspend) == Some(true) {
            return Ok(Some(Outcome::Taken(Taken::SuspendedAlready)));
        }
        self.count_write("job", "suspend");
        let patch = json!({"metadata": {"labels": {SUSPENDED_LABEL: SUSPENDED_VALUE}},
                           "spec": {"suspend": true}});
        match merge_patch(&api, name, patch).await {
            Ok(_) => Ok(Some(Outcome::Taken(Taken::Suspended))),
            Err(error) if error.code() == Some(403) => {
                tracing::warn!(job = %format!("{namespace}/{name}"), %error,
                    "may not suspend the Job; evicting its Pods (it counts them as failed)");
                Ok(None)
            }
            Err(error) if error.code() == Some(404) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Resumes Job `name` of `namespace` and takes teamgpu's label off; a Job gone is done too.
    pub(super) async fn resume_job(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Outcome, WriteError> {
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        self.count_write("job", "resume");
        let patch = json!({"metadata": {"labels": {SUSPENDED_LABEL: null}},
                           "spec": {"suspend": false}});
        match merge_patch(&api, name, patch).await {
            Err(error) if error.code() == Some(404) => Ok(Outcome::Done),
            result => result,
        }
    }

    /// Resumes, each once its controller has suspended it, the Jobs teamgpu suspended and did
    /// not resume (the operator stopped in between). Tries again until it could list them.
    pub(super) async fn resume_left_suspended(self: &Arc<Self>) {
        let api: Api<Job> = Api::all(self.client.clone());
        let marked = ListParams::default().labels(&format!("{SUSPENDED_LABEL}={SUSPENDED_VALUE}"));
        let mut wait = LAST_LOOK;
        let jobs = loop {
            match bounded(WRITE_TIMEOUT, api.list(&marked)).await {
                Ok(jobs) => break jobs,
                Err(error) => {
                    tracing::warn!(%error, "could not list the Jobs teamgpu suspended; trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(300));
                }
            }
        };
        for job in jobs {
            let (Some(namespace), Some(name)) = (job.metadata.namespace, job.metadata.name) else {
                continue;
            };
            tokio::spawn(resume_when_suspended(self.clone(), namespace, name));
        }
    }
}

/// Waits until Job `name`'s controller has suspended it (its Pods are going), then resumes it;
/// stops early when the Job is gone or no longer carries [`SUSPENDED_LABEL`] (a person took
/// over).
async fn resume_when_suspended(requests: Arc<Requests>, namespace: String, name: String) {
    let api: Api<Job> = Api::namespaced(requests.client.clone(), &namespace);
    let mut wait = FIRST_LOOK;
    loop {
        match bounded(WRITE_TIMEOUT, api.get_opt(&name)).await {
            Ok(None) => return,
            Ok(Some(job)) if !marked(&job) => return,
            Ok(Some(job)) if suspended(&job) => {
                match requests.resume_job(&namespace, &name).await {
                    Ok(_) => {
                        tracing::info!(job = %name, "resumed the Job reclaim suspended");
                        return;
                    }
                    Err(error) => tracing::warn!(job = %name, %error, "could not resume; retrying"),
                }
            }
            Ok(Some(_)) => {}
            Err(error) => tracing::warn!(job = %name, %error, "could not read the Job to resume"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LAST_LOOK);
    }
}

/// Who else sets Job `job`'s `spec.suspend`, if anyone: teamgpu would fight them over it.
/// - its controller, unless a CronJob (which only creates Jobs): a JobSet suspends and resumes
///   its Jobs itself, and so do the operators of MPIJob, RayJob and the like;
/// - a controller other than the built-in job controller named in `spec.managedBy` (MultiKueue
///   and others): the built-in one would not act on `suspend`;
/// - Kueue, for a Job with its queue label (or the annotation older releases used): it admits a
///   Job by resuming it, and resumes one it admitted that someone else suspended.
///
/// A Job Kueue manages without that label (`manageJobsWithoutQueueName`) cannot be told from
/// others by the Job alone.
fn suspend_owned_by(job: &Job) -> Option<String> {
    const KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";
    let meta = &job.metadata;
    let controller = (meta.owner_references.iter().flatten())
        .find(|o| o.controller == Some(true) && o.kind != "CronJob");
    if let Some(owner) = controller {
        return Some(format!("{} {}", owner.kind, owner.name));
    }
    let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
    if let Some(manager) = managed_by.filter(|m| *m != "kubernetes.io/job-controller") {
        return Some(manager.to_owned());
    }
    let queued = meta
        .labels
        .iter()
        .flatten()
        .chain(meta.annotations.iter().flatten())
        .any(|(key, _)| key == KUEUE_QUEUE);
    queued.then(|| "Kueue".to_owned())
}

fn marked(job: &Job) -> bool {
    (job.metadata.labels.as_ref())
        .and_then(|l| l.get(SUSPENDED_LABEL))
        .map(String::as_str)
        == Some(SUSPENDED_VALUE)
}

/// The job controller has acted on `suspend`: it removed the active Pods and said so.
fn suspended(job: &Job) -> bool {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    (conditions.into_iter().flatten()).any(|c| c.type_ == "Suspended" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A Job shaped as `kubectl get job -o json` shows one (batch/v1, Kubernetes 1.36), with
    /// `metadata` and `spec` merged over a plain one.
    fn job(metadata: Value, spec: Value) -> Job {
        let mut object = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml", "labels": {"app": "train"}},
            "spec": {"parallelism": 2, "completions": 2, "suspend": false,
                     "template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "main", "image": "pause"}]}}}});
        for (part, extra) in [("metadata", metadata), ("spec", spec)] {
            let into = object[part].as_object_mut().unwrap();
            into.extend(extra.as_object().unwrap().clone());
        }
        serde_json::from_value(object).unwrap()
    }

    fn owner(kind: &str, name: &str) -> Value {
        json!([{"apiVersion": "x/v1", "kind": kind, "name": name, "uid": "u",
                "controller": true, "blockOwnerDeletion": true}])
    }

    #[test]
    fn a_job_is_suspended_by_teamgpu_only_where_nobody_else_sets_its_suspend() {
        let ours = |metadata, spec| suspend_owned_by(&job(metadata, spec));
        // Plain, from a CronJob, or naming the built-in controller: teamgpu's to suspend.
        assert_eq!(ours(json!({}), json!({})), None);
        let nightly = json!({"ownerReferences": owner("CronJob", "nightly")});
        assert_eq!(ours(nightly, json!({})), None);
        let built_in = json!({"managedBy": "kubernetes.io/job-controller"});
        assert_eq!(ours(json!({}), built_in), None);
        // Someone else's.
        let jobset = json!({"ownerReferences": owner("JobSet", "pretrain")});
        assert_eq!(ours(jobset, json!({})).as_deref(), Some("JobSet pretrain"));
        let multikueue = json!({"managedBy": "kueue.x-k8s.io/multikueue"});
        assert_eq!(
            ours(json!({}), multikueue).as_deref(),
            Some("kueue.x-k8s.io/multikueue")
        );
        let queued = json!({"labels": {"kueue.x-k8s.io/queue-name": "gpus"}});
        assert_eq!(ours(queued, json!({})).as_deref(), Some("Kueue"));
        let queued_before = json!({"annotations": {"kueue.x-k8s.io/queue-name": "gpus"}});
        assert_eq!(ours(queued_before, json!({})).as_deref(), Some("Kueue"));
        // An owner that is not the controller does not set `suspend`.
        let mut referenced = owner("Workflow", "wf");
        referenced[0]["controller"] = json!(false);
        assert_eq!(
            ours(json!({"ownerReferences": referenced}), json!({})),
            None
        );
    }
}
