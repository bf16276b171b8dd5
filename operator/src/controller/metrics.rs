//! Prometheus metrics (`/metrics`, text format).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::plan::Plan;

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
    pub sharing_policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub sharing_policy: String,
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
    pub capacity: Family<PolicyLabels, Gauge>,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("teamgpu");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register("reconciles", "Reconcile passes", reconciles.clone());
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed API calls during reconcile, by error",
            errors.clone(),
        );
        let reconcile_seconds = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        registry.register(
            "reconcile_duration_seconds",
            "Duration of a reconcile pass",
            reconcile_seconds.clone(),
        );
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes to the API server, by kind and verb",
            writes.clone(),
        );
        let team_gauge = |registry: &mut Registry, name: &str, help: &str| {
            let family = Family::<TeamLabels, Gauge>::default();
            registry.register(name, help, family.clone());
            family
        };
        let guaranteed = team_gauge(
            &mut registry,
            "team_guaranteed_devices",
            "Configured guarantee",
        );
        let limit = team_gauge(&mut registry, "team_limit_devices", "Configured limit");
        let entitlement = team_gauge(&mut registry, "team_entitlement_devices", "Hard quota now");
        let requested = team_gauge(
            &mut registry,
            "team_requested_devices",
            "Devices requested by claims",
        );
        let allocated = team_gauge(
            &mut registry,
            "team_allocated_devices",
            "Devices allocated to claims",
        );
        let borrowed = team_gauge(
            &mut registry,
            "team_borrowed_devices",
            "Entitlement above the effective guarantee",
        );
        let capacity = Family::<PolicyLabels, Gauge>::default();
        registry.register(
            "sharing_policy_capacity_devices",
            "Matching devices",
            capacity.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 when this replica holds the lease",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            reconcile_seconds,
            writes,
            guaranteed,
            limit,
            entitlement,
            requested,
            allocated,
            borrowed,
            capacity,
            leader,
        }
    }
}

impl Metrics {
    /// Publish the numbers of a plan; series of teams and policies that are gone disappear.
    pub fn observe_plan(&self, plan: &Plan) {
        for family in [
            &self.guaranteed,
            &self.limit,
            &self.entitlement,
            &self.requested,
            &self.allocated,
            &self.borrowed,
        ] {
            family.clear();
        }
        self.capacity.clear();
        for team in &plan.teams {
            for q in &team.quotas {
                let labels = TeamLabels {
                    team: team.name.clone(),
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
            }
        }
        for p in &plan.sharing_policies {
            self.capacity
                .get_or_create(&PolicyLabels {
                    sharing_policy: p.name.clone(),
                })
                .set(p.capacity.into());
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
