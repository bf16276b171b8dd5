//! What a plan warns about, for a person and for `plan -f --fail-on-warnings`: the planner's
//! cluster-wide warnings (overcommitted pools among them), and a hardware selector that does
//! not compile, which only its policy's condition tells. Pure.

use crate::core::plan::Plan;
use crate::core::plan::conditions::types;

/// Every warning of `plan`, sorted.
pub fn warnings(plan: &Plan) -> Vec<String> {
    let mut out = plan.warnings.clone();
    for policy in &plan.sharing_policies {
        for c in &policy.conditions {
            if c.type_ == types::SELECTOR_VALID && !c.status {
                out.push(format!("GpuSharingPolicy {}: {}", policy.name, c.message));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}
