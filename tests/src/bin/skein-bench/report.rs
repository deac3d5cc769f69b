//! The figures of one run, in the order they are measured, and how they are printed: a table of
//! figures, then a table of Skein/floor ratios with their targets (the same ratios go to `--json`).
//! A figure that was not measured (no `--celery`, say) reads as NaN, and so does any ratio of it.

use std::time::Duration;

use serde_json::{json, Value};

/// Figures of one run, in the order they are printed.
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) rows: Vec<(String, f64, String)>,
}

impl Report {
    pub(crate) fn add(&mut self, name: &str, value: f64, unit: &str) {
        eprintln!("  {name}: {value:.1} {unit}");
        self.rows.push((name.to_owned(), value, unit.to_owned()));
    }

    pub(crate) fn get(&self, name: &str) -> f64 {
        self.rows
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| *v)
            .unwrap_or(f64::NAN)
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e6
}

pub(crate) fn latencies(report: &mut Report, name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    report.add(&format!("{name} p50"), percentile(&samples, 50), "µs");
    report.add(&format!("{name} p99"), percentile(&samples, 99), "µs");
}

/// What the sequential hops of a whole turn cost at their floors, from this run's figures: the
/// submission and the final event each stored and delivered (a JetStream publish with ack), the
/// turn's start and its end (a Redis `SET` of a session each), the checkpoint (a `SET` of the same
/// bytes) and the two calls side by side (the durable-call floor). Model calls and every part of
/// Skein's own work are left out.
fn turn_hops_floor(report: &Report) -> f64 {
    2.0 * report.get("floor: JetStream publish with ack p50")
        + 2.0 * report.get("floor: Redis SET of a session p50")
        + report.get("floor: Redis SET of the same bytes p50")
        + report.get("floor: durable call (JetStream work, pull, reply, ack) p50")
}

/// The p50 of the plan bench's turn whose name holds `kind`.
fn plan_turn(report: &Report, kind: &str) -> f64 {
    report
        .rows
        .iter()
        .find(|(name, _, _)| {
            name.starts_with("plan: turn") && name.contains(kind) && name.ends_with("p50")
        })
        .map_or(f64::NAN, |(_, value, _)| *value)
}

pub(crate) fn ratios(report: &Report) -> Vec<Value> {
    let rr = report.get("floor: core NATS request-reply p50");
    let pipelined = report.get("floor: pipelined core NATS request-reply");
    let set = report.get("floor: Redis SET of the same bytes p50");
    let round_trip = report.get("skein: no-op tool call round trip p50");
    let durable_floor = report.get("floor: durable call (JetStream work, pull, reply, ack) p50");
    let two_workers = report.get("skein: no-op tool calls with 2 worker(s)");
    let ratio = |name: &str, value: f64, target: &str| json!({ "name": name, "value": value, "target": target });
    [
        ratio(
            "no-op round trip p50 / request-reply p50",
            round_trip / rr,
            "<= 1.5",
        ),
        // What the first goal asks of the path, split: the design's own floor against core
        // request-reply (no target: it is NATS's), and what Skein adds to it.
        ratio(
            "durable-call floor p50 / request-reply p50",
            durable_floor / rr,
            "(NATS alone)",
        ),
        ratio(
            "no-op round trip p50 / durable-call floor p50",
            round_trip / durable_floor,
            "(Skein's share)",
        ),
        ratio(
            "no-op calls with 2 workers / pipelined core NATS",
            two_workers / pipelined,
            ">= 0.35",
        ),
        ratio(
            "whole turn p50 / request-reply p50",
            report.get("skein: whole turn (two tool calls) p50") / rr,
            "<= 6",
        ),
        // The third goal, split the same way: what a turn's hops cost at their floors, and what
        // Skein adds to them.
        ratio(
            "whole turn's hops at their floors / request-reply p50",
            turn_hops_floor(report) / rr,
            "(NATS and Redis alone)",
        ),
        ratio(
            "whole turn p50 / its hops at their floors",
            report.get("skein: whole turn (two tool calls) p50") / turn_hops_floor(report),
            "(Skein's share)",
        ),
        ratio(
            "turn streamed over HTTP p50 / same turn on NATS p50",
            report.get("gateway: whole turn streamed over HTTP p50")
                / report.get("skein: whole turn (two tool calls) p50"),
            "<= 1.3",
        ),
        // CPU per turn moves with the host from run to run; the broker's moves with it and runs
        // none of Skein's code, so against it a change to the lead or the workers reads steadier
        // (when the change leaves the broker's own work alone; read its figure beside).
        ratio(
            "lead CPU per turn / nats-server CPU per turn",
            report.get("cost per turn: lead CPU") / report.get("cost per turn: nats-server CPU"),
            "(steadier than either alone)",
        ),
        ratio(
            "workers CPU per turn / nats-server CPU per turn",
            report.get("cost per turn: workers CPU") / report.get("cost per turn: nats-server CPU"),
            "(steadier than either alone)",
        ),
        ratio(
            "checkpoint p50 / Redis SET p50",
            report.get("skein: checkpoint of a step p50") / set,
            "<= 1.2",
        ),
        // The same for a running turn's step, which leaves the expiry as its start set it.
        ratio(
            "running turn's checkpoint p50 / Redis SET p50",
            report.get("skein: checkpoint of a running turn's step p50") / set,
            "(the goal's figure without the EXPIRE)",
        ),
        ratio(
            "lead peak RSS growth per in-flight turn (KiB)",
            report.get("skein: lead peak RSS growth per in-flight turn"),
            "<= 16",
        ),
        ratio(
            "plan turn p50 / as many spawn_agent calls at once p50",
            plan_turn(report, "running") / plan_turn(report, "spawn_agent"),
            "<= 1.1",
        ),
        ratio(
            "Celery round trip p50 / no-op round trip p50",
            report.get("peer: Celery task round trip p50") / round_trip,
            ">= 4",
        ),
        ratio(
            "no-op calls with 2 workers / Celery tasks",
            two_workers / report.get("peer: Celery tasks (2 worker processes)"),
            ">= 20",
        ),
    ]
    .into_iter()
    // A ratio of figures this run did not measure is left out.
    .filter(|ratio| ratio["value"].as_f64().is_some_and(f64::is_finite))
    .collect()
}

pub(crate) fn print_table(report: &Report) {
    println!("| figure | value | unit |");
    println!("| --- | ---: | --- |");
    for (name, value, unit) in &report.rows {
        let digits = if value.abs() < 10.0 { 2 } else { 1 };
        println!("| {name} | {value:.digits$} | {unit} |");
    }
    println!();
    println!("| ratio | value | target |");
    println!("| --- | ---: | --- |");
    for ratio in ratios(report) {
        println!(
            "| {} | {:.2} | {} |",
            ratio["name"].as_str().unwrap_or_default(),
            ratio["value"].as_f64().unwrap_or(f64::NAN),
            ratio["target"].as_str().unwrap_or_default()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_of(figures: &[(&str, f64)]) -> Report {
        let mut report = Report::default();
        for (name, value) in figures {
            report
                .rows
                .push(((*name).to_owned(), *value, "µs".to_owned()));
        }
        report
    }

    fn ratio_named(ratios: &[Value], name: &str) -> Option<f64> {
        ratios
            .iter()
            .find(|ratio| ratio["name"] == name)
            .and_then(|ratio| ratio["value"].as_f64())
    }

    #[test]
    fn a_whole_turn_is_split_into_its_hops_floors_and_skeins_share() {
        let report = report_of(&[
            ("floor: core NATS request-reply p50", 200.0),
            ("floor: JetStream publish with ack p50", 150.0),
            ("floor: Redis SET of a session p50", 100.0),
            ("floor: Redis SET of the same bytes p50", 120.0),
            (
                "floor: durable call (JetStream work, pull, reply, ack) p50",
                330.0,
            ),
            ("skein: whole turn (two tool calls) p50", 2500.0),
        ]);
        let ratios = ratios(&report);
        // 2 × 150 + 2 × 100 + 120 + 330 = 950 µs.
        let floors = ratio_named(
            &ratios,
            "whole turn's hops at their floors / request-reply p50",
        );
        let share = ratio_named(&ratios, "whole turn p50 / its hops at their floors");
        assert_eq!(floors, Some(950.0 / 200.0));
        assert_eq!(share, Some(2500.0 / 950.0));
        assert_eq!(
            ratio_named(&ratios, "whole turn p50 / request-reply p50"),
            Some(2500.0 / 200.0)
        );
    }

    #[test]
    fn cpu_per_turn_is_also_given_against_the_brokers() {
        let report = report_of(&[
            ("cost per turn: lead CPU", 300.0),
            ("cost per turn: workers CPU", 120.0),
            ("cost per turn: nats-server CPU", 240.0),
        ]);
        let ratios = ratios(&report);
        assert_eq!(
            ratio_named(&ratios, "lead CPU per turn / nats-server CPU per turn"),
            Some(1.25)
        );
        assert_eq!(
            ratio_named(&ratios, "workers CPU per turn / nats-server CPU per turn"),
            Some(0.5)
        );
        // Without the broker's figure, neither is given.
        let ratios = super::ratios(&report_of(&[("cost per turn: lead CPU", 300.0)]));
        assert_eq!(
            ratio_named(&ratios, "lead CPU per turn / nats-server CPU per turn"),
            None
        );
    }

    #[test]
    fn the_split_is_left_out_when_a_hop_was_not_measured() {
        let report = report_of(&[
            ("floor: core NATS request-reply p50", 200.0),
            ("floor: JetStream publish with ack p50", 150.0),
            ("floor: Redis SET of a session p50", 100.0),
            ("floor: Redis SET of the same bytes p50", 120.0),
            ("skein: whole turn (two tool calls) p50", 2500.0),
        ]);
        let ratios = ratios(&report);
        assert_eq!(
            ratio_named(&ratios, "whole turn p50 / its hops at their floors"),
            None
        );
        assert!(ratio_named(&ratios, "whole turn p50 / request-reply p50").is_some());
    }
}
