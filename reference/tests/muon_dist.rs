//! Distributed Muon against naive distributed Muon and single-device Muon, bit for bit, after
//! three steps, on plans built from scenarios: FSDP (4 shards), uneven shards (3-way), HSDP
//! with split replica subgroups, TP on the matrix plane, EP with fused 3-D experts (local
//! path), and MLA + MoE with matrix-splitting adapters.

use std::path::Path;
use std::time::Instant;

use hpfsdp_plan::muon::OptimizerRoute;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::model::ParamSet;
use hpfsdp_reference::muon::{AdapterRules, MatrixSplit, MuonConfig, MuonPreset, MuonSetup};

const STEPS: u64 = 3;

fn verify_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/verify")
}

/// A scenario on one of the verify models with its own mesh and topology (independent of the
/// verify scenario files, which other work may change).
fn scenario(model: &str, mesh: &str, topology: &str) -> Scenario {
    inline(&format!(
        "name = \"muon-test\"\nhardware = \"ascend-910c-a3\"\n[model]\ncompact = \"models/{model}\"\n\
         dtype = \"f32\"\n[mesh]\n{mesh}\n[topology]\n{topology}\n[train]\nseq_len = 32\n\
         global_batch = 48\nmicro_batch = 1\n[optimizer]\nkind = \"muon+adamw\"\n\
         preset = \"hyperparallel\"\n"
    ))
}

fn one_machine(dies: usize) -> String {
    format!("dies_per_machine = {dies}\nmachines_per_supernode = 1\nsupernodes = 1")
}

fn inline(text: &str) -> Scenario {
    Scenario::from_str_at(text, &verify_dir().join("inline.toml")).unwrap_or_else(|e| panic!("{e}"))
}

fn muon_names(setup: &MuonSetup) -> Vec<String> {
    setup
        .routed
        .iter()
        .filter(|r| r.route == OptimizerRoute::Muon)
        .map(|r| r.name.clone())
        .collect()
}

fn bit_eq(a: &ParamSet<f32>, b: &ParamSet<f32>, name: &str) -> bool {
    a.get(name).unwrap().bit_eq(b.get(name).unwrap())
}

/// Runs all three executors and checks bitwise equality; returns (dedup NS, naive NS, single
/// NS) matrices per step summed over ranks.
fn check(setup: &MuonSetup, label: &str) -> (usize, usize, usize) {
    let t0 = Instant::now();
    let params = setup.random_set(1, 0.02).unwrap();
    let grads: Vec<_> = (0..STEPS)
        .map(|s| setup.random_set(1000 + s, 1.0).unwrap())
        .collect();
    let (single, single_ns) = setup.run_single(&params, &grads).unwrap();
    let dedup = setup.run_distributed(&params, &grads, false).unwrap();
    let naive = setup.run_distributed(&params, &grads, true).unwrap();
    let names = muon_names(setup);
    assert!(!names.is_empty(), "{label}: no Muon parameter");
    for (rank, (d, n)) in dedup.locals.iter().zip(&naive.locals).enumerate() {
        for name in &names {
            assert!(
                bit_eq(d, n, name),
                "{label}: rank {rank} {name}: dedup != naive"
            );
        }
    }
    // Gathering checks that every replica holds identical bits. AdamW parameters (chained
    // before Muon) are compared too.
    let gathered = setup.gather_set(&dedup.locals).unwrap();
    let gathered_naive = setup.gather_set(&naive.locals).unwrap();
    assert!(gathered_naive.bit_eq(&gathered), "{label}: naive != dedup");
    for name in params.names() {
        assert!(
            bit_eq(&gathered, &single, name),
            "{label}: {name}: distributed != single"
        );
        assert!(
            !bit_eq(&gathered, &params, name),
            "{label}: {name} did not move"
        );
    }
    assert!(names.len() < params.len(), "{label}: no AdamW parameter");
    let sum = |runs: &Vec<Vec<hpfsdp_reference::muon::StepReport>>| -> usize {
        runs.iter().map(|r| r[0].ns_matrices).sum()
    };
    eprintln!(
        "{label}: {:.2}s; NS matrices per step: dedup {} naive {} single {}",
        t0.elapsed().as_secs_f64(),
        sum(&dedup.reports),
        sum(&naive.reports),
        single_ns[0]
    );
    (sum(&dedup.reports), sum(&naive.reports), single_ns[0])
}

#[test]
fn fsdp4_dedup_equals_naive_and_single_device() {
    let setup = MuonSetup::from_scenario(
        &scenario("tiny-dense.toml", "dp_shard = 4", &one_machine(4)),
        &AdapterRules::none(),
    )
    .unwrap();
    let (dedup, naive, single) = check(&setup, "fsdp4");
    assert_eq!(dedup, single, "each matrix once per shard group");
    assert_eq!(naive, 4 * single, "naive repeats NS on all 4 shard ranks");
}

#[test]
fn uneven_fsdp3_dedup_equals_naive_and_single_device() {
    let setup = MuonSetup::from_scenario(
        &scenario("tiny-uneven.toml", "dp_shard = 3", &one_machine(3)),
        &AdapterRules::none(),
    )
    .unwrap();
    let uneven = setup.domains.all().iter().any(|d| {
        (0..3)
            .map(|r| d.local_numel(r))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    });
    assert!(uneven, "the scenario must have uneven shards");
    let (dedup, naive, single) = check(&setup, "uneven-fsdp3");
    assert_eq!(dedup, single);
    assert_eq!(naive, 3 * single);
}

const HSDP_SPLIT: &str = r#"
name = "hsdp-4x2-split"
hardware = "ascend-910c-a3"
[model]
compact = "models/tiny-dense.toml"
dtype = "f32"
[mesh]
dp_replicate = 4
dp_shard = 2
[topology]
dies_per_machine = 2
machines_per_supernode = 2
supernodes = 2
[train]
seq_len = 32
global_batch = 8
micro_batch = 1
[optimizer]
kind = "muon+adamw"
preset = "hyperparallel"
"#;

#[test]
fn hsdp_with_split_replica_subgroups_dedups_and_keeps_replicas_identical() {
    let setup = MuonSetup::from_scenario(&inline(HSDP_SPLIT), &AdapterRules::none()).unwrap();
    assert_eq!(
        setup.plan.replica_count,
        Some(2),
        "4 replicas on 2-die machines split in 2"
    );
    let (dedup, naive, single) = check(&setup, "hsdp-4x2-split");
    // Each matrix once per shard group per replica subgroup: 2 subgroups.
    assert_eq!(dedup, 2 * single);
    assert_eq!(naive, 8 * single);
}

#[test]
fn tp2_fsdp2_matrix_plane_sharded_by_tp() {
    let setup = MuonSetup::from_scenario(
        &scenario("tiny-dense.toml", "dp_shard = 2\ntp = 2", &one_machine(4)),
        &AdapterRules::none(),
    )
    .unwrap();
    let tp_cut = setup
        .plan
        .params
        .iter()
        .any(|p| p.needs_gather && p.shard_axes.iter().any(|a| a.axis == "tp"));
    assert!(tp_cut, "some matrix must be cut by tp");
    let (dedup, _, single) = check(&setup, "tp2-fsdp2");
    assert_eq!(dedup, single);
}

#[test]
fn ep2_fused_experts_run_locally() {
    let setup = MuonSetup::from_scenario(
        &scenario(
            "tiny-moe.toml",
            "dp_shard = 4\nep = 2\nedp_shard = 2",
            &one_machine(4),
        ),
        &AdapterRules::none(),
    )
    .unwrap();
    let experts: Vec<_> = setup
        .plan
        .params
        .iter()
        .filter(|p| p.name.contains("experts"))
        .collect();
    assert!(!experts.is_empty());
    assert!(
        experts
            .iter()
            .all(|p| !p.needs_gather && p.shape.len() == 3)
    );
    check(&setup, "ep2-fsdp2");
}

#[test]
fn mla_moe_with_adapters_and_every_preset() {
    let scenario = scenario(
        "tiny-mla.toml",
        "dp_replicate = 2\ndp_shard = 2",
        "dies_per_machine = 2\nmachines_per_supernode = 1\nsupernodes = 2",
    );
    // tiny-mla: 4 heads, kv_lora 32, rope 8, nope 16, v 16.
    let rules = AdapterRules::none()
        .with(
            "kv_a_proj_with_mqa.weight",
            MatrixSplit::RowBlocks(vec![32, 8]),
        )
        .with(
            "q_b_proj.weight",
            MatrixSplit::HeadRowBlocks {
                heads: 4,
                sizes: vec![16, 8],
            },
        )
        .with(
            "kv_b_proj.weight",
            MatrixSplit::HeadRowBlocks {
                heads: 4,
                sizes: vec![16, 16],
            },
        )
        .with("experts.gate_up_proj", MatrixSplit::GateUp)
        .with("experts.down_proj", MatrixSplit::Transpose);
    let base = MuonSetup::from_scenario(&scenario, &rules).unwrap();
    for cfg in [
        MuonConfig::preset(MuonPreset::HyperParallel),
        MuonConfig::preset(MuonPreset::Moonlight),
        MuonConfig::torch_match_rms_adamw(),
    ] {
        let setup = MuonSetup {
            cfg: cfg.clone(),
            ..base.clone()
        };
        check(&setup, &format!("mla-hsdp2x2 {:?}", cfg.preset));
    }
    let none = MuonSetup::from_scenario(&scenario, &AdapterRules::none()).unwrap();
    let params = none.random_set(1, 0.02).unwrap();
    let grads = vec![none.random_set(5, 1.0).unwrap()];
    let (split, _) = base.run_single(&params, &grads).unwrap();
    let (whole, _) = none.run_single(&params, &grads).unwrap();
    assert!(!bit_eq(
        &split,
        &whole,
        "model.layers.0.self_attn.q_b_proj.weight"
    ));
}
