//! The replay's output: Markdown tables (the figures, and the targets for configuration (a))
//! and a hand-written SVG of every team's allocated GPUs over time. Pure.

use std::fmt::Write as _;

use crate::metrics::{Figures, Reference, STEP, quantile};
use crate::setup::Configuration;
use crate::workload::{CAPACITY, GRACE_SECONDS, Job, NODES, Team};

/// One line on what is replayed.
pub fn workload_summary(seed: u64, teams: &[Team], jobs: &[Job]) -> String {
    let pods: u32 = jobs.iter().map(|j| j.pods).sum();
    let work: f64 = jobs
        .iter()
        .map(|j| f64::from(j.gpus()) * j.run_seconds)
        .sum();
    let mut out = format!(
        "replay seed {seed}: {} teams, {NODES} nodes, {CAPACITY} GPUs; {} jobs, {pods} pods, {work:.0} GPU-seconds of work",
        teams.len(),
        jobs.len()
    );
    for (index, team) in teams.iter().enumerate() {
        let own: Vec<&Job> = jobs.iter().filter(|j| j.team == index).collect();
        let work: f64 = own
            .iter()
            .map(|j| f64::from(j.gpus()) * j.run_seconds)
            .sum();
        let largest = own.iter().map(|j| j.gpus()).max().unwrap_or(0);
        let _ = write!(
            out,
            "\n  {}: {} jobs, {work:.0} GPU-seconds, largest {largest} GPUs",
            team.name,
            own.len()
        );
    }
    out
}

/// The comparison table (configurations as columns, targets for (a) last) and one table per
/// configuration with each team's figures.
pub fn markdown(seed: u64, teams: &[Team], results: &[(Configuration, Figures)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n### Replay, seed {seed}\n");
    let header: Vec<String> = (results.iter())
        .map(|(config, _)| format!("({}) {}", config.letter(), config.title()))
        .collect();
    let _ = writeln!(out, "| | {} | target for (a) |", header.join(" | "));
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(results.len()));
    for row in rows(results) {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            row.name,
            row.values.join(" | "),
            row.target
        );
    }
    for (config, figures) in results {
        let _ = writeln!(
            out,
            "\n#### ({}) {}: per team\n",
            config.letter(),
            config.title()
        );
        out.push_str(&team_table(teams, config.limits(teams), figures));
    }
    out
}

/// One row of the comparison table.
struct Row {
    name: &'static str,
    values: Vec<String>,
    target: String,
}

fn rows(results: &[(Configuration, Figures)]) -> Vec<Row> {
    let borrowing = find(results, Configuration::Borrowing);
    let static_quotas = find(results, Configuration::Static);
    let row = |name, value: &dyn Fn(&Figures) -> String, target: String| Row {
        name,
        values: results.iter().map(|(_, f)| value(f)).collect(),
        target,
    };
    let of_ideal = |f: &Figures| f.utilization / f.ideal.max(f64::MIN_POSITIVE);
    let shortfall_share = |f: &Figures| f.shortfall() / f.guaranteed_device_seconds.max(1.0);
    let p99 = |v: &[f64]| quantile(v, 0.99);
    let mean_wait = |f: &Figures| mean(&f.job_wait);
    vec![
        row(
            "GPU utilization (of the ideal)",
            &|f| {
                format!(
                    "{:.1}% ({:.1}%)",
                    100.0 * f.utilization,
                    100.0 * of_ideal(f)
                )
            },
            format!(
                "{}; {}",
                target("≥ 95% of ideal", borrowing.map(|a| of_ideal(a) >= 0.95)),
                target(
                    "above (b)",
                    borrowing
                        .zip(static_quotas)
                        .map(|(a, b)| a.utilization > b.utilization)
                ),
            ),
        ),
        row(
            "the same jobs bound with no latency within the configuration's limits and lending limits, never evicted (best fit): first come / weighted fair queue: utilization (of its own ideal); fairness",
            &|f| {
                let show = |r: &Reference| {
                    format!(
                        "{:.1}% ({:.1}%); {:.2}",
                        100.0 * r.utilization,
                        100.0 * r.utilization / r.ideal.max(f64::MIN_POSITIVE),
                        r.fairness_deviation
                    )
                };
                format!("{} / {}", show(&f.first_come), show(&f.fair_queue))
            },
            String::new(),
        ),
        row(
            "idle while wanted, % of capacity-seconds: within quota / above quota (of it kept by a lending limit) / above limit",
            &|f| {
                let share = |v: f64| 100.0 * v / (f64::from(CAPACITY) * f.end).max(1.0);
                let lost = f.idle_while_wanted;
                format!(
                    "{:.1}% / {:.1}% ({:.1}%) / {:.1}%",
                    share(lost.placement),
                    share(lost.quota),
                    share(lost.kept_unlent),
                    share(lost.limit)
                )
            },
            String::new(),
        ),
        row(
            "Pods' start: Job created → Pod created p50 / p99; Pod created → bound p50, of it → claim created p50 (GPU·s the ideal counts before the Pods existed, of capacity-seconds)",
            &|f| {
                let start = &f.pod_start;
                format!(
                    "{} / {}; {}, {} ({:.0}, {:.1}%)",
                    seconds(quantile(&start.submitted_to_created, 0.5)),
                    seconds(quantile(&start.submitted_to_created, 0.99)),
                    seconds(quantile(&start.created_to_bound, 0.5)),
                    seconds(quantile(&start.created_to_claimed, 0.5)),
                    start.before_created,
                    100.0 * start.before_created / (f64::from(CAPACITY) * f.end).max(1.0)
                )
            },
            String::new(),
        ),
        row(
            "claims made for Pods already finished (of all claims)",
            &|f| {
                let start = &f.pod_start;
                format!("{} (of {})", start.claims_for_finished_pods, start.claims)
            },
            String::new(),
        ),
        row(
            "guarantee shortfall after grace, GPU·s (of guaranteed; of it while as many devices were idle; of that while none of the team's waiting Pods fitted a node)",
            &|f| {
                format!(
                    "{:.0} ({:.2}%; {:.0}; {:.0})",
                    f.shortfall(),
                    100.0 * shortfall_share(f),
                    f.shortfall_while_idle(),
                    f.shortfall_no_room()
                )
            },
            target("≤ 1%", borrowing.map(|a| shortfall_share(a) <= 0.01)),
        ),
        row(
            "headroom → bound p50 / p99 (pods); of it, headroom → claim created p99 (the wake-up)",
            &|f| match (
                quantile(&f.headroom_to_bound, 0.5),
                p99(&f.headroom_to_bound),
                p99(&f.headroom_to_claim),
            ) {
                (Some(p50), Some(p99), Some(woken)) => format!(
                    "{p50:.1} s / {p99:.1} s ({}); {woken:.1} s",
                    f.headroom_to_bound.len()
                ),
                _ => "none waited for quota".to_owned(),
            },
            target(
                "p99 ≤ 2 s",
                borrowing.map(|a| p99(&a.headroom_to_bound).is_none_or(|p| p <= 2.0)),
            ),
        ),
        row(
            "job wait mean / p50 / p99",
            &|f| {
                format!(
                    "{:.1} / {} / {} s",
                    mean_wait(f),
                    seconds(quantile(&f.job_wait, 0.5)),
                    seconds(p99(&f.job_wait))
                )
            },
            target(
                "mean below (b)",
                borrowing
                    .zip(static_quotas)
                    .map(|(a, b)| mean_wait(a) < mean_wait(b)),
            ),
        ),
        row(
            "job completion p50 / p99 (unfinished)",
            &|f| {
                format!(
                    "{} / {} s ({} of {})",
                    seconds(quantile(&f.job_completion, 0.5)),
                    seconds(p99(&f.job_completion)),
                    f.jobs_unfinished,
                    f.jobs_submitted
                )
            },
            String::new(),
        ),
        row(
            "evictions (GPU·s of work lost; not needed by a guarantee)",
            &|f| {
                format!(
                    "{} ({:.0}; {})",
                    f.evictions, f.evicted_gpu_seconds, f.unneeded_evictions
                )
            },
            target(
                "none not needed",
                borrowing.map(|a| a.unneeded_evictions == 0),
            ),
        ),
        row(
            "mean abs(allocated − weighted max-min share), GPUs per team",
            &|f| format!("{:.2}", f.fairness_deviation()),
            target("≤ 1", borrowing.map(|a| a.fairness_deviation() <= 1.0)),
        ),
        row(
            "window measured",
            &|f| format!("{:.0} s", f.end),
            String::new(),
        ),
    ]
}

fn find(results: &[(Configuration, Figures)], config: Configuration) -> Option<&Figures> {
    results.iter().find(|(c, _)| *c == config).map(|(_, f)| f)
}

fn target(what: &str, met: Option<bool>) -> String {
    match met {
        Some(true) => format!("{what}: **met**"),
        Some(false) => format!("{what}: **not met**"),
        None => format!("{what}: not measured"),
    }
}

fn seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

fn team_table(teams: &[Team], limits: Vec<u32>, figures: &Figures) -> String {
    let mut out = String::from(
        "| team | guaranteed | limit | weight | lending limit | reclaim | mean GPUs held | shortfall after grace, GPU·s (of wanted within guarantee; of it while as many were idle; of that with no node for its Pods) | mean abs(held − share) | evictions |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for ((team, limit), t) in teams.iter().zip(limits).zip(&figures.teams) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.0} ({:.1}%; {:.0}; {:.0}) | {:.2} | {} |",
            team.name,
            team.guaranteed,
            if limit >= CAPACITY {
                "-".to_owned()
            } else {
                limit.to_string()
            },
            team.weight,
            team.lending_limit
                .map_or_else(|| "-".to_owned(), |l| l.to_string()),
            if team.reclaim {
                format!("{GRACE_SECONDS} s")
            } else {
                "off".to_owned()
            },
            t.mean_held,
            t.shortfall,
            100.0 * t.shortfall / t.wanted_in_guarantee.max(1.0),
            t.shortfall_while_idle,
            t.shortfall_no_room,
            t.fairness_deviation,
            t.evictions
        );
    }
    out
}

/// Colours of the teams, in team order.
const COLOURS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948", "#9c755f",
];
const WIDTH: f64 = 960.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 50.0;
const TOP: f64 = 40.0;
const GAP: f64 = 50.0;

/// One stacked-area chart per configuration of the GPUs allocated to each team over time,
/// on a common time axis, with the capacity as a line.
pub fn svg(teams: &[Team], results: &[(Configuration, Figures)]) -> String {
    let span = results.iter().map(|(_, f)| f.end).fold(1.0, f64::max);
    let height = TOP + results.len() as f64 * (PANEL + GAP) + 10.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    out.push_str(&legend(teams));
    for (index, (config, figures)) in results.iter().enumerate() {
        let top = TOP + index as f64 * (PANEL + GAP);
        out.push_str(&panel(config, figures, top, span));
    }
    out.push_str("</svg>\n");
    out
}

fn legend(teams: &[Team]) -> String {
    let mut out = String::from(
        "<text x=\"10\" y=\"16\" font-weight=\"bold\">GPUs allocated per team</text>\n",
    );
    for (i, team) in teams.iter().enumerate() {
        let x = 220.0 + i as f64 * 110.0;
        let _ = writeln!(
            out,
            "<rect x=\"{x}\" y=\"6\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"16\">{}</text>",
            COLOURS[i % COLOURS.len()],
            x + 16.0,
            team.name
        );
    }
    out
}

fn panel(config: &Configuration, figures: &Figures, top: f64, span: f64) -> String {
    let plot_width = WIDTH - LEFT - 20.0;
    let x = |seconds: f64| LEFT + plot_width * seconds / span;
    let y = |gpus: f64| top + PANEL - PANEL * gpus / f64::from(CAPACITY);
    let mut out = format!(
        "<text x=\"{LEFT}\" y=\"{}\" font-weight=\"bold\">({}) {}: utilization {:.1}% \
         ({:.1}% of the ideal); dashed: capacity</text>\n",
        top - 8.0,
        config.letter(),
        config.title(),
        100.0 * figures.utilization,
        100.0 * figures.utilization / figures.ideal.max(f64::MIN_POSITIVE)
    );
    // Every fifth sample (0.5 s) is enough at this width.
    let samples: Vec<usize> = (0..figures.held.first().map_or(0, Vec::len))
        .step_by(5)
        .collect();
    let mut below = vec![0u32; samples.len()];
    for (team, held) in figures.held.iter().enumerate() {
        let above: Vec<u32> = samples
            .iter()
            .zip(&below)
            .map(|(&i, b)| b + held[i])
            .collect();
        let mut points: Vec<String> = (samples.iter().zip(&above))
            .map(|(&i, &a)| format!("{:.1},{:.1}", x(i as f64 * STEP), y(f64::from(a))))
            .collect();
        points.extend(
            (samples.iter().zip(&below).rev())
                .map(|(&i, &b)| format!("{:.1},{:.1}", x(i as f64 * STEP), y(f64::from(b)))),
        );
        let _ = writeln!(
            out,
            "<polygon fill=\"{}\" stroke=\"none\" points=\"{}\"/>",
            COLOURS[team % COLOURS.len()],
            points.join(" ")
        );
        below = above;
    }
    out.push_str(&axes(top, span, &x, &y));
    out
}

fn axes(top: f64, span: f64, x: &dyn Fn(f64) -> f64, y: &dyn Fn(f64) -> f64) -> String {
    let mut out = format!(
        "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{2:.1}\" x2=\"{1:.1}\" y2=\"{2:.1}\" stroke=\"black\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{LEFT}\" y2=\"{2:.1}\" stroke=\"black\"/>\n",
        y(f64::from(CAPACITY)),
        x(span),
        y(0.0)
    );
    for gpus in (0..=CAPACITY).step_by(32) {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{gpus}</text>",
            LEFT - 6.0,
            y(f64::from(gpus)) + 4.0
        );
    }
    let mut second = 0.0;
    while second <= span {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{second:.0} s</text>",
            x(second),
            top + PANEL + 16.0
        );
        second += 30.0;
    }
    out
}
