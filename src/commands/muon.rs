//! `hpfsdp muon`: what layout-driven distributed Muon saves on a scenario (momentum memory and
//! Newton-Schulz work per rank, deduplicated vs naive), and how accurate each preset's
//! Newton-Schulz iteration is against an exact SVD.

use crate::table::Table;
use anyhow::{Context, Result};
use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::muon::{OptimizerRoute, build_muon_plan};
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::muon::{
    AdapterRules, MuonDomains, accuracy_table, dedup_stats, route_params,
};
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;

/// Per-rank figures of `--json`.
#[derive(Serialize)]
struct RankJson {
    rank: usize,
    momentum_elems_dedup: u64,
    momentum_elems_naive: u64,
    ns_matrices_dedup: u64,
    ns_matrices_naive: u64,
}

/// The `--json` document.
#[derive(Serialize)]
struct MuonJson<'a> {
    scenario: &'a str,
    muon_params: usize,
    adamw_params: usize,
    batches: usize,
    ns_matrices_single_device: u64,
    momentum_elems_single_device: u64,
    per_rank: Vec<RankJson>,
}

fn summary(values: impl Iterator<Item = u64> + Clone) -> String {
    let n = values.clone().count().max(1) as f64;
    let min = values.clone().min().unwrap_or(0);
    let max = values.clone().max().unwrap_or(0);
    let total: u64 = values.sum();
    format!(
        "{total} total, per rank min {min} / mean {:.1} / max {max}",
        total as f64 / n
    )
}

/// Runs the command.
pub fn run(path: &Path, json: bool, accuracy: bool, allow_lint_errors: bool) -> Result<ExitCode> {
    let scenario = Scenario::load(path)?;
    let sharding = plan(&scenario.model, &scenario.planner_input());
    if let Some(code) = crate::commands::lint_gate::refuse_lint_errors(
        &scenario,
        &sharding,
        allow_lint_errors,
        "muon",
        true,
    ) {
        return Ok(code);
    }
    let fsdp = build_fsdp_plan(&scenario, &sharding);
    let muon = build_muon_plan(&scenario, &sharding, &fsdp);
    let routed = route_params(&muon, &AdapterRules::none()).context("routing parameters")?;
    let domains = MuonDomains::from_scenario(&scenario, &sharding, &muon)
        .context("building the Muon shard and replica domains")?;
    let stats = dedup_stats(&muon, &domains, &routed).context("computing dedup statistics")?;
    let muon_params = muon
        .params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon)
        .count();
    if json {
        let doc = MuonJson {
            scenario: &scenario.file.name,
            muon_params,
            adamw_params: muon.params.len() - muon_params,
            batches: muon.batches.len(),
            ns_matrices_single_device: stats.ns_matrices_single,
            momentum_elems_single_device: stats.momentum_elems_single,
            per_rank: stats
                .per_rank
                .iter()
                .enumerate()
                .map(|(rank, l)| RankJson {
                    rank,
                    momentum_elems_dedup: l.momentum_elems_dedup,
                    momentum_elems_naive: l.momentum_elems_naive,
                    ns_matrices_dedup: l.ns_matrices_dedup,
                    ns_matrices_naive: l.ns_matrices_naive,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    let total = stats.total();
    println!(
        "scenario {}: {} ranks, {} Muon / {} AdamW params, {} Muon batches, replica subgroups {}",
        scenario.file.name,
        stats.per_rank.len(),
        muon_params,
        muon.params.len() - muon_params,
        muon.batches.len(),
        muon.replica_subgroup_summary()
    );
    for l in &muon.lints {
        println!("{l}");
    }
    let mut t = Table::new(&[
        "figure",
        "deduplicated (hyperparallel)",
        "naive (gather everywhere)",
    ]);
    t.row(vec![
        "momentum elements".into(),
        summary(stats.per_rank.iter().map(|l| l.momentum_elems_dedup)),
        summary(stats.per_rank.iter().map(|l| l.momentum_elems_naive)),
    ]);
    t.row(vec![
        "Newton-Schulz matrices per step".into(),
        summary(stats.per_rank.iter().map(|l| l.ns_matrices_dedup)),
        summary(stats.per_rank.iter().map(|l| l.ns_matrices_naive)),
    ]);
    print!("{}", t.render());
    println!(
        "single device: {} momentum elements, {} Newton-Schulz matrices per step",
        stats.momentum_elems_single, stats.ns_matrices_single
    );
    if total.momentum_elems_dedup > 0 {
        println!(
            "naive / deduplicated: momentum {:.2}x, Newton-Schulz work {:.2}x",
            total.momentum_elems_naive as f64 / total.momentum_elems_dedup as f64,
            total.ns_matrices_naive as f64 / total.ns_matrices_dedup.max(1) as f64
        );
    }
    if accuracy {
        println!("\nNewton-Schulz accuracy per preset (bf16 per operation) against an f64 SVD:");
        let mut t = Table::new(&[
            "preset",
            "shape",
            "steps",
            "sigma min",
            "sigma max",
            "max |XX^T - I|",
            "max |X - UV^T|",
        ]);
        for a in accuracy_table(11).context("measuring Newton-Schulz accuracy")? {
            t.row(vec![
                a.preset.to_string(),
                format!("{}x{}", a.rows, a.cols),
                a.steps.to_string(),
                format!("{:.4}", a.sigma_min),
                format!("{:.4}", a.sigma_max),
                format!("{:.4}", a.orthogonality_error),
                format!("{:.4}", a.polar_error),
            ]);
        }
        print!("{}", t.render());
    }
    Ok(ExitCode::SUCCESS)
}
