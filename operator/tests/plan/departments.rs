//! Departments in the built-in example: research (ml-research, data-science) beside inference,
//! on the 32 A100-80GB devices.

use serde_json::json;
use teamgpu::api::TeamGpuPolicy;

use super::{condition, example, hard, team};

fn a100(guaranteed: u32, limit: u32) -> serde_json::Value {
    json!([{"sharingPolicy": "a100-80gb", "guaranteed": guaranteed, "limit": limit}])
}

fn tree(research_parent: Option<&str>) -> Vec<TeamGpuPolicy> {
    vec![
        team(json!({"metadata": {"name": "research"}, "spec": {
            "department": true, "parent": research_parent, "quotas": a100(16, 32)}})),
        team(
            json!({"metadata": {"name": "ml-research"}, "spec": {"parent": "research",
            "namespaces": ["ml-research-dev", "ml-research-train"], "quotas": a100(8, 32)}}),
        ),
        team(
            json!({"metadata": {"name": "data-science"}, "spec": {"parent": "research",
            "namespaces": ["data-science"], "quotas": a100(8, 32)}}),
        ),
        team(json!({"metadata": {"name": "inference"}, "spec": {
            "namespaces": ["inference-canary", "inference-prod"], "quotas": a100(16, 32)}})),
    ]
}

#[test]
fn a_department_divides_what_it_gets_among_its_teams_and_says_so() {
    let mut state = example();
    state.teams = tree(None);
    let planned = teamgpu::core::plan::plan(&state);
    let report = |name: &str| planned.teams.iter().find(|t| t.name == name).unwrap();
    let research = report("research");
    assert_eq!(
        condition(&research.conditions, "Ready").message,
        "department of 2: data-science, ml-research"
    );
    // research (14 requested of its 16) and inference (9 of its 16) share the 9 idle devices,
    // each borrowing the other's unused guarantee: research 7 (of inference's 7), inference 2.
    let quota = &research.quotas[0];
    assert_eq!((quota.guaranteed, quota.entitlement), (16, 23));
    assert_eq!(report("inference").quotas[0].entitlement, 18);
    // Inside research, the 2 it lent out are not lent again: its members share the 7 it
    // borrowed. ml-research (12 in use, limit 32) can take 7 more, data-science (2 of its 8)
    // 1 beyond its own 6 unused: water-filled, 6 and 1.
    let ml = &report("ml-research").quotas[0];
    assert_eq!(ml.entitlement, 18);
    assert_eq!(report("data-science").quotas[0].entitlement, 9);
    assert!(
        ml.explanation.ends_with(
            "; within department research: 23 (16 guaranteed + 7 borrowed of 9 idle at weight 1/2)"
        ),
        "{}",
        ml.explanation
    );
    assert_eq!(
        condition(&report("ml-research").conditions, "Parent").reason,
        "InDepartment"
    );
    // A department owns no namespace: no quota of its own, its teams' namespaces have theirs.
    let key = "a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let ml_hards: u32 = ["ml-research-dev", "ml-research-train"]
        .iter()
        .map(|ns| hard(&planned, ns)[key].parse::<u32>().unwrap())
        .sum();
    assert_eq!(ml_hards, 18);
    // research counts what its members guarantee, for admission to hold new members to it.
    assert_eq!(quota.members_guaranteed, Some(16));
    assert_eq!(ml.members_guaranteed, None);
}

#[test]
fn departments_bring_the_admission_policies_of_delegation_and_flat_teams_do_not() {
    let policies = |state: &teamgpu::core::state::ClusterState| -> Vec<String> {
        let planned = teamgpu::core::plan::plan(state);
        (planned.objects.admission_policies.iter())
            .filter_map(|p| p.metadata.name.clone())
            .filter(|n| n.contains("department") || n.contains("top-level"))
            .collect()
    };
    let mut state = example();
    assert!(policies(&state).is_empty());
    state.teams = tree(None);
    assert_eq!(
        policies(&state),
        ["teamgpu-department-teams", "teamgpu-top-level-teams"]
    );
}

#[test]
fn a_department_in_a_cycle_is_planned_at_the_top_and_says_why() {
    let mut state = example();
    let mut teams = tree(Some("lab"));
    teams.push(team(json!({"metadata": {"name": "lab"}, "spec": {
        "department": true, "parent": "research", "quotas": a100(16, 32)}})));
    state.teams = teams;
    let planned = teamgpu::core::plan::plan(&state);
    let research = planned.teams.iter().find(|t| t.name == "research").unwrap();
    let parent = condition(&research.conditions, "Parent");
    assert_eq!(parent.reason, "ParentIgnored");
    assert_eq!(
        parent.message,
        "parents form a cycle (research -> lab -> research): planned at the top level"
    );
    // Its teams are still planned, under it.
    let ml = planned
        .teams
        .iter()
        .find(|t| t.name == "ml-research")
        .unwrap();
    assert!(ml.quotas[0].entitlement >= 8);
}

#[test]
fn a_departments_budget_holds_its_teams_together_to_what_it_pays_for() {
    let mut state = example();
    let mut teams = tree(None);
    // research's teams hold 14 A100s (ml-research 12, data-science 2); a whole A100-80GB is
    // one GPU-equivalent. A budget of 14 leaves nothing: research may hold what it holds.
    teams[0].spec.budget = Some(teamgpu::api::Budget {
        gpu_equivalents: 14,
    });
    state.teams = teams;
    let planned = teamgpu::core::plan::plan(&state);
    let report = |name: &str| planned.teams.iter().find(|t| t.name == name).unwrap();
    let research = report("research");
    let budget = research.budget.as_ref().expect("a budget status");
    assert_eq!(
        (
            budget.gpu_equivalents,
            budget.in_use.as_str(),
            budget.left.as_str()
        ),
        (14, "14", "0")
    );
    assert_eq!(
        condition(&research.conditions, "Budget").reason,
        "WithinBudget"
    );
    // Its guarantee of 16 and the 7 it would borrow are held to 14, which its teams share.
    assert_eq!(research.quotas[0].entitlement, 14);
    let key = "a100-80gb.teamgpu.io.deviceclass.resource.k8s.io/devices";
    let hards = |namespaces: &[&str]| -> u32 {
        (namespaces.iter())
            .map(|ns| hard(&planned, ns)[key].parse::<u32>().unwrap())
            .sum()
    };
    assert_eq!(hards(&["ml-research-dev", "ml-research-train"]), 12);
    assert_eq!(hards(&["data-science"]), 2);
    // inference, outside the department, is not held by research's budget.
    assert_eq!(report("inference").quotas[0].entitlement, 18);

    // Lowered below what runs: over budget, said, and nothing more for anyone in research.
    state.teams[0].spec.budget = Some(teamgpu::api::Budget {
        gpu_equivalents: 10,
    });
    let planned = teamgpu::core::plan::plan(&state);
    let research = planned.teams.iter().find(|t| t.name == "research").unwrap();
    let over = condition(&research.conditions, "Budget");
    assert_eq!(over.reason, "OverBudget");
    assert!(
        over.message
            .starts_with("14 of 10 GPU-equivalents in use, 4 over"),
        "{}",
        over.message
    );
    assert_eq!(research.quotas[0].entitlement, 14);
}

#[test]
fn teamgpu_plan_explains_a_three_level_entitlement_at_every_level() {
    let mut state = example();
    // company (the top) holds research, which holds the two teams. company gets what research
    // got at the top above: 23, of which it lent 2 of its unused guarantee to inference. Those 2
    // are not lent again inside it, so research, its only member, divides 21; its teams get
    // what they got above (18 and 9: the 2 were not theirs to borrow there either).
    let mut teams = tree(Some("company"));
    teams.push(team(json!({"metadata": {"name": "company"}, "spec": {
        "department": true, "quotas": a100(16, 32)}})));
    state.teams = teams;
    let planned = teamgpu::core::plan::plan(&state);
    let entitlement = |name: &str| {
        let report = planned.teams.iter().find(|t| t.name == name).unwrap();
        report.quotas[0].entitlement
    };
    assert_eq!(
        [
            "company",
            "research",
            "ml-research",
            "data-science",
            "inference"
        ]
        .map(entitlement),
        [23, 21, 18, 9, 18]
    );
    let table = teamgpu::cli::output::table(&planned);
    let why = (table.lines())
        .find(|l| l.trim_start().starts_with("ml-research/a100-80gb:"))
        .expect("a Why line for ml-research");
    let research = why.find("; within department research: 21 (").expect(why);
    let company = why
        .find(
            "; within department company: 23 (16 guaranteed + 7 borrowed of 9 idle at weight 1/2)",
        )
        .expect(why);
    assert!(research < company, "{why}");
}
