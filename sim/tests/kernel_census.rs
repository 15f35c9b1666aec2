//! Kernel and collective census of rank 0's step program: per op-name family (layer and
//! micro-batch indices folded), the device kernels and collectives an eager step of the
//! scenario launches. `cargo test --release -p hpfsdp-sim --test kernel_census -- --ignored
//! --nocapture` prints the table for experiment A micro batch 2 and experiment B; the cheap
//! test checks the census adds up to the launch counts `calibrate` reports.

use hpfsdp_plan::program::{Payload, StepProgram};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::result::LaunchCounts;
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use std::collections::BTreeMap;
use std::path::Path;

fn rank0(scenario: &str) -> StepProgram {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let s = Scenario::load(&root.join(scenario)).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, "hyperparallel", None, true).unwrap();
    prepared.workload.units[0].program.clone()
}

/// An op name with every run of digits replaced by `#` (layer, micro-batch, bucket indices).
fn family(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_digits = false;
    for ch in name.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(ch);
            in_digits = false;
        }
    }
    out
}

/// Per family: (ops, device kernels, collectives by kind).
#[derive(Default, Debug)]
struct Row {
    ops: u64,
    kernels: u64,
    collectives: BTreeMap<String, u64>,
}

fn census(p: &StepProgram) -> BTreeMap<String, Row> {
    let mut out: BTreeMap<String, Row> = BTreeMap::new();
    for op in &p.ops {
        let key = format!(
            "{:?} {}",
            op.category,
            family(op.name.as_deref().unwrap_or("<unnamed>"))
        );
        let row = out.entry(key).or_default();
        row.ops += 1;
        match &op.payload {
            Payload::Compute(w) => row.kernels += u64::from(w.kernels),
            Payload::Copy(w) => row.kernels += u64::from(w.kernels),
            Payload::Collective(c) => {
                *row.collectives.entry(format!("{:?}", c.kind)).or_default() += 1;
            }
            Payload::Host { .. } => {}
        }
    }
    out
}

fn print(scenario: &str) {
    let p = rank0(scenario);
    let c = census(&p);
    let launches = LaunchCounts::of(&p);
    println!("== {scenario}: rank 0 {launches:?}");
    println!(
        "{:>8} {:>9}  {:<40} family",
        "ops", "kernels", "collectives"
    );
    for (k, r) in &c {
        let coll = r
            .collectives
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(",");
        println!("{:>8} {:>9}  {:<40} {k}", r.ops, r.kernels, coll);
    }
}

#[test]
fn census_adds_up_to_the_launch_counts() {
    let p = rank0("scenarios/paper/exp-b.toml");
    let c = census(&p);
    let launches = LaunchCounts::of(&p);
    let kernels: u64 = c.values().map(|r| r.kernels).sum();
    let coll: u64 = c.values().flat_map(|r| r.collectives.values()).sum();
    assert_eq!(
        (kernels, coll),
        (launches.device_kernels, launches.collectives)
    );
    assert_eq!(family("mb3.layers.47.fwd"), "mb#.layers.#.fwd");
}

/// Collectives of one op family (all kinds).
fn collectives(c: &BTreeMap<String, Row>, family: &str) -> u64 {
    c.iter()
        .filter(|(k, _)| k.ends_with(family))
        .flat_map(|(_, r)| r.collectives.values())
        .sum()
}

#[test]
fn experiment_a_collectives_follow_the_hyperparallel_sources() {
    let a = census(&rank0("scenarios/paper/exp-a-mbs2.toml"));
    // 48 MoE layers x 4 micro-batches: counts, tokens and expert ids forward
    // (ep_routed_forward), tokens back in backward; combine both ways.
    let mb_layers = 48 * 4;
    assert_eq!(collectives(&a, "mlp.dispatch.counts.ep.fwd"), mb_layers);
    assert_eq!(collectives(&a, "mlp.dispatch.expert_ids.ep.fwd"), mb_layers);
    assert_eq!(collectives(&a, "mlp.dispatch.ep.bwd"), mb_layers);
    assert_eq!(collectives(&a, "mlp.combine.ep.fwd"), mb_layers);
    // The MoE block is boundary identity on tp under TP-extend-EP; attention keeps its
    // sequence-parallel gather and reduce-scatter.
    assert_eq!(collectives(&a, "mlp.in.hidden_states.tp.fwd"), 0);
    assert_eq!(collectives(&a, "mlp.out.hidden_states.tp.fwd"), 0);
    assert_eq!(
        collectives(&a, "self_attn.in.hidden_states.tp.fwd"),
        mb_layers
    );
    // One TP gradient all-reduce per TP-replicated parameter (48 x 5 + the final norm) in
    // the root callback of every micro-batch (`launch_tp_replicate_reduce_and_apply`).
    assert_eq!(collectives(&a, "grad_sync.tp"), (48 * 5 + 1) * 4);
    // Trainer: three scalar all-reduces per micro-batch with SP, five for the clip norm.
    assert_eq!(collectives(&a, "loss_metrics.tokens.tp"), 4);
    assert_eq!(collectives(&a, "loss_metrics.step_tokens.dp"), 4);
    assert_eq!(collectives(&a, "loss_metrics.global.dp"), 4);
    assert_eq!(collectives(&a, "clip.norm.b#.ar"), 5);
    // Experiment B (pure FSDP, one micro-batch): no TP, no EP; two loss all-reduces and one
    // clip all-reduce.
    let b = census(&rank0("scenarios/paper/exp-b.toml"));
    assert_eq!(collectives(&b, "grad_sync.tp"), 0);
    assert_eq!(collectives(&b, "loss_metrics.tokens.tp"), 0);
    assert_eq!(collectives(&b, "loss_metrics.step_tokens.dp"), 1);
    assert_eq!(collectives(&b, "clip.norm.b#.ar"), 1);
}

/// Prints the census of experiment A micro batch 2 and experiment B (run with --ignored
/// --nocapture).
#[test]
#[ignore]
fn print_census() {
    print("scenarios/paper/exp-a-mbs2.toml");
    print("scenarios/paper/exp-b.toml");
}
