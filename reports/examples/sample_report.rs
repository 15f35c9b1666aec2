//! Writes a synthetic simulation report (two strategies, one with a 30k-span timeline) to a
//! directory, to look at the HTML and check its size.
//!
//! ```text
//! cargo run -p hpfsdp-reports --example sample_report -- /tmp/sample-report
//! ```

use hpfsdp_reports::{
    CollectiveRow, RankTimelineView, SimReport, SpanView, StrategyRun, TierRow, write_sim_report,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A synthetic FSDP-like step: per layer an all-gather, `kernels` compute kernels, a copy,
/// and (backward) a reduce-scatter; returns the spans and the step end in nanoseconds.
fn synthetic_timeline(layers: u64, kernels: u64, kernel_ns: u64) -> (Vec<SpanView>, u64) {
    let mut spans = Vec::new();
    let mut t_compute = 0u64;
    let mut t_ag = 0u64;
    let mut t_rs = 0u64;
    let span =
        |op: String, stream: &str, category: &str, s: u64, e: u64, bytes: Option<u64>| SpanView {
            op,
            stream: stream.into(),
            category: category.into(),
            start_ns: s,
            end_ns: e,
            bytes,
        };
    for pass in ["fwd", "bwd"] {
        for l in 0..layers {
            let ag_ns = 40 * kernel_ns;
            spans.push(span(
                format!("layers.{l}.{pass}.ag"),
                "all-gather",
                "fsdp-ag",
                t_ag,
                t_ag + ag_ns,
                Some(64 << 20),
            ));
            t_ag += ag_ns;
            let start = t_compute.max(t_ag);
            spans.push(span(
                format!("layers.{l}.{pass}.copy-in"),
                "copy",
                "copy",
                start,
                start + kernel_ns * 3,
                Some(8 << 20),
            ));
            t_compute = start + kernel_ns * 3;
            let factor = if pass == "bwd" { 2 } else { 1 };
            for k in 0..kernels {
                let d = kernel_ns * factor + (k % 7) * 50;
                spans.push(span(
                    format!("layers.{l}.{pass}.k{k}"),
                    "compute",
                    "compute",
                    t_compute,
                    t_compute + d,
                    None,
                ));
                if k % 16 == 0 {
                    spans.push(span(
                        format!("layers.{l}.{pass}.launch{k}"),
                        "host",
                        "host",
                        t_compute,
                        t_compute + d / 3,
                        None,
                    ));
                }
                t_compute += d;
            }
            if pass == "bwd" {
                let s = t_rs.max(t_compute);
                spans.push(span(
                    format!("layers.{l}.rs"),
                    "reduce-scatter",
                    "fsdp-rs",
                    s,
                    s + 50 * kernel_ns,
                    Some(32 << 20),
                ));
                t_rs = s + 50 * kernel_ns;
            }
        }
    }
    let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    (spans, end)
}

fn run(strategy: &str, layers: u64, kernels: u64, kernel_ns: u64) -> StrategyRun {
    let (spans, end_ns) = synthetic_timeline(layers, kernels, kernel_ns);
    let step_s = end_ns as f64 * 1e-9;
    let memory_series: Vec<(u64, u64)> = spans
        .iter()
        .filter(|s| s.category == "fsdp-ag" || s.category == "fsdp-rs")
        .enumerate()
        .map(|(i, s)| {
            let layer = i as u64 % layers;
            let up = if s.category == "fsdp-ag" {
                layer
            } else {
                layers - layer
            };
            (s.start_ns, (20 << 30) + up * (300 << 20))
        })
        .collect();
    StrategyRun {
        strategy: strategy.into(),
        optimizer_name: "adamw".into(),
        optimizer: None,
        memory_spread: Default::default(),
        step_time_s: step_s,
        tokens_per_s: Some(65536.0 / step_s),
        mfu: Some(0.38),
        compute_s: step_s * 0.82,
        copy_s: step_s * 0.03,
        host_s: step_s * 0.2,
        idle_s: step_s * 0.02,
        comm_s: step_s * 0.6,
        exposed_comm_s: step_s * 0.14,
        exposed_comm_by_category_s: BTreeMap::from([
            ("fsdp-ag".to_string(), step_s * 0.09),
            ("fsdp-rs".to_string(), step_s * 0.05),
        ]),
        overlap_rate: 1.0 - 0.14 / 0.6,
        collectives: vec![
            CollectiveRow {
                category: "fsdp-ag".into(),
                kind: "all-gather".into(),
                tier: "intra-supernode".into(),
                count: 2 * layers,
                bytes: 2 * layers * (64 << 20),
            },
            CollectiveRow {
                category: "fsdp-rs".into(),
                kind: "reduce-scatter".into(),
                tier: "intra-supernode".into(),
                count: layers,
                bytes: layers * (32 << 20),
            },
            CollectiveRow {
                category: "fsdp-ar".into(),
                kind: "all-reduce".into(),
                tier: "inter-supernode".into(),
                count: 1,
                bytes: 2 << 30,
            },
        ],
        tier_bytes: vec![
            TierRow {
                tier: "intra-supernode".into(),
                bytes: layers * (160 << 20),
                collectives: 3 * layers,
            },
            TierRow {
                tier: "inter-supernode".into(),
                bytes: 2 << 30,
                collectives: 1,
            },
        ],
        peak_memory_bytes: (20 << 30) + layers * (300 << 20),
        peak_memory_by_tag: BTreeMap::from([
            ("params".to_string(), 6 << 30),
            ("grads".to_string(), 4 << 30),
            ("activations".to_string(), 18 << 30),
            ("optimizer".to_string(), 8 << 30),
        ]),
        memory_fits: true,
        memory_series,
        rank0_timeline: Some(RankTimelineView { rank: 0, spans }),
    }
}

fn main() {
    let dir = std::env::args().nth(1).map_or_else(
        || std::env::temp_dir().join("hpfsdp-sample-report"),
        PathBuf::from,
    );
    let report = SimReport {
        scenario: "llama-8b-like on 2 supernodes (synthetic)".into(),
        description: "Synthetic timelines to exercise the report writers; not a prediction.".into(),
        hardware: "ascend-910c-a3".into(),
        world_size: 768,
        runs: vec![
            run("hyperparallel", 32, 460, 2_000),
            run("fsdp2", 32, 40, 23_000),
        ],
        device_memory_bytes: Some(64 << 30),
        whatif: Vec::new(),
    };
    match write_sim_report(&dir, &report) {
        Ok(paths) => {
            for p in paths {
                let size = std::fs::metadata(&p).map_or(0, |m| m.len());
                println!("{:>10} bytes  {}", size, p.display());
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
