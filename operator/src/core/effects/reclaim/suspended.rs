//! The `batch/v1` Jobs reclaim suspended instead of evicting their Pods
//! ([`super::workload::Workload::job`]), and when each is resumed: once its Pods and the claims
//! they held are gone. Not before: the quota counts those claims until they are deleted, and
//! the pass that sees them go writes the borrower's lowered quota before it resumes the Job
//! (objects come before resumes in a pass's effects), so the Job's new Pods cannot take back
//! the room its old ones left. Pure.

use std::collections::{BTreeMap, BTreeSet};

/// Resume a Job that reclaim suspended: `spec.suspend` false again, teamgpu's label off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    pub namespace: String,
    pub job: String,
}

/// What a suspended Job waits for.
#[derive(Debug, PartialEq, Eq)]
struct Leaving {
    pods: BTreeSet<String>,
    claims: BTreeSet<String>,
}

/// The Jobs suspended and not resumed yet, by (namespace, name).
#[derive(Debug, Default)]
pub struct SuspendedJobs(BTreeMap<(String, String), Leaving>);

impl SuspendedJobs {
    /// Job `job` of `namespace` was suspended; it is resumed once `pods` and `claims` (of its
    /// namespace) are gone.
    pub fn suspended(
        &mut self,
        (namespace, job): (String, String),
        pods: impl IntoIterator<Item = String>,
        claims: impl IntoIterator<Item = String>,
    ) {
        let leaving = Leaving {
            pods: pods.into_iter().collect(),
            claims: claims.into_iter().collect(),
        };
        self.0.insert((namespace, job), leaving);
    }

    /// The Jobs to resume now: none of their Pods (`pod_left`) nor claims (`claim_left`) is
    /// left. Each is asked for again in every pass until [`Self::resumed`] says it was.
    pub fn due(
        &self,
        pod_left: impl Fn(&str, &str) -> bool,
        claim_left: impl Fn(&str, &str) -> bool,
    ) -> Vec<Resume> {
        (self.0.iter())
            .filter(|((namespace, _), leaving)| {
                !leaving.pods.iter().any(|p| pod_left(namespace, p))
                    && !leaving.claims.iter().any(|c| claim_left(namespace, c))
            })
            .map(|((namespace, job), _)| Resume {
                namespace: namespace.clone(),
                job: job.clone(),
            })
            .collect()
    }

    /// Job `job` of `namespace` was resumed (or is gone).
    pub fn resumed(&mut self, namespace: &str, job: &str) {
        self.0.remove(&(namespace.to_owned(), job.to_owned()));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(job: &str) -> (String, String) {
        ("b".to_owned(), job.to_owned())
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_job_is_resumed_only_once_its_pods_and_their_claims_are_gone() {
        let mut jobs = SuspendedJobs::default();
        let pods = strings(&["train-0", "train-1"]);
        let claims = strings(&["train-0-gpu-x", "train-1-gpu-y"]);
        jobs.suspended(key("train"), pods, claims);
        let resume = [Resume {
            namespace: "b".into(),
            job: "train".into(),
        }];
        // The job controller has not acted yet: its Pods run.
        assert_eq!(jobs.due(|_, _| true, |_, _| true), []);
        // One Pod left, being deleted.
        assert_eq!(jobs.due(|_, p| p == "train-1", |_, _| true), []);
        // The Pods are gone; one claim is still counted by quota.
        assert_eq!(jobs.due(|_, _| false, |_, c| c == "train-0-gpu-x"), []);
        // Another namespace's claim of the same name does not hold it back.
        assert_eq!(jobs.due(|_, _| false, |ns, _| ns == "other"), resume);
        // Asked for again until it is resumed.
        assert_eq!(jobs.due(|_, _| false, |_, _| false), resume);
        jobs.resumed("b", "train");
        assert_eq!(jobs.due(|_, _| false, |_, _| false), []);
        assert!(jobs.is_empty());
    }
}
