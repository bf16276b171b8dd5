//! Prometheus metrics (`/metrics`, text format).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::core::effects::PolicyStatuses;
use crate::core::plan::Plan;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: &'static str,
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: &'static str,
    pub verb: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeamLabels {
    pub team: String,
    /// The department the team is planned in; empty at the top level.
    pub department: String,
    pub sharing_policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub sharing_policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    pub team: String,
}

/// A gauge of GPU-equivalents, which are fractions.
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// The team whose Pods are evicted.
    pub team: String,
    /// Why: `reclaim` (a team's guarantee), `queued` (removed before it started, so as not to
    /// take the room reclaim makes) or `move` (run again on another node, so that a waiting
    /// team's claim fits its node).
    pub reason: &'static str,
    pub sharing_policy: String,
    /// The team the devices go back to (for a move, the team the room is made for).
    pub for_team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub kind: &'static str,
    pub name: String,
    pub r#type: String,
}

/// Every metric teamgpu exports.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub reconcile_seconds: Family<ControllerLabels, Histogram>,
    pub writes: Family<WriteLabels, Counter>,
    pub guaranteed: Family<TeamLabels, Gauge>,
    pub limit: Family<TeamLabels, Gauge>,
    pub entitlement: Family<TeamLabels, Gauge>,
    pub requested: Family<TeamLabels, Gauge>,
    pub allocated: Family<TeamLabels, Gauge>,
    pub borrowed: Family<TeamLabels, Gauge>,
    pub pending: Family<TeamLabels, Gauge>,
    pub effective_guarantee: Family<TeamLabels, Gauge>,
    pub capacity: Family<PolicyLabels, Gauge>,
    pub entitlement_ge: Family<TeamLabels, FloatGauge>,
    pub allocated_ge: Family<TeamLabels, FloatGauge>,
    pub capacity_ge: Family<PolicyLabels, FloatGauge>,
    pub budget_in_use_ge: Family<BudgetLabels, FloatGauge>,
    pub used_outside_teams: Family<PolicyLabels, Gauge>,
    pub conditions: Family<ConditionLabels, Gauge>,
    pub evictions: Family<EvictionLabels, Counter>,
    pub evictions_refused: Family<EvictionLabels, Counter>,
    pub leader: Gauge,
}

/// `metric`, registered in `registry` as `name`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("teamgpu");
        let r = &mut registry;
        let histogram = || Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let reconcile_seconds = registered(
            r,
            "reconcile_duration_seconds",
            "Duration of a reconcile pass",
            Family::<ControllerLabels, Histogram>::new_with_constructor(histogram),
        );
        let build_info = registered(
            r,
            "build_info",
            "The running teamgpu version",
            Family::<BuildLabels, Gauge>::default(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let leader = registered(
            r,
            "leader",
            "1 when this replica holds the lease",
            Gauge::default(),
        );
        // A closure cannot be generic over the labels and the metric: a macro can.
        macro_rules! family {
            ($name:expr, $help:expr $(,)?) => {
                registered(r, $name, $help, Family::default())
            };
        }
        Self {
            reconciles: family!("reconciles", "Reconcile passes"),
            errors: family!(
                "reconcile_errors",
                "Failed API calls during reconcile, by error",
            ),
            reconcile_seconds,
            writes: family!("api_writes", "Writes to the API server, by kind and verb"),
            guaranteed: family!("team_guaranteed_devices", "Configured guarantee"),
            limit: family!("team_limit_devices", "Configured limit"),
            entitlement: family!("team_entitlement_devices", "Hard quota now"),
            requested: family!("team_requested_devices", "Devices requested by claims"),
            allocated: family!("team_allocated_devices", "Devices allocated to claims"),
            borrowed: family!(
                "team_borrowed_devices",
                "Entitlement above the effective guarantee",
            ),
            pending: family!("team_pending_devices", "Devices the team's Pods wait for"),
            effective_guarantee: family!(
                "team_effective_guarantee_devices",
                "Guarantee after scaling to the pool's capacity",
            ),
            capacity: family!("sharing_policy_capacity_devices", "Matching devices"),
            entitlement_ge: family!(
                "team_entitlement_gpu_equivalents",
                "Hard quota now, in GPU-equivalents",
            ),
            allocated_ge: family!(
                "team_allocated_gpu_equivalents",
                "Devices allocated to claims, in GPU-equivalents",
            ),
            capacity_ge: family!(
                "sharing_policy_capacity_gpu_equivalents",
                "Matching devices, in GPU-equivalents",
            ),
            budget_in_use_ge: family!(
                "team_budget_in_use_gpu_equivalents",
                "What a team with spec.budget uses of it, in GPU-equivalents",
            ),
            used_outside_teams: family!(
                "sharing_policy_used_outside_teams_devices",
                "Matching devices allocated through other DeviceClasses, outside every team",
            ),
            conditions: family!(
                "condition",
                "1 while the condition of a TeamGpuPolicy or GpuSharingPolicy is True, else 0",
            ),
            evictions: family!("evictions", "Pods evicted to give borrowed devices back"),
            evictions_refused: family!(
                "evictions_refused",
                "Evictions the API server refused (a PodDisruptionBudget) or that timed out",
            ),
            leader,
            registry,
        }
    }
}

impl Metrics {
    /// Publish the numbers of a plan, and the conditions of the `statuses` written from it
    /// (so `Ready` is 0 while a write is refused, as the status says); series of teams and
    /// policies that are gone disappear.
    pub fn observe(&self, plan: &Plan, statuses: &PolicyStatuses) {
        for family in [
            &self.guaranteed,
            &self.limit,
            &self.entitlement,
            &self.requested,
            &self.allocated,
            &self.borrowed,
            &self.pending,
            &self.effective_guarantee,
        ] {
            family.clear();
        }
        self.capacity.clear();
        self.used_outside_teams.clear();
        self.entitlement_ge.clear();
        self.allocated_ge.clear();
        self.capacity_ge.clear();
        self.budget_in_use_ge.clear();
        // GPU-equivalents as the status writes them (two decimals).
        let number = |text: &str| text.parse::<f64>().unwrap_or(0.0);
        self.conditions.clear();
        for team in &plan.teams {
            for q in &team.quotas {
                let labels = TeamLabels {
                    team: team.name.clone(),
                    department: team.department.clone().unwrap_or_default(),
                    sharing_policy: q.sharing_policy.clone(),
                };
                self.guaranteed
                    .get_or_create(&labels)
                    .set(q.guaranteed.into());
                self.limit.get_or_create(&labels).set(q.limit.into());
                self.entitlement
                    .get_or_create(&labels)
                    .set(q.entitlement.into());
                self.requested
                    .get_or_create(&labels)
                    .set(q.requested.into());
                self.allocated
                    .get_or_create(&labels)
                    .set(q.allocated.into());
                self.borrowed.get_or_create(&labels).set(q.borrowed.into());
                self.pending.get_or_create(&labels).set(q.pending.into());
                self.effective_guarantee
                    .get_or_create(&labels)
                    .set(q.effective_guarantee.into());
                if let Some(ge) = &q.gpu_equivalents {
                    (self.entitlement_ge.get_or_create(&labels)).set(number(&ge.entitlement));
                    (self.allocated_ge.get_or_create(&labels)).set(number(&ge.allocated));
                }
            }
            if let Some(budget) = &team.budget {
                let labels = BudgetLabels {
                    team: team.name.clone(),
                };
                (self.budget_in_use_ge.get_or_create(&labels)).set(number(&budget.in_use));
            }
        }
        for p in &plan.sharing_policies {
            self.capacity
                .get_or_create(&PolicyLabels {
                    sharing_policy: p.name.clone(),
                })
                .set(p.capacity.into());
            self.used_outside_teams
                .get_or_create(&PolicyLabels {
                    sharing_policy: p.name.clone(),
                })
                .set(p.used_outside_teams.into());
            if let Some(ge) = &p.gpu_equivalents {
                self.capacity_ge
                    .get_or_create(&PolicyLabels {
                        sharing_policy: p.name.clone(),
                    })
                    .set(number(&ge.devices));
            }
        }
        for (name, status) in &statuses.teams {
            self.observe_conditions("TeamGpuPolicy", name, &status.conditions);
        }
        for (name, status) in &statuses.sharing {
            self.observe_conditions("GpuSharingPolicy", name, &status.conditions);
        }
    }

    fn observe_conditions(&self, kind: &'static str, name: &str, conditions: &[Condition]) {
        for c in conditions {
            self.conditions
                .get_or_create(&ConditionLabels {
                    kind,
                    name: name.to_owned(),
                    r#type: c.type_.clone(),
                })
                .set(i64::from(c.status == "True"));
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::core::diff::{Kind, ObjectKey};
    use crate::core::effects::{FailedWrite, Failure, Refusals, applied_statuses};
    use crate::core::state::ClusterState;

    /// The metrics of the built-in example's plan and of the statuses written from it, with
    /// `refusals` of its objects.
    fn exported(state: &ClusterState, refusals: &mut Refusals) -> String {
        let plan = crate::core::plan::plan(state);
        let refused = refusals.of_policies(&plan);
        let now = Time(Timestamp::from_second(1_000).unwrap());
        let statuses =
            applied_statuses(&plan, &state.sharing_policies, &state.teams, &refused, &now);
        let metrics = Metrics::default();
        metrics.observe(&plan, &statuses);
        metrics.encode()
    }

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn a_plan_becomes_series_a_dashboard_and_alerts_can_read() {
        let state = crate::cli::example::state().unwrap();
        let text = exported(&state, &mut Refusals::default());
        for line in [
            "teamgpu_build_info{version=\"0.1.0\"} 1",
            "teamgpu_condition{kind=\"TeamGpuPolicy\",name=\"inference\",type=\"Ready\"} 1",
            "teamgpu_condition{kind=\"GpuSharingPolicy\",name=\"a100-80gb\",type=\"UsedOutsideTeams\"} 0",
            "teamgpu_sharing_policy_used_outside_teams_devices{sharing_policy=\"a100-80gb\"} 0",
            "teamgpu_team_effective_guarantee_devices{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 12",
            "teamgpu_team_pending_devices{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 0",
            // Whole GPUs: one GPU-equivalent each.
            "teamgpu_team_entitlement_gpu_equivalents{team=\"inference\",department=\"\",sharing_policy=\"a100-80gb\"} 16.0",
            "teamgpu_sharing_policy_capacity_gpu_equivalents{sharing_policy=\"a100-80gb\"} 32.0",
        ] {
            assert!(has(&text, line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_team_in_a_department_carries_it() {
        let mut state = crate::cli::example::state().unwrap();
        let department: crate::api::TeamGpuPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "teamgpu.io/v1alpha1", "kind": "TeamGpuPolicy",
            "metadata": {"name": "research"},
            "spec": {"department": true,
                     "quotas": [{"sharingPolicy": "a100-80gb", "guaranteed": 16, "limit": 32}]}
        }))
        .unwrap();
        for team in &mut state.teams {
            if team.metadata.name.as_deref() == Some("ml-research") {
                team.spec.parent = Some("research".into());
            }
        }
        state.teams.push(department);
        let text = exported(&state, &mut Refusals::default());
        let series =
            "teamgpu_team_guaranteed_devices{team=\"ml-research\",department=\"research\",";
        assert!(text.lines().any(|l| l.starts_with(series)), "{text}");
    }

    #[test]
    fn ready_is_0_while_a_write_of_the_team_is_refused_and_1_once_it_is_written() {
        let state = crate::cli::example::state().unwrap();
        let quota = ObjectKey {
            kind: Kind::ResourceQuota,
            namespace: Some("inference-prod".into()),
            name: "teamgpu".into(),
        };
        let mut refusals = Refusals::default();
        let denied = FailedWrite {
            key: quota.clone(),
            verb: "apply",
            message: "denied by a webhook".into(),
            failure: Failure::Refused,
        };
        refusals.record(&[denied], [], Timestamp::from_second(900).unwrap());
        let series = |team: &str, type_: &str| {
            format!("teamgpu_condition{{kind=\"TeamGpuPolicy\",name=\"{team}\",type=\"{type_}\"}}")
        };
        let refused = exported(&state, &mut refusals);
        for (line, why) in [
            (
                series("inference", "Ready") + " 0",
                "the refused team is not Ready",
            ),
            (
                series("inference", "Applied") + " 0",
                "its Applied condition is False",
            ),
            (
                series("ml-research", "Ready") + " 1",
                "another team is Ready",
            ),
        ] {
            assert!(has(&refused, &line), "{why}: no {line:?} in\n{refused}");
        }
        // The quota is written: Ready again, and no Applied condition to report.
        refusals.record(&[], [&quota], Timestamp::from_second(950).unwrap());
        let written = exported(&state, &mut refusals);
        let ready = series("inference", "Ready") + " 1";
        assert!(has(&written, &ready), "no {ready:?} in\n{written}");
        let applied = series("inference", "Applied");
        assert!(!written.contains(&applied), "{applied} in\n{written}");
    }
}
