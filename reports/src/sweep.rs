//! The sweep report: one row per (point, strategy) of `hpfsdp sweep`, and its CSV. Its HTML
//! page is [`crate::sweep_page`], its chart [`crate::sweep_chart`]. Pure functions of their
//! input: the same rows give byte-identical files.

use serde::Serialize;

/// One simulated (or rejected) point of a sweep with one strategy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepRow {
    /// Index of the point in the cartesian product (first `--vary` key varies slowest).
    pub point: usize,
    /// The value of each varied key at this point, in key order.
    pub values: Vec<String>,
    /// Strategy name (empty for a point rejected before any strategy ran).
    pub strategy: String,
    /// `ok`, `over-memory`, `invalid` (scenario or lint error) or `error` (simulation failed).
    pub status: String,
    /// Predicted step time, seconds.
    pub step_time_s: Option<f64>,
    /// Tokens per second of the whole job.
    pub tokens_per_s: Option<f64>,
    /// Highest peak memory over ranks, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Device HBM capacity, bytes.
    pub hbm_capacity_bytes: Option<u64>,
    /// The hardware profile the point was simulated on (absent when it was not simulated).
    pub hardware: Option<String>,
    /// On the Pareto front of tokens/s (higher) vs peak memory (lower) among feasible rows.
    pub pareto: bool,
    /// The best feasible row (highest tokens/s; ties: lower memory, then earlier).
    pub best: bool,
    /// Why the point is invalid or failed (the lint or the scenario error), else empty.
    pub message: String,
}

/// The whole sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepReport {
    /// Scenario name.
    pub scenario: String,
    /// Hardware profile name (every profile simulated on, comma-separated, when varied).
    pub hardware: String,
    /// The varied keys, in `--vary` order.
    pub keys: Vec<String>,
    /// Rows by point, then strategy.
    pub rows: Vec<SweepRow>,
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// `sweep.csv`: `point`, one column per key, `strategy`, `status`, `step_time_s`,
/// `tokens_per_s`, `peak_memory_bytes`, `hbm_capacity_bytes`, `hardware_profile` (the profile
/// the row was simulated on), `pareto`, `best`, `message`.
pub fn sweep_csv(report: &SweepReport) -> String {
    let mut header = vec!["point".to_string()];
    header.extend(report.keys.iter().cloned());
    header.extend(
        [
            "strategy",
            "status",
            "step_time_s",
            "tokens_per_s",
            "peak_memory_bytes",
            "hbm_capacity_bytes",
            "hardware_profile",
            "pareto",
            "best",
            "message",
        ]
        .map(String::from),
    );
    let rows = report.rows.iter().map(|r| {
        let mut cells = vec![r.point.to_string()];
        cells.extend(r.values.iter().cloned());
        cells.extend([
            r.strategy.clone(),
            r.status.clone(),
            opt(r.step_time_s),
            opt(r.tokens_per_s),
            opt(r.peak_memory_bytes),
            opt(r.hbm_capacity_bytes),
            r.hardware.clone().unwrap_or_default(),
            r.pareto.to_string(),
            r.best.to_string(),
            r.message.clone(),
        ]);
        cells
    });
    crate::csv::write_records(std::iter::once(header).chain(rows))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two rows: point 0 feasible and best, point 1 invalid.
    pub(crate) fn two_point_report() -> SweepReport {
        let row = |point, tps: Option<f64>, best, status: &str| SweepRow {
            point,
            values: vec![point.to_string()],
            strategy: "fsdp2".into(),
            status: status.into(),
            step_time_s: tps.map(|_| 1.0),
            tokens_per_s: tps,
            peak_memory_bytes: tps.map(|_| 10_000_000_000),
            hbm_capacity_bytes: Some(64_000_000_000),
            hardware: tps.map(|_| "hw".to_string()),
            pareto: best,
            best,
            message: if status == "invalid" {
                "error[indivisible-shard]: x".into()
            } else {
                String::new()
            },
        };
        SweepReport {
            scenario: "demo".into(),
            hardware: "hw".into(),
            keys: vec!["mesh.dp_shard".into()],
            rows: vec![
                row(0, Some(100.0), true, "ok"),
                row(1, None, false, "invalid"),
            ],
        }
    }

    #[test]
    fn csv_carries_every_row() {
        let report = two_point_report();
        let csv = sweep_csv(&report);
        assert!(csv.starts_with("point,mesh.dp_shard,strategy,status,"));
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.contains("error[indivisible-shard]: x"));
    }
}
