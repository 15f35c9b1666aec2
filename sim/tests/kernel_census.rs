//! Kernel and collective census of rank 0's step program: per op-name family (layer and
//! micro-batch indices folded), the device kernels and collectives an eager step of the
//! scenario launches. `cargo test --release -p hpfsdp-sim --test kernel_census -- --ignored
//! --nocapture` prints the table for experiment A micro batch 2 and experiment B; the cheap
//! test checks the census adds up to the launch counts `calibrate` reports.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Payload, StepProgram};
use hpfsdp_sim::result::LaunchCounts;
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use std::collections::BTreeMap;
use std::path::Path;

fn rank0(scenario: &str) -> StepProgram {
    rank0_of(scenario, "hyperparallel")
}

/// Rank 0's program of `scenario` under `strategy`.
fn rank0_of(scenario: &str, strategy: &str) -> StepProgram {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let s = Scenario::load(&root.join(scenario)).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, strategy, None, true).unwrap();
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

/// Device kernels of the op families whose name ends with `family`.
fn kernels(c: &BTreeMap<String, Row>, family: &str) -> u64 {
    c.iter()
        .filter(|(k, _)| k.ends_with(family))
        .map(|(_, r)| r.kernels)
        .sum()
}

#[test]
fn experiment_a_launches_the_kernels_around_its_model_parallel_collectives() {
    // program/src/strategy/collective_staging.rs: HyperParallel's sequence-parallel boundary
    // collectives go through `differentiable_all_gather_concat` /
    // `differentiable_reduce_scatter` (torch.distributed.nn.functional list collectives), its
    // EP token exchanges through the list `dist.all_to_all`. Per layer and micro-batch
    // (48 x 4), with 2 sequences per micro-batch (sequence slices are not contiguous):
    let a = census(&rank0("scenarios/paper/exp-a-mbs2.toml"));
    let mb_layers = 48 * 4;
    // attention input gather: the cat forward; backward the 4 contiguous copies, the HCCL
    // all-to-all emulation's 2 concatenations, stack and sum.
    let attn_in = "self_attn.in.hidden_states.tp";
    assert_eq!(kernels(&a, &format!("{attn_in}.fwd.stage_out")), mb_layers);
    assert_eq!(
        kernels(&a, &format!("{attn_in}.bwd.stage_in")),
        6 * mb_layers
    );
    assert_eq!(
        kernels(&a, &format!("{attn_in}.bwd.stage_out")),
        2 * mb_layers
    );
    // attention output reduce-scatter: 4 chunk copies forward, the chunk gradient's cat back.
    let attn_out = "self_attn.out.hidden_states.tp";
    assert_eq!(
        kernels(&a, &format!("{attn_out}.fwd.stage_in")),
        4 * mb_layers
    );
    assert_eq!(kernels(&a, &format!("{attn_out}.bwd.stage_out")), mb_layers);
    // Five list all-to-alls per MoE layer and micro-batch (tokens, expert ids, combine
    // forward; tokens and combine backward), two concatenations each; the count exchange
    // (`all_to_all_single`) none.
    assert_eq!(kernels(&a, "mlp.dispatch.ep.fwd.stage_in"), 2 * mb_layers);
    assert_eq!(
        kernels(&a, "mlp.dispatch.expert_ids.ep.fwd.stage_in"),
        2 * mb_layers
    );
    assert_eq!(kernels(&a, "mlp.combine.ep.fwd.stage_in"), 2 * mb_layers);
    assert_eq!(kernels(&a, "mlp.dispatch.ep.bwd.stage_in"), 2 * mb_layers);
    assert_eq!(kernels(&a, "mlp.combine.ep.bwd.stage_in"), 2 * mb_layers);
    assert_eq!(kernels(&a, "dispatch.counts.ep.fwd.stage_in"), 0);
    let staged: u64 = a
        .iter()
        .filter(|(k, _)| k.contains(".stage_"))
        .map(|(_, r)| r.kernels)
        .sum();
    // Layers: (1 + 8 + 4 + 1) + 5 x 2 = 24 per layer and micro-batch; head and embedding per
    // micro-batch: lm_head input gather 1 + 8, logits gather 1, embedding reduce-scatter 4 + 1.
    assert_eq!(staged, 24 * mb_layers + 15 * 4);
}

#[test]
fn muon_fused_gathers_unpack_and_move_shard_dims() {
    // hyper-parallel `fused_allgather_dtensor_params` (muon/hyperparallel.rs
    // `gather_staging`): one `torch.cat` per parameter unpacked after each axis (every
    // member after a non-last axis, only the locally computed ones after the last) and a
    // `movedim(d, 0).contiguous()` copy before an axis that does not cut dim 0.
    let a = census(&rank0("scenarios/paper/exp-a-mbs2.toml"));
    // Exp A's 192 q/k/v/o projections are gathered over dp_shard (dim 0) then tp: all 192
    // unpacked after dp_shard, the 12 rank 0 computes (greedy owner balance over the 16
    // ranks) after tp; o_proj's TP shard is its dim 1, so its 48 move before the tp gather.
    // The 48 routers (replicated on tp) have dp_shard only: the 3 rank 0 computes.
    assert_eq!(kernels(&a, "ag.tp") + kernels(&a, "ag.dp_shard"), 0);
    assert_eq!(kernels(&a, "m#.pack.tp"), 48);
    assert_eq!(kernels(&a, "m#.pack.dp_shard"), 0);
    assert_eq!(kernels(&a, "unpack.dp_shard"), 192 + 3);
    assert_eq!(kernels(&a, "unpack.tp"), 12);
    // `chunk_update_by_layout`: o_proj's local update is a dim-1 slice, made contiguous
    // before the apply (48); q/k/v slices along dim 0 are views.
    assert_eq!(kernels(&a, "m#.slice"), 48);
    // Exp B: one axis (dp_shard 16, dim 0): only the 240 / 16 matrices rank 0 computes.
    let b = census(&rank0("scenarios/paper/exp-b.toml"));
    assert_eq!(kernels(&b, "unpack.dp_shard"), 240 / 16);
    assert_eq!(kernels(&b, "m#.pack.dp_shard"), 0);
    assert_eq!(kernels(&b, "m#.slice"), 0);
}

#[test]
fn only_hyperparallel_stages_its_model_parallel_collectives() {
    // Experiment C (TP 4 with sequence parallelism): HyperParallel's runtime stages its
    // boundary collectives; the FSDP2 and Megatron baselines issue single-tensor collectives
    // (torch DTensor / Megatron mappings) and stage nothing. Experiment B has no TP or EP
    // collective at all.
    let staged = |scenario: &str, strategy: &str| {
        census(&rank0_of(scenario, strategy))
            .iter()
            .filter(|(k, _)| k.contains(".stage_"))
            .map(|(_, r)| r.kernels)
            .sum::<u64>()
    };
    assert!(staged("scenarios/paper/exp-c.toml", "hyperparallel") > 0);
    assert_eq!(staged("scenarios/paper/exp-c.toml", "fsdp2"), 0);
    assert_eq!(staged("scenarios/paper/exp-c.toml", "megatron-ddp"), 0);
    assert_eq!(staged("scenarios/paper/exp-b.toml", "hyperparallel"), 0);
}

/// Prints the census of experiment A micro batch 2 and experiment B (run with --ignored
/// --nocapture).
#[test]
#[ignore]
fn print_census() {
    print("scenarios/paper/exp-a-mbs2.toml");
    print("scenarios/paper/exp-b.toml");
}
