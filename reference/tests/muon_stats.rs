//! Dedup statistics and Newton-Schulz accuracy: the plan's predicted momentum memory and NS
//! work per rank match what the engines report; replicated matrices keep 1/R_s of the naive
//! momentum; each matrix runs once per shard group and replica subgroup; per-expert weights
//! held by their EP owner; NS accuracy of every preset against an f64 SVD.

use std::path::Path;

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::muon::{
    AdapterRules, MuonConfig, MuonPreset, MuonSetup, accuracy_table, dedup_stats, ns_accuracy,
};

fn verify_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/verify")
}

/// A Muon setup on one of the verify models with its own mesh and topology; `model_extra`
/// goes into the `[model]` section.
fn setup(model: &str, model_extra: &str, mesh: &str, topology: &str) -> MuonSetup {
    let text = format!(
        "name = \"muon-test\"\nhardware = \"ascend-910c-a3\"\n[model]\ncompact = \"models/{model}\"\n\
         dtype = \"f32\"\n{model_extra}[mesh]\n{mesh}\n[topology]\n{topology}\n[train]\nseq_len = 32\n\
         global_batch = 48\nmicro_batch = 1\n[optimizer]\nkind = \"muon+adamw\"\n\
         preset = \"hyperparallel\"\n"
    );
    let scenario = Scenario::from_str_at(&text, &verify_dir().join("inline.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    MuonSetup::from_scenario(&scenario, &AdapterRules::none()).unwrap()
}

fn one_machine(dies: usize) -> String {
    format!("dies_per_machine = {dies}\nmachines_per_supernode = 1\nsupernodes = 1")
}

/// Runs one step of both engines and checks every rank's report against the prediction.
fn predicted_equals_measured(setup: &MuonSetup, label: &str) -> hpfsdp_reference::muon::DedupStats {
    let stats = dedup_stats(&setup.plan, &setup.domains, &setup.routed).unwrap();
    let params = setup.random_set(3, 0.02).unwrap();
    let grads = vec![setup.random_set(4, 1.0).unwrap()];
    let dedup = setup.run_distributed(&params, &grads, false).unwrap();
    let naive = setup.run_distributed(&params, &grads, true).unwrap();
    let (single, ns_single) = setup.run_single(&params, &grads).unwrap();
    assert_eq!(ns_single[0] as u64, stats.ns_matrices_single, "{label}");
    for (rank, load) in stats.per_rank.iter().enumerate() {
        let d = &dedup.reports[rank][0];
        let n = &naive.reports[rank][0];
        assert_eq!(
            d.ns_matrices as u64, load.ns_matrices_dedup,
            "{label} rank {rank}"
        );
        assert_eq!(
            d.momentum_elems as u64, load.momentum_elems_dedup,
            "{label} rank {rank}"
        );
        assert_eq!(
            n.ns_matrices as u64, load.ns_matrices_naive,
            "{label} rank {rank}"
        );
        assert_eq!(
            n.momentum_elems as u64, load.momentum_elems_naive,
            "{label} rank {rank}"
        );
        assert!(d.max_in_flight <= 1, "{label}: at most one batch in flight");
    }
    assert!(
        setup.gather_set(&dedup.locals).unwrap().bit_eq(&single),
        "{label}"
    );
    stats
}

#[test]
fn hsdp_split_state_is_one_over_rs_and_ns_once_per_subgroup() {
    // 4 replicas x 2 shards on 2-die machines: replica subgroups of R_s = 2.
    let split = setup(
        "tiny-dense.toml",
        "",
        "dp_replicate = 4\ndp_shard = 2",
        "dies_per_machine = 2\nmachines_per_supernode = 2\nsupernodes = 2",
    );
    assert_eq!(split.plan.replica_count, Some(2));
    let stats = predicted_equals_measured(&split, "hsdp 4x2 split");
    let t = stats.total();
    // Every Muon matrix is replicated 4 times; the engine keeps 1/R_s of naive's state.
    assert_eq!(t.momentum_elems_naive, 4 * stats.momentum_elems_single);
    assert_eq!(t.momentum_elems_dedup * 2, t.momentum_elems_naive);
    // Once per shard group and replica subgroup (2 subgroups), naive on all 8 ranks.
    assert_eq!(t.ns_matrices_dedup, 2 * stats.ns_matrices_single);
    assert_eq!(t.ns_matrices_naive, 8 * stats.ns_matrices_single);
    eprintln!("hsdp 4x2 split (R_s = 2) per rank: {:#?}", stats.per_rank);
}

#[test]
fn hsdp_unsplit_and_fsdp_and_ep_predictions_match_the_engines() {
    let hsdp = setup(
        "tiny-dense.toml",
        "",
        "dp_replicate = 2\ndp_shard = 4",
        "dies_per_machine = 4\nmachines_per_supernode = 1\nsupernodes = 2",
    );
    assert_eq!(hsdp.plan.replica_count, None);
    let s = predicted_equals_measured(&hsdp, "hsdp 2x4");
    assert_eq!(
        s.total().momentum_elems_dedup * 2,
        s.total().momentum_elems_naive
    );
    assert_eq!(s.total().ns_matrices_dedup, s.ns_matrices_single);
    let fsdp = setup("tiny-dense.toml", "", "dp_shard = 4", &one_machine(4));
    let s = predicted_equals_measured(&fsdp, "fsdp4");
    assert_eq!(s.total().momentum_elems_dedup, s.momentum_elems_single);
    assert_eq!(s.total().ns_matrices_naive, 4 * s.ns_matrices_single);
    let ep = setup(
        "tiny-moe.toml",
        "",
        "dp_shard = 4\nep = 2\nedp_shard = 2",
        &one_machine(4),
    );
    predicted_equals_measured(&ep, "ep2");
}

#[test]
fn per_expert_weights_live_on_their_ep_owner() {
    let fused = setup(
        "tiny-moe.toml",
        "",
        "dp_shard = 4\nep = 2\nedp_shard = 2",
        &one_machine(4),
    );
    let per_expert = setup(
        "tiny-moe.toml",
        "expert_layout = \"per_expert\"\n",
        "dp_shard = 4\nep = 2\nedp_shard = 2",
        &one_machine(4),
    );
    let held: Vec<_> = per_expert
        .domains
        .all()
        .iter()
        .filter(|d| d.holder.is_some())
        .collect();
    assert!(!held.is_empty(), "per-expert layout must give EP owners");
    assert!(fused.domains.all().iter().all(|d| d.holder.is_none()));
    predicted_equals_measured(&per_expert, "per-expert ep2");
}

#[test]
fn newton_schulz_accuracy_per_preset_against_svd() {
    let table = accuracy_table(11).unwrap();
    eprintln!("preset         shape     steps  sigma_min  sigma_max  max|XX^T-I|  max|X-UV^T|");
    for a in &table {
        eprintln!(
            "{:<14} {:>3}x{:<4} {:>5}  {:>9.4}  {:>9.4}  {:>11.4}  {:>11.4}",
            a.preset,
            a.rows,
            a.cols,
            a.steps,
            a.sigma_min,
            a.sigma_max,
            a.orthogonality_error,
            a.polar_error
        );
        assert!(a.sigma_min > 0.0 && a.sigma_max.is_finite());
        match a.preset {
            "hyperparallel" => {
                assert!(a.sigma_min > 0.9 && a.sigma_max < 1.1, "{a:?}");
                assert!(a.orthogonality_error < 0.12, "{a:?}");
            }
            _ => {
                assert!(a.sigma_min > 0.6 && a.sigma_max < 1.25, "{a:?}");
                // Legacy quintic: sigma in about [0.68, 1.14], so |sigma^2 - 1| up to ~0.54.
                assert!(a.orthogonality_error < 0.55, "{a:?}");
            }
        }
    }
    // asym5 is closer to the polar factor than the legacy quintic on the same matrix.
    let hp = ns_accuracy(&MuonConfig::preset(MuonPreset::HyperParallel), 64, 128, 11).unwrap();
    let kj = ns_accuracy(&MuonConfig::preset(MuonPreset::KellerJordan), 64, 128, 11).unwrap();
    assert!(hp.orthogonality_error < kj.orthogonality_error);
    assert!(hp.polar_error < kj.polar_error);
}
