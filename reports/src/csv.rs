//! CSV exports of a [`SimReport`]: a per-strategy summary and the rank timelines.
//!
//! Numbers are written raw (seconds, bytes, nanoseconds) with Rust's shortest round-trip
//! float formatting, so the files are exact, deterministic and easy to load elsewhere; a
//! missing optional value is an empty field.

use crate::model::SimReport;
use hpfsdp_plan::Tier;
use hpfsdp_program::step::{Category, MemTag};

/// The categories that have communication, hence an exposed-communication column.
fn comm_categories() -> Vec<&'static str> {
    Category::ALL
        .iter()
        .filter(|c| !matches!(c, Category::Compute | Category::Copy | Category::Host))
        .map(|c| c.name())
        .collect()
}

/// Writes `records` as CSV. Writing to memory cannot fail and `flexible` allows any record
/// length, so no error can occur; were one to, the output would be cut short, not panic.
pub(crate) fn write_records<I>(records: I) -> String
where
    I: IntoIterator<Item = Vec<String>>,
{
    let mut writer = ::csv::WriterBuilder::new()
        .flexible(true)
        .from_writer(Vec::new());
    for record in records {
        if writer.write_record(&record).is_err() {
            break;
        }
    }
    let bytes = writer.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Formats an optional float, empty when absent.
fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// One row per strategy with every summary metric as a column: times in seconds, exposed
/// communication per category (`exposed_comm_<category>_s`), collective calls and bytes per
/// tier (`<tier>_collectives`, `<tier>_bytes`), peak memory per tag (`peak_<tag>_bytes`), the
/// optimizer's figures and the peak-memory spread across ranks, and optimizer bytes per tier
/// (`optimizer_<tier>_bytes`).
///
/// One fixed schema for every scenario: a column for every communication category, tier and
/// memory tag the plan model has ([`Category::ALL`], [`Tier::ALL`], [`MemTag::ALL`], in that
/// order), 0 where a run has none, so files of different scenarios stack. (Names outside
/// these enums have no column; the simulator produces none.)
pub fn summary_csv(report: &SimReport) -> String {
    let cats: Vec<String> = comm_categories().into_iter().map(String::from).collect();
    let tiers: Vec<String> = Tier::ALL.iter().map(|t| t.name().to_string()).collect();
    let tags: Vec<String> = MemTag::ALL.iter().map(|t| t.name().to_string()).collect();
    let mut header: Vec<String> = [
        "scenario",
        "hardware",
        "world_size",
        "strategy",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "compute_s",
        "copy_s",
        "host_s",
        "idle_s",
        "comm_s",
        "exposed_comm_s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    header.extend(cats.iter().map(|c| format!("exposed_comm_{c}_s")));
    header.push("overlap_rate".into());
    for t in &tiers {
        header.push(format!("{t}_collectives"));
        header.push(format!("{t}_bytes"));
    }
    header.push("peak_memory_bytes".into());
    header.extend(tags.iter().map(|t| format!("peak_{t}_bytes")));
    header.push("memory_fits".into());
    header.extend(
        [
            "optimizer",
            "optimizer_range_s",
            "optimizer_busy_s",
            "optimizer_comm_s",
            "optimizer_exposed_comm_s",
            "optimizer_collectives",
            "peak_memory_min_bytes",
            "peak_memory_mean_bytes",
            "peak_memory_max_bytes",
            "peak_memory_spread_bytes",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    header.extend(tiers.iter().map(|t| format!("optimizer_{t}_bytes")));

    let rows = report.runs.iter().map(|r| {
        let mut row = vec![
            report.scenario.clone(),
            report.hardware.clone(),
            report.world_size.to_string(),
            r.strategy.clone(),
            r.step_time_s.to_string(),
            opt(r.tokens_per_s),
            opt(r.mfu),
            r.compute_s.to_string(),
            r.copy_s.to_string(),
            r.host_s.to_string(),
            r.idle_s.to_string(),
            r.comm_s.to_string(),
            r.exposed_comm_s.to_string(),
        ];
        row.extend(cats.iter().map(|c| {
            r.exposed_comm_by_category_s
                .get(c)
                .copied()
                .unwrap_or(0.0)
                .to_string()
        }));
        row.push(r.overlap_rate.to_string());
        for t in &tiers {
            let (n, b) = r
                .tier_bytes
                .iter()
                .filter(|x| x.tier == *t)
                .fold((0u64, 0u64), |(n, b), x| {
                    (n.saturating_add(x.collectives), b.saturating_add(x.bytes))
                });
            row.push(n.to_string());
            row.push(b.to_string());
        }
        row.push(r.peak_memory_bytes.to_string());
        row.extend(tags.iter().map(|t| {
            r.peak_memory_by_tag
                .get(t)
                .copied()
                .unwrap_or(0)
                .to_string()
        }));
        row.push(r.memory_fits.to_string());
        let o = r.optimizer.clone().unwrap_or_default();
        let m = &r.memory_spread;
        row.extend([
            r.optimizer_name.clone(),
            o.range_s.to_string(),
            o.busy_s.to_string(),
            o.comm_s.to_string(),
            o.exposed_comm_s.to_string(),
            o.collectives.to_string(),
            m.min_bytes.to_string(),
            m.mean_bytes.to_string(),
            m.max_bytes.to_string(),
            m.spread_bytes().to_string(),
        ]);
        row.extend(
            tiers
                .iter()
                .map(|t| o.tier_bytes.get(t).copied().unwrap_or(0).to_string()),
        );
        row
    });
    write_records(std::iter::once(header).chain(rows))
}

/// Every recorded span, one row each: `strategy, rank, stream, category, op, start_ns,
/// end_ns, bytes` (bytes empty when the op moves no data). Strategies in report order, spans
/// in recorded order.
pub fn timeline_csv(report: &SimReport) -> String {
    let header: Vec<String> = [
        "strategy", "rank", "stream", "category", "op", "start_ns", "end_ns", "bytes",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = report.runs.iter().flat_map(|r| {
        r.rank0_timeline.iter().flat_map(move |view| {
            view.spans.iter().map(move |s| {
                vec![
                    r.strategy.clone(),
                    view.rank.to_string(),
                    s.stream.clone(),
                    s.category.clone(),
                    s.op.clone(),
                    s.start_ns.to_string(),
                    s.end_ns.to_string(),
                    s.bytes.map_or_else(String::new, |b| b.to_string()),
                ]
            })
        })
    });
    write_records(std::iter::once(header).chain(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{StrategyRun, TierRow};

    #[test]
    fn the_summary_has_one_schema_whatever_the_runs_contain() {
        let empty = SimReport {
            runs: vec![StrategyRun::default()],
            ..SimReport::default()
        };
        let mut run = StrategyRun::default();
        run.exposed_comm_by_category_s.insert("ep".into(), 0.5);
        run.peak_memory_by_tag.insert("grads".into(), 7);
        run.tier_bytes.push(TierRow {
            tier: "inter-supernode".into(),
            collectives: 3,
            bytes: 9,
        });
        let busy = SimReport {
            runs: vec![run],
            ..SimReport::default()
        };
        let header = |r: &SimReport| summary_csv(r).lines().next().unwrap().to_string();
        assert_eq!(header(&empty), header(&busy));
        let h = header(&empty);
        for col in [
            "exposed_comm_fsdp-ag_s",
            "exposed_comm_optimizer_s",
            "intra-machine_bytes",
            "inter-supernode_collectives",
            "peak_activations_bytes",
            "optimizer_inter-supernode_bytes",
        ] {
            assert!(h.split(',').any(|c| c == col), "{col} missing: {h}");
        }
        assert!(!h.contains("exposed_comm_compute_s"), "{h}");
        let busy_csv = summary_csv(&busy);
        let row: Vec<&str> = busy_csv.lines().nth(1).unwrap().split(',').collect();
        let col = |name: &str| h.split(',').position(|c| c == name).unwrap();
        assert_eq!(row[col("exposed_comm_ep_s")], "0.5");
        assert_eq!(row[col("inter-supernode_bytes")], "9");
        assert_eq!(row[col("peak_grads_bytes")], "7");
        assert_eq!(row[col("intra-machine_bytes")], "0");
    }
}
