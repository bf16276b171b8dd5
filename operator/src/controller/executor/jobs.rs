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

/// On a Job teamgpu suspended and has not resumed yet.
const SUSPENDED_LABEL: &str = "teamgpu.io/suspended";
const SUSPENDED_VALUE: &str = "reclaim";

/// How long until a suspended Job is read again, at first (the job controller takes about
/// 0.1 s) and at most (while it does not act, say when it is down).
const FIRST_LOOK: Duration = Duration::from_millis(100);
const LAST_LOOK: Duration = Duration::from_secs(5);

impl Requests {
    /// Suspends Job `name` of `namespace`: [`Outcome::Suspended`], for the engine to resume it
    /// once its Pods are gone; [`Outcome::Done`] if someone else suspended it already (its Pods
    /// are going, and it is not teamgpu's to resume). `None` if its Pods are to be evicted
    /// instead: the Job is gone, another controller manages it (a `suspend` it would undo), or
    /// teamgpu may not patch Jobs.
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
        let controlled = (job.metadata.owner_references.iter().flatten())
            .any(|o| o.controller == Some(true) && o.kind != "CronJob");
        if controlled {
            return Ok(None);
        }
        if job.spec.as_ref().and_then(|s| s.suspend) == Some(true) {
            return Ok(Some(Outcome::Done));
        }
        self.count_write("job", "suspend");
        let patch = json!({"metadata": {"labels": {SUSPENDED_LABEL: SUSPENDED_VALUE}},
                           "spec": {"suspend": true}});
        match merge_patch(&api, name, patch).await {
            Ok(_) => Ok(Some(Outcome::Suspended)),
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
