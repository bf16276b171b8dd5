//! Prometheus metrics (`/metrics`, text format).

use std::hash::{Hash, Hasher};

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
    /// The gauges' rows as published last.
    published: std::sync::Mutex<Published>,
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
            published: std::sync::Mutex::default(),
        }
    }
}

/// What [`Metrics::observe`] publishes of a pass, borrowed from its plan and statuses.
struct Gauges<'p> {
    quotas: Vec<QuotaGauges<'p>>,
    /// (team, GPU-equivalents in use) of each team with a budget.
    budgets: Vec<(&'p str, &'p str)>,
    policies: Vec<PolicyGauges<'p>>,
    /// (kind, policy, condition type, whether True).
    conditions: Vec<(&'static str, &'p str, &'p str, bool)>,
}

struct QuotaGauges<'p> {
    team: &'p str,
    department: &'p str,
    sharing_policy: &'p str,
    /// In the order of [`Metrics::device_families`].
    devices: [u32; 8],
    /// GPU-equivalents (entitlement, allocated), as the status writes them.
    equivalents: Option<(&'p str, &'p str)>,
}

struct PolicyGauges<'p> {
    name: &'p str,
    capacity: u32,
    used_outside_teams: u32,
    capacity_equivalents: Option<&'p str>,
}

impl<'p> Gauges<'p> {
    fn of(plan: &'p Plan, statuses: &'p PolicyStatuses) -> Gauges<'p> {
        let quotas = (plan.teams.iter())
            .flat_map(|team| team.quotas.iter().map(move |q| (team, q)))
            .map(|(team, q)| QuotaGauges {
                team: &team.name,
                department: team.department.as_deref().unwrap_or_default(),
                sharing_policy: &q.sharing_policy,
                devices: [
                    q.guaranteed,
                    q.limit,
                    q.entitlement,
                    q.requested,
                    q.allocated,
                    q.borrowed,
                    q.pending,
                    q.effective_guarantee,
                ],
                equivalents: (q.gpu_equivalents.as_ref())
                    .map(|ge| (ge.entitlement.as_str(), ge.allocated.as_str())),
            })
            .collect();
        let budgets = (plan.teams.iter())
            .filter_map(|t| Some((t.name.as_str(), t.budget.as_ref()?.in_use.as_str())))
            .collect();
        let policies = (plan.sharing_policies.iter())
            .map(|p| PolicyGauges {
                name: &p.name,
                capacity: p.capacity,
                used_outside_teams: p.used_outside_teams,
                capacity_equivalents: p.gpu_equivalents.as_ref().map(|ge| ge.devices.as_str()),
            })
            .collect();
        let conditions = |kind: &'static str, name: &'p str, conditions: &'p [Condition]| {
            (conditions.iter()).map(move |c| (kind, name, c.type_.as_str(), c.status == "True"))
        };
        let teams = (statuses.teams.iter())
            .flat_map(|(name, s)| conditions("TeamGpuPolicy", name, &s.conditions));
        let sharing = (statuses.sharing.iter())
            .flat_map(|(name, s)| conditions("GpuSharingPolicy", name, &s.conditions));
        Gauges {
            quotas,
            budgets,
            policies,
            conditions: teams.chain(sharing).collect(),
        }
    }
}

/// Per row of a kind of gauges, as published last: the hashes of its labels and of its values.
type Rows = Vec<(u64, u64)>;

/// The rows of each kind of gauges as published last (see [`republish`]).
#[derive(Debug, Default)]
struct Published {
    quotas: Rows,
    budgets: Rows,
    policies: Rows,
    conditions: Rows,
}

fn hashed(value: impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Publishes `rows` through `set`, given what was published `last`: when they are the same rows
/// (labels) in the same order, as from one pass to the next but for a team or policy added or
/// gone, only those whose values changed; otherwise every row, after `clear`.
fn republish<R>(
    last: &mut Rows,
    rows: &[R],
    labels_and_values: impl Fn(&R) -> (u64, u64),
    clear: impl FnOnce(),
    set: impl Fn(&R),
) {
    let now: Rows = rows.iter().map(labels_and_values).collect();
    let same_rows = now.len() == last.len() && now.iter().zip(&*last).all(|(n, l)| n.0 == l.0);
    if same_rows {
        for ((row, new), old) in rows.iter().zip(&now).zip(&*last) {
            if new.1 != old.1 {
                set(row);
            }
        }
    } else {
        clear();
        rows.iter().for_each(set);
    }
    *last = now;
}

impl Metrics {
    /// Publish the numbers of a plan, and the conditions of the `statuses` written from it
    /// (so `Ready` is 0 while a write is refused, as the status says); series of teams and
    /// policies that are gone disappear. Only the series whose values changed are set: making
    /// every series again on every pass took a tenth of the operator's CPU at 1,000 namespaces.
    pub fn observe(&self, plan: &Plan, statuses: &PolicyStatuses) {
        let gauges = Gauges::of(plan, statuses);
        let mut last = (self.published)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // GPU-equivalents as the status writes them (two decimals).
        let number = |text: &str| text.parse::<f64>().unwrap_or(0.0);
        republish(
            &mut last.quotas,
            &gauges.quotas,
            |q| {
                let labels = hashed((q.team, q.department, q.sharing_policy));
                (labels, hashed((q.devices, q.equivalents)))
            },
            || {
                for family in self.device_families() {
                    family.clear();
                }
                self.entitlement_ge.clear();
                self.allocated_ge.clear();
            },
            |q| {
                let labels = TeamLabels {
                    team: q.team.to_owned(),
                    department: q.department.to_owned(),
                    sharing_policy: q.sharing_policy.to_owned(),
                };
                for (family, devices) in self.device_families().into_iter().zip(q.devices) {
                    family.get_or_create(&labels).set(devices.into());
                }
                if let Some((entitlement, allocated)) = q.equivalents {
                    (self.entitlement_ge.get_or_create(&labels)).set(number(entitlement));
                    (self.allocated_ge.get_or_create(&labels)).set(number(allocated));
                } else {
                    self.entitlement_ge.remove(&labels);
                    self.allocated_ge.remove(&labels);
                }
            },
        );
        republish(
            &mut last.budgets,
            &gauges.budgets,
            |&(team, in_use)| (hashed(team), hashed(in_use)),
            || self.budget_in_use_ge.clear(),
            |&(team, in_use)| {
                let labels = BudgetLabels { team: team.into() };
                (self.budget_in_use_ge.get_or_create(&labels)).set(number(in_use));
            },
        );
        republish(
            &mut last.policies,
            &gauges.policies,
            |p| {
                let values = (p.capacity, p.used_outside_teams, p.capacity_equivalents);
                (hashed(p.name), hashed(values))
            },
            || {
                self.capacity.clear();
                self.used_outside_teams.clear();
                self.capacity_ge.clear();
            },
            |p| {
                let labels = PolicyLabels {
                    sharing_policy: p.name.to_owned(),
                };
                self.capacity.get_or_create(&labels).set(p.capacity.into());
                (self.used_outside_teams.get_or_create(&labels)).set(p.used_outside_teams.into());
                if let Some(devices) = p.capacity_equivalents {
                    self.capacity_ge.get_or_create(&labels).set(number(devices));
                } else {
                    self.capacity_ge.remove(&labels);
                }
            },
        );
        republish(
            &mut last.conditions,
            &gauges.conditions,
            |&(kind, name, type_, is_true)| (hashed((kind, name, type_)), hashed(is_true)),
            || self.conditions.clear(),
            |&(kind, name, type_, is_true)| {
                let labels = ConditionLabels {
                    kind,
                    name: name.to_owned(),
                    r#type: type_.to_owned(),
                };
                self.conditions
                    .get_or_create(&labels)
                    .set(i64::from(is_true));
            },
        );
    }

    /// The per-device families of a sharing policy's quota, in the order of
    /// [`QuotaGauges::devices`].
    fn device_families(&self) -> [&Family<TeamLabels, Gauge>; 8] {
        [
            &self.guaranteed,
            &self.limit,
            &self.entitlement,
            &self.requested,
            &self.allocated,
            &self.borrowed,
            &self.pending,
            &self.effective_guarantee,
        ]
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
mod tests;
