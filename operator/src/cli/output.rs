//! How `teamgpu plan` shows a plan: a table for people, YAML for `kubectl apply`.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::core::plan::Plan;

/// One row per team and sharing policy, then the warnings.
pub fn table(plan: &Plan) -> String {
    let mut out = align(&team_rows(plan));
    let explained: Vec<String> = plan
        .teams
        .iter()
        .flat_map(|t| t.quotas.iter().map(move |q| (t, q)))
        .filter(|(_, q)| !q.explanation.is_empty())
        .map(|(t, q)| format!("  {}/{}: {}", t.name, q.sharing_policy, q.explanation))
        .collect();
    if !explained.is_empty() {
        let _ = writeln!(out, "\nWhy:");
        for line in explained {
            let _ = writeln!(out, "{line}");
        }
    }
    if !plan.reclaims.is_empty() {
        let _ = writeln!(out, "\nReclaim:");
        for r in &plan.reclaims {
            let _ = writeln!(
                out,
                "  {}: {} gives back {} devices to {}",
                r.sharing_policy, r.borrower, r.devices, r.for_team
            );
        }
    }
    let _ = writeln!(out, "\nSharing policies:");
    for p in &plan.sharing_policies {
        let ready = p.conditions.iter().find(|c| c.type_ == "Ready");
        let state = ready.map_or("", |c| if c.status { "Ready" } else { c.reason });
        // In GPU-equivalents when a device is not one whole GPU.
        let equivalents = (p.gpu_equivalents.as_ref())
            .filter(|g| g.per_device != "1")
            .map(|g| format!(" ({} GPU-equivalents, {} each)", g.devices, g.per_device))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} -> DeviceClass {}: {} devices{equivalents}, {state}",
            p.name, p.device_class, p.capacity
        );
    }
    if !plan.sharing_policies.is_empty() || !plan.teams.is_empty() {
        let _ = write!(out, "\nConditions:\n{}", conditions(plan));
    }
    let warnings = crate::cli::validate::findings::warnings(plan);
    if !warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings:");
        for w in &warnings {
            // A CEL error points at the column on lines of its own.
            let _ = writeln!(out, "  - {}", w.replace('\n', "\n    "));
        }
    }
    out
}

/// The table's header and one row per team and sharing policy (a team without quotas: one row).
fn team_rows(plan: &Plan) -> Vec<Vec<String>> {
    let header = [
        "TEAM",
        "SHARING POLICY",
        "GUARANTEED",
        "LIMIT",
        "WEIGHT",
        "CAPACITY",
        "REQUESTED",
        "ALLOCATED",
        "ENTITLEMENT",
        "NAMESPACES",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for team in &plan.teams {
        let namespaces = if team.namespaces.is_empty() {
            "-".to_owned()
        } else {
            team.namespaces.join(",")
        };
        if team.quotas.is_empty() {
            rows.push(vec![
                team.name.clone(),
                "-".into(),
                "".into(),
                "".into(),
                team.weight.to_string(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                namespaces.clone(),
            ]);
        }
        for q in &team.quotas {
            let guaranteed = if q.effective_guarantee < q.guaranteed && q.capacity > 0 {
                format!("{} (of {})", q.effective_guarantee, q.guaranteed)
            } else {
                q.guaranteed.to_string()
            };
            rows.push(vec![
                team.name.clone(),
                q.sharing_policy.clone(),
                guaranteed,
                q.limit.to_string(),
                q.weight.to_string(),
                q.capacity.to_string(),
                q.requested.to_string(),
                q.allocated.to_string(),
                q.entitlement.to_string(),
                namespaces.clone(),
            ]);
        }
    }
    rows
}

/// The conditions the operator would set on each policy, one row each, as in its status.
fn conditions(plan: &Plan) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        ["  POLICY", "TYPE", "STATUS", "REASON", "MESSAGE"]
            .map(str::to_owned)
            .to_vec(),
    ];
    let policies = plan
        .sharing_policies
        .iter()
        .map(|p| (format!("GpuSharingPolicy/{}", p.name), &p.conditions))
        .chain(
            plan.teams
                .iter()
                .map(|t| (format!("TeamGpuPolicy/{}", t.name), &t.conditions)),
        );
    for (policy, conditions) in policies {
        let mut sorted: Vec<_> = conditions.iter().collect();
        sorted.sort_by_key(|c| c.type_);
        for c in sorted {
            rows.push(vec![
                format!("  {policy}"),
                c.type_.to_owned(),
                if c.status { "True" } else { "False" }.to_owned(),
                c.reason.to_owned(),
                c.message.lines().next().unwrap_or_default().to_owned(),
            ]);
        }
    }
    align(&rows)
}

/// Teams (by name, with the department each names) in tree order, each with its depth: top-level
/// teams and departments by name, each department followed by its members, by name. A parent
/// that is not among them (or a cycle) puts a team at the top level.
pub fn tree_order(parents: &BTreeMap<String, Option<String>>) -> Vec<(String, u32)> {
    let mut children: BTreeMap<Option<&str>, Vec<&str>> = BTreeMap::new();
    for (team, parent) in parents {
        let parent = (parent.as_deref()).filter(|p| parents.contains_key(*p) && p != team);
        children.entry(parent).or_default().push(team);
    }
    // Depth-first from the top; what a cycle keeps from the top is added there after.
    let mut order = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut stack: Vec<(&str, u32)> = (children.get(&None).into_iter().flatten().rev())
        .map(|t| (*t, 0))
        .collect();
    loop {
        while let Some((team, depth)) = stack.pop() {
            if !seen.insert(team) {
                continue;
            }
            let members = children.get(&Some(team)).into_iter().flatten();
            stack.extend(members.rev().map(|m| (*m, depth + 1)));
            order.push((team.to_owned(), depth));
        }
        match parents.keys().find(|n| !seen.contains(n.as_str())) {
            Some(left) => stack.push((left, 0)),
            None => break,
        }
    }
    order
}

/// Rows as columns two spaces apart, each as wide as its widest cell; no trailing blanks.
pub fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// Every object the operator would apply, as a `List` (what `kubectl apply -f` takes), in the
/// order of [`yaml`].
pub fn json(plan: &Plan) -> Result<String, serde_json::Error> {
    let o = &plan.objects;
    let mut items = Vec::new();
    for x in &o.device_classes {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.admission_policies {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.admission_bindings {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.resource_quotas {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.claim_templates {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.member_roles {
        items.push(serde_json::to_value(x)?);
    }
    for x in &o.member_bindings {
        items.push(serde_json::to_value(x)?);
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let mut text = serde_json::to_string_pretty(&list)?;
    text.push('\n');
    Ok(text)
}

/// Every object the operator would apply, as one multi-document YAML stream.
pub fn yaml(plan: &Plan) -> Result<String, serde_saphyr::SerializeError> {
    let o = &plan.objects;
    let mut out = String::new();
    let mut push = |doc: String| {
        out.push_str("---\n");
        out.push_str(&doc);
    };
    for x in &o.device_classes {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.admission_policies {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.admission_bindings {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.resource_quotas {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.claim_templates {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.member_roles {
        push(serde_saphyr::to_string(x)?);
    }
    for x in &o.member_bindings {
        push(serde_saphyr::to_string(x)?);
    }
    Ok(out)
}
