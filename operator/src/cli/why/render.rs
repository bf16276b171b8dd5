//! The diagnosis as text: the verdict line, then a `why:` line for each finding. (`-o json` and
//! `-o yaml` serialize the [`Why`] itself.)

use std::fmt::Write as _;

use super::{
    Borrower, CapacityFacts, ClaimState, EntitlementFacts, Evidence, PodClaim, QueuePlace,
    QuotaFacts, ReclaimFacts, Verdict, Why,
};

/// The verdict line, then `why:` lines.
pub fn text(why: &Why) -> String {
    let mut out = verdict_line(why);
    let lines = why_lines(why);
    if !lines.is_empty() {
        out.push_str("why:\n");
        for line in lines {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

fn verdict_line(why: &Why) -> String {
    let who = format!("pod {}/{}", why.namespace, why.pod);
    match why.verdict {
        Verdict::NotWaiting => {
            let phase = why.phase.as_deref().unwrap_or("Pending");
            match (&why.node, phase) {
                (Some(node), "Pending") => format!("{who} is not waiting: bound to node {node}\n"),
                (Some(node), _) => format!("{who} is not waiting: {phase} on node {node}\n"),
                (None, _) => format!("{who} is not waiting: {phase}\n"),
            }
        }
        Verdict::Allocated => format!(
            "{who} does not wait for GPUs: its devices are allocated, the scheduler places it\n"
        ),
        Verdict::NoTeamgpuClass => {
            format!("{who} does not wait for teamgpu: it asks for no teamgpu DeviceClass\n")
        }
        v => format!("{who} waits: {}\n", verdict_words(v)),
    }
}

fn verdict_words(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::NotWaiting => "not waiting",
        Verdict::Allocated => "allocated",
        Verdict::NoTeamgpuClass => "no teamgpu class",
        Verdict::NoTeam => "no team",
        Verdict::NoEntitlement => "no entitlement",
        Verdict::Quota => "quota",
        Verdict::ClaimNotCreated => "claim not created",
        Verdict::ClaimMissing => "claim missing",
        Verdict::Capacity => "capacity",
    }
}

/// A line for each finding, in the order a reader asks: whose, what, then why not yet.
fn why_lines(why: &Why) -> Vec<String> {
    if !why.waiting && why.verdict != Verdict::Allocated {
        return Vec::new();
    }
    let mut lines = vec![team_line(why)];
    lines.extend(why.claims.iter().map(claim_line));
    lines.extend(why.quota.as_ref().map(quota_line));
    lines.extend(why.capacity.as_ref().map(capacity_line));
    if why.verdict == Verdict::NoEntitlement {
        lines.push(format!(
            "entitlement: team {} has no quota for this sharing policy: teamgpu's admission \
             refuses its claims",
            why.team.as_deref().unwrap_or_default()
        ));
    }
    if let (Some(e), Some(team)) = (&why.entitlement, &why.team) {
        lines.push(entitlement_line(e, team, why.verdict));
    }
    if why.entitlement.is_some() {
        lines.push(borrowers_line(&why.borrowers, why.team.as_deref()));
    }
    if let (Some(r), Some(team)) = (&why.reclaim, &why.team) {
        lines.push(reclaim_line(r, team, &why.borrowers));
    }
    if let (Some(q), Some(team)) = (&why.queue, &why.team) {
        lines.push(queue_line(q, team));
    }
    lines.extend(why.evidence.iter().map(evidence_line));
    lines
}

fn team_line(why: &Why) -> String {
    match &why.team {
        Some(team) => format!("team: {team} (namespace {})", why.namespace),
        None => format!(
            "team: namespace {} belongs to no TeamGpuPolicy: teamgpu refuses claims of its \
             DeviceClasses here (ResourceQuota teamgpu-outside-teams, or its admission policy); \
             a platform admin can add the namespace to a team",
            why.namespace
        ),
    }
}

fn claim_line(c: &PodClaim) -> String {
    let from = match (&c.claim, &c.template) {
        (Some(claim), Some(t)) => format!("claim {claim} from template {t}"),
        (Some(claim), None) => format!("claim {claim}"),
        (None, Some(t)) => format!("template {t}"),
        (None, None) => "no claim or template".to_owned(),
    };
    let devices = plural(c.devices, "device", "devices");
    let asks = match (&c.device_class, &c.sharing_policy) {
        (Some(class), Some(policy)) => format!("{devices} of sharing policy {policy} ({class})"),
        (Some(class), None) => format!("{devices} of {class}"),
        (None, _) => "devices of an unknown class".to_owned(),
    };
    format!(
        "claim {}: {from}: {asks}, {}",
        c.name,
        claim_state_words(c.state)
    )
}

fn claim_state_words(state: ClaimState) -> &'static str {
    match state {
        ClaimState::Allocated => "allocated",
        ClaimState::Unallocated => "not allocated",
        ClaimState::NotCreated => "not created",
        ClaimState::Missing => "missing",
        ClaimState::NotNeeded => "not needed",
    }
}

fn quota_line(q: &QuotaFacts) -> String {
    let name = format!("ResourceQuota {}/{}", q.namespace, q.name);
    let Some(hard) = q.hard else {
        return format!(
            "quota: {name} does not limit {} (not written by the operator yet?), the pod needs {}",
            q.device_class, q.needs
        );
    };
    let state = if q.room {
        "has room now (the resourceclaim controller retries)"
    } else {
        "has no room"
    };
    format!(
        "quota: {name} {state}: {} of {hard} {} devices used, the pod needs {}",
        q.used.unwrap_or(0),
        q.device_class,
        q.needs
    )
}

fn capacity_line(c: &CapacityFacts) -> String {
    let placing = if c.free == 0 {
        ""
    } else {
        "; the scheduler could not place the pod on the free ones (see its message)"
    };
    format!(
        "capacity: sharing policy {} has {} for teams, {} allocated, {} free{placing}",
        c.sharing_policy,
        plural(u64::from(c.capacity), "device", "devices"),
        c.allocated,
        c.free
    )
}

fn entitlement_line(e: &EntitlementFacts, team: &str, verdict: Verdict) -> String {
    let state = if e.at_entitlement {
        format!(
            "{team} is at its entitlement: requests {} of {}",
            e.requested, e.entitlement
        )
    } else {
        let rest = if verdict == Verdict::Quota {
            ": the operator moves the rest to namespaces with waiting pods"
        } else {
            ""
        };
        format!(
            "{team} requests {} of its entitlement {}{rest}",
            e.requested, e.entitlement
        )
    };
    let scaled = if e.effective_guarantee < e.guaranteed {
        format!("{} (of {})", e.effective_guarantee, e.guaranteed)
    } else {
        e.guaranteed.to_string()
    };
    let explanation = if e.explanation.is_empty() {
        String::new()
    } else {
        format!("; {}", e.explanation)
    };
    format!(
        "entitlement: {state} (guaranteed {scaled}, limit {}){explanation}",
        e.limit
    )
}

/// Who borrows, the Pod's own team marked.
fn borrowers_line(borrowers: &[Borrower], team: Option<&str>) -> String {
    if borrowers.is_empty() {
        return "who borrows: no team holds more than its guarantee".to_owned();
    }
    let list: Vec<String> = borrowers
        .iter()
        .map(|b| {
            let this = if team == Some(b.team.as_str()) {
                " (this team)"
            } else {
                ""
            };
            format!(
                "{}{this} holds {}, {} above its guarantee of {}",
                b.team, b.allocated, b.above, b.effective_guarantee
            )
        })
        .collect();
    format!("who borrows: {}", list.join("; "))
}

fn reclaim_line(r: &ReclaimFacts, team: &str, borrowers: &[Borrower]) -> String {
    if !r.below {
        return format!(
            "reclaim: {team} holds {}, not below min(guarantee, requested + pending) = {}: \
             reclaim does not act for it",
            r.holds, r.owed_up_to
        );
    }
    let holds = format!("{team} holds {}, below {}", r.holds, r.owed_up_to);
    if r.enabled == Some(false) {
        return format!(
            "reclaim: {holds}, but reclaim is off for this team: it waits until borrowers finish"
        );
    }
    if !borrowers.iter().any(|b| b.team != team) {
        return format!(
            "reclaim: {holds}, but no other team holds more than its guarantee: it waits for \
             devices to free up"
        );
    }
    let grace = if r.grace_from_team {
        format!("grace {} s", r.grace_period_seconds)
    } else {
        format!(
            "grace {} s unless the operator's --reclaim-grace-seconds says otherwise",
            r.grace_period_seconds
        )
    };
    let waited = r
        .waited_seconds
        .map(|w| format!(", the oldest waiting pod has waited {w} s"))
        .unwrap_or_default();
    let when = match r.acts_in_seconds {
        Some(0) => "reclaim may evict borrowers now".to_owned(),
        Some(n) => format!("reclaim may evict borrowers in about {n} s"),
        None => "reclaim does not act".to_owned(),
    };
    match r.enabled {
        Some(true) => format!("reclaim: {holds}; {grace}{waited}: {when}"),
        _ => format!(
            "reclaim: {holds}; the team sets no spec.reclaim.enabled, so the operator's default \
             (--reclaim) decides; if on, {grace}{waited}: {when}"
        ),
    }
}

fn queue_line(q: &QueuePlace, team: &str) -> String {
    format!(
        "queue: {} of {} waiting for {} in team {team}",
        ordinal(q.position),
        plural(q.of as u64, "pod", "pods"),
        q.device_class
    )
}

fn evidence_line(e: &Evidence) -> String {
    let source = e
        .source
        .as_deref()
        .map(|s| format!(" from {s}"))
        .unwrap_or_default();
    let times = if e.count > 1 {
        format!(", {} times", e.count)
    } else {
        String::new()
    };
    format!("event: {}{source}{times}: {}", e.reason, e.message)
}

/// `n` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 21st.
pub(super) fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
