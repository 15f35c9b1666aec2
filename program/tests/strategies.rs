//! Step-program strategies: validation, collective counts and bytes, symmetry keys, ordering
//! rules of each strategy, and error messages.

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::{FsdpPlan, build_fsdp_plan};
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

const PAPER: [&str; 8] = [
    "paper/exp-a-mbs1.toml",
    "paper/exp-a-mbs2.toml",
    "paper/exp-b.toml",
    "paper/exp-c.toml",
    "paper/exp-d.toml",
    "paper/muon-vs-dmuon.toml",
    "paper/muon-vs-flexshard.toml",
    "paper/muon-vs-matrixfsdp.toml",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

fn load(rel: &str) -> (Scenario, ShardingPlan, FsdpPlan) {
    let s = Scenario::load(&root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(&s, &p);
    (s, p, f)
}

fn generator(rel: &str, kind: StrategyKind) -> (ProgramGenerator, FsdpPlan) {
    let (s, p, f) = load(rel);
    let g = ProgramGenerator::new(&s, &p, &f, kind).unwrap_or_else(|e| panic!("{rel}: {e}"));
    (g, f)
}

fn strategies(s: &Scenario) -> Vec<StrategyKind> {
    std::iter::once(&s.file.fsdp.strategy)
        .chain(&s.file.fsdp.baselines)
        .map(|n| StrategyKind::parse(n).unwrap())
        .collect()
}

/// Number of collectives of `kind` in `category`.
fn count(p: &StepProgram, cat: Category, kind: CollectiveKind) -> usize {
    p.ops
        .iter()
        .filter(|o| o.category == cat)
        .filter_map(|o| o.payload.as_collective())
        .filter(|c| c.kind == kind)
        .count()
}

/// Per-rank payload bytes on the shard side (all-gather input, reduce-scatter output).
fn shard_bytes(p: &StepProgram, cat: Category, kind: CollectiveKind) -> u64 {
    p.ops
        .iter()
        .filter(|o| o.category == cat)
        .filter_map(|o| o.payload.as_collective())
        .filter(|c| c.kind == kind)
        .map(|c| c.input_bytes.min(c.output_bytes))
        .sum()
}

/// The post-reduction divisions of `p` (torch_npu's `ReduceOp.AVG`) as (op index, HBM bytes),
/// each checked to follow its reduce-scatter directly on that collective's stream and to
/// read and write exactly the reduce-scatter's output once.
fn rs_divisions(p: &StepProgram) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    for (i, o) in p.ops.iter().enumerate() {
        if !hpfsdp_program::strategy::avg_division::is_collective_stream_division(o) {
            continue;
        }
        let Payload::Compute(w) = &o.payload else {
            unreachable!()
        };
        assert_eq!(w.kernels, 1, "{}", name(p, i));
        assert_eq!(o.deps.len(), 1, "{}", name(p, i));
        let coll = &p.ops[o.deps[0].index()];
        let c = coll
            .payload
            .as_collective()
            .expect("a division follows a collective");
        assert_eq!(
            coll.stream,
            o.stream,
            "{}: on its collective's stream",
            name(p, i)
        );
        if o.category == Category::FsdpRs {
            assert_eq!(c.kind, CollectiveKind::ReduceScatter);
            assert_eq!(w.hbm_bytes, 2 * c.output_bytes, "{}: the shard", name(p, i));
        }
        out.push((i, w.hbm_bytes));
    }
    out
}

fn name(p: &StepProgram, i: usize) -> &str {
    p.ops[i].name.as_deref().unwrap_or("")
}

/// Sharded parameters (those with an all-gather) of the FSDP plan.
fn sharded_params(f: &FsdpPlan) -> usize {
    f.params
        .iter()
        .filter(|p| p.all_gather.bytes_out_per_rank > 0)
        .count()
}

/// Sharded parameters of the root units (every unit outside the decoder layers), which
/// FSDP2's root keeps gathered from forward to backward.
fn root_sharded_params(f: &FsdpPlan) -> usize {
    let roots: std::collections::HashSet<&str> = f
        .units
        .iter()
        .filter(|u| u.layer.is_none())
        .flat_map(|u| u.params.iter().map(String::as_str))
        .collect();
    f.params
        .iter()
        .filter(|p| p.all_gather.bytes_out_per_rank > 0 && roots.contains(p.name.as_str()))
        .count()
}

#[test]
fn every_paper_scenario_generates_every_listed_strategy() {
    for rel in PAPER {
        let (s, p, f) = load(rel);
        for kind in strategies(&s) {
            let g =
                ProgramGenerator::new(&s, &p, &f, kind).unwrap_or_else(|e| panic!("{rel}: {e}"));
            for rank in [0, g.world_size() / 2 + 1, g.world_size() - 1] {
                let prog = g
                    .program(rank)
                    .unwrap_or_else(|e| panic!("{rel} {kind} rank {rank}: {e}"));
                prog.validate().unwrap();
                assert_eq!(prog.rank, rank);
                assert_eq!(g.groups(rank).unwrap(), prog.groups, "{rel} {kind}");
                assert!(prog.ops.iter().all(|o| o.name.is_some()), "{rel} {kind}");
            }
            assert!(g.model_flops_per_step() > 0.0);
            assert_eq!(
                g.tokens_per_step(),
                s.file.train.global_batch * s.file.train.seq_len
            );
        }
    }
}

#[test]
fn exp_b_counts_and_bytes() {
    let (hp, f) = generator("paper/exp-b.toml", StrategyKind::HyperParallel);
    let prog = hp.program(0).unwrap();
    let p = sharded_params(&f);
    assert_eq!(p, 531);
    // Reshard after forward on every block: 2 all-gathers per block parameter, 1 for each of
    // the 3 root parameters (the root is never resharded after forward); 1 reduce-scatter
    // per parameter.
    let root = root_sharded_params(&f);
    assert_eq!(root, 3);
    assert_eq!(
        count(&prog, Category::FsdpAg, CollectiveKind::AllGather),
        2 * p - root
    );
    assert_eq!(
        count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
        p
    );
    assert_eq!(count(&prog, Category::FsdpAr, CollectiveKind::AllReduce), 0);
    // Post-reduction division (torch_npu's ReduceOp.AVG): one in-place division of each
    // reduce-scatter's shard, right behind it on its HCCL stream; nothing on the compute
    // stream (one micro-batch: the reduced gradient is assigned, not accumulated).
    let divs = rs_divisions(&prog);
    assert_eq!(divs.len(), p);
    let settles = prog
        .ops
        .iter()
        .filter(|o| o.name.as_deref().is_some_and(|n| n.ends_with(".settle")))
        .count();
    assert_eq!(settles, 0);
    let hp_ag = shard_bytes(&prog, Category::FsdpAg, CollectiveKind::AllGather);
    let hp_rs = shard_bytes(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter);
    // Shard-sized: read and write the 3.817 GB of shards once, not the full gradients.
    let div_bytes: u64 = divs.iter().map(|&(_, b)| b).sum();
    assert_eq!(div_bytes, 2 * hp_rs);
    // Paper: 3.817 GB reduce-scatter payload per step (bf16 shards of the whole model).
    assert!((hp_rs as f64 / 1e9 - 3.817).abs() < 0.005, "{hp_rs}");
    assert!(hp_ag < 2 * hp_rs, "the root is gathered once");

    let (f2, f) = generator("paper/exp-b.toml", StrategyKind::Fsdp2);
    let prog = f2.program(0).unwrap();
    let blocks = f.units.iter().filter(|u| u.layer.is_some()).count();
    assert_eq!(blocks, 48);
    // Blocks + root in forward, blocks again in backward (root not resharded).
    assert_eq!(
        count(&prog, Category::FsdpAg, CollectiveKind::AllGather),
        2 * blocks + 1
    );
    assert_eq!(
        count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
        blocks + 1
    );
    // Every FSDP2 buffer has a per-rank chunk that is not a multiple of 512 bytes
    // (calibration: all 97 FSDP all-gathers and all 49 reduce-scatters unaligned); the
    // remaining 28 all-gathers of the measured 125 are the Muon optimizer's fused gathers,
    // padded to 512 bytes.
    assert!(
        prog.ops
            .iter()
            .filter(|o| matches!(o.category, Category::FsdpAg | Category::FsdpRs))
            .filter_map(|o| o.payload.as_collective())
            .all(|c| !c.aligned_512)
    );
    let opt_ag: Vec<_> = prog
        .ops
        .iter()
        .filter(|o| o.category == Category::Optimizer)
        .filter_map(|o| o.payload.as_collective())
        .filter(|c| c.kind == CollectiveKind::AllGather)
        .collect();
    // One fused Muon gather per NS memory batch: 28 in the revision exp-b.toml pins
    // (`ns_batch_fill_owners = false`; 10 with the current `min_batch_size = S`, see
    // plan/tests/fsdp_muon_plans.rs).
    assert_eq!(opt_ag.len(), 28);
    assert!(opt_ag.iter().all(|c| c.aligned_512));
    let f2_rs = shard_bytes(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter);
    assert_eq!(f2_rs, hp_rs);
    // Both gather every block twice and the root once, with the same padded shards: equal
    // all-gather payloads, as measured (7.670 GB on both sides).
    let f2_ag = shard_bytes(&prog, Category::FsdpAg, CollectiveKind::AllGather);
    assert_eq!(f2_ag, hp_ag);
}

#[test]
fn exp_c_counts() {
    let (hp, f) = generator("paper/exp-c.toml", StrategyKind::HyperParallel);
    let ga = hp.options().grad_accum_steps as usize;
    assert_eq!(ga, 3);
    let prog = hp.program(0).unwrap();
    let p = sharded_params(&f);
    // Reshard after forward and backward: per micro-batch every parameter once for forward,
    // the block parameters again for backward.
    assert_eq!(
        count(&prog, Category::FsdpAg, CollectiveKind::AllGather),
        (2 * p - root_sharded_params(&f)) * ga
    );
    assert_eq!(
        count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
        p * ga
    );
    // One fused all-reduce per unit, on the last micro-batch only.
    assert_eq!(
        count(&prog, Category::FsdpAr, CollectiveKind::AllReduce),
        f.all_reduces.len()
    );
    assert_eq!(f.all_reduces.len(), f.units.len());
    assert!(count(&prog, Category::Tp, CollectiveKind::AllGather) > 0);

    let (mg, _) = generator("paper/exp-c.toml", StrategyKind::MegatronDdp);
    let prog = mg.program(0).unwrap();
    let rs = count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter);
    let ag = count(&prog, Category::FsdpAg, CollectiveKind::AllGather);
    assert!(rs > 1);
    assert_eq!(rs, ag, "one reduce-scatter and one all-gather per bucket");
    // Reduce-scatters only on the last micro-batch; all-gathers only in the first forward.
    for o in &prog.ops {
        let n = o.name.as_deref().unwrap_or("");
        if o.category == Category::FsdpRs && o.payload.as_collective().is_some() {
            assert!(n.starts_with("mb2."), "{n}");
        }
        if o.category == Category::FsdpAg {
            assert!(n.starts_with("mb0."), "{n}");
        }
    }
    // Full (TP-sharded) bf16 parameters stay resident.
    let params = prog
        .resident
        .iter()
        .find(|r| r.tag == hpfsdp_program::MemTag::Params)
        .unwrap()
        .bytes;
    let hp_params = hp
        .program(0)
        .unwrap()
        .resident
        .iter()
        .find(|r| r.tag == hpfsdp_program::MemTag::Params)
        .unwrap()
        .bytes;
    assert!(params > 10 * hp_params, "{params} vs {hp_params}");
}

#[test]
fn verify_scenarios_counts() {
    // HSDP 2 x 4, tiny dense model.
    let (hp, f) = generator("verify/dense-hsdp2x4.toml", StrategyKind::HyperParallel);
    let ga = hp.options().grad_accum_steps as usize;
    let prog = hp.program(5).unwrap();
    let p = sharded_params(&f);
    assert_eq!(
        count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
        p * ga
    );
    assert_eq!(
        count(&prog, Category::FsdpAr, CollectiveKind::AllReduce),
        f.units.len()
    );
    for o in prog.ops.iter().filter(|o| o.category == Category::FsdpAr) {
        if let Payload::Collective(c) = o.payload {
            assert!(c.aligned_512 && c.input_bytes.is_multiple_of(512));
            assert_eq!(prog.groups[c.group.index()].label, "dp_replicate");
        }
    }
    // FSDP2 on the same mesh: the same-layer RS -> AR chain, every micro-batch.
    let (s, pl, f) = load("verify/dense-hsdp2x4.toml");
    let f2 = ProgramGenerator::new(&s, &pl, &f, StrategyKind::Fsdp2).unwrap();
    let prog = f2.program(0).unwrap();
    let units = 1 + f.units.iter().filter(|u| u.layer.is_some()).count();
    assert_eq!(
        count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
        units * ga
    );
    assert_eq!(
        count(&prog, Category::FsdpAr, CollectiveKind::AllReduce),
        units * ga
    );
    // (The all-reduce's own AVG division on its stream follows the all-reduce.)
    for (i, o) in prog.ops.iter().enumerate() {
        if o.category == Category::FsdpAr && o.payload.as_collective().is_some() {
            let dep = o.deps[0].index();
            assert_eq!(
                prog.ops[dep].category,
                Category::FsdpRs,
                "{}",
                name(&prog, i)
            );
        }
    }
    // Megatron on the MoE verify scenario: expert buffers over the expert DP group.
    let (s, pl, f) = load("verify/moe-ep2-fsdp2.toml");
    let mg = ProgramGenerator::new(&s, &pl, &f, StrategyKind::MegatronDdp).unwrap();
    let prog = mg.program(1).unwrap();
    let labels: Vec<&str> = prog.groups.iter().map(|g| g.label.as_str()).collect();
    assert!(labels.contains(&"dp_replicate+dp_shard+cp"), "{labels:?}");
    assert!(labels.contains(&"edp_replicate+edp_shard"), "{labels:?}");
    assert!(count(&prog, Category::Ep, CollectiveKind::AllToAll) > 0);
    assert!(count(&prog, Category::Ep, CollectiveKind::AllToAllV) > 0);
}

/// Programs with equal template keys are equal once the groups' ranks are ignored.
#[test]
fn template_keys_fold_identical_programs() {
    for rel in [
        "verify/dense-hsdp2x4.toml",
        "verify/moe-ep2-fsdp2.toml",
        "verify/dense-tp2-fsdp2.toml",
        "verify/uneven-fsdp3.toml",
        "verify/mla-hsdp2x2.toml",
    ] {
        let (s, p, f) = load(rel);
        for kind in StrategyKind::ALL {
            let g = ProgramGenerator::new(&s, &p, &f, kind).unwrap();
            let mut by_key: HashMap<u64, StepProgram> = HashMap::new();
            for rank in 0..g.world_size() {
                let mut prog = g.program(rank).unwrap();
                for grp in &mut prog.groups {
                    grp.ranks = vec![grp.ranks.len()];
                }
                prog.rank = 0;
                let key = g.template_key(rank);
                match by_key.get(&key) {
                    Some(first) => assert_eq!(first, &prog, "{rel} {kind} rank {rank}"),
                    None => {
                        by_key.insert(key, prog);
                    }
                }
            }
            if rel.contains("moe-ep2") && kind != StrategyKind::MegatronDdp {
                assert!(!by_key.is_empty());
            }
        }
    }
}

/// The four-step post-backward pipeline (notes 5.4): post L2 = wait RS3 -> RS2 -> AR3.
/// In issue order, for consecutive units A then B in backward order: every settle of A
/// comes after A's reduce-scatters and before B's reduce-scatters; A's all-reduce comes after
/// B's reduce-scatters and before the reduce-scatters of the unit after B.
#[test]
fn hyperparallel_four_step_order() {
    let (g, f) = generator("verify/dense-hsdp2x4.toml", StrategyKind::HyperParallel);
    let prog = g.program(0).unwrap();
    let last_mb = format!("mb{}.", g.options().grad_accum_steps - 1);
    let unit_of = |n: &str| -> Option<usize> {
        let n = n.strip_prefix(&last_mb)?;
        f.units.iter().position(|u| {
            let short = u.name.strip_prefix("model.").unwrap_or(&u.name);
            if u.layer.is_some() {
                n.starts_with(&format!("{short}."))
            } else {
                f.params
                    .iter()
                    .filter(|p| p.unit == f.units.iter().position(|x| x.name == u.name).unwrap())
                    .any(|p| n.starts_with(p.name.strip_prefix("model.").unwrap_or(&p.name)))
                    || n.starts_with(&format!("{short}."))
            }
        })
    };
    // (first RS, last RS, first settle, last settle, AR) positions per unit.
    let mut rs: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut settle: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut ar: HashMap<usize, usize> = HashMap::new();
    for (i, o) in prog.ops.iter().enumerate() {
        let n = name(&prog, i);
        let Some(u) = unit_of(n) else { continue };
        let span = |m: &mut HashMap<usize, (usize, usize)>| {
            let e = m.entry(u).or_insert((i, i));
            e.1 = i;
        };
        // torch_npu's AVG division belongs to its reduce-scatter (same HCCL stream, same
        // work); the settle step is the compute-stream accumulation.
        let division = hpfsdp_program::strategy::avg_division::is_collective_stream_division(o);
        match o.category {
            Category::FsdpRs if o.payload.as_collective().is_some() || division => span(&mut rs),
            Category::FsdpRs => span(&mut settle),
            Category::FsdpAr if o.payload.as_collective().is_some() => {
                ar.insert(u, i);
                assert_eq!(o.stream, Stream::AllReduce);
            }
            _ => {}
        }
    }
    let mut order: Vec<usize> = rs.keys().copied().collect();
    order.sort_by_key(|u| rs[u].0);
    assert_eq!(order.len(), f.units.len());
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        assert!(rs[&a].1 < settle[&a].0, "settle after own RS");
        assert!(settle[&a].1 < rs[&b].0, "A settled before B's RS");
        assert!(
            rs[&b].1 < ar[&a],
            "B's RS issued before A's AR (step 3 before step 4)"
        );
        assert!(ar[&a] < settle[&b].0, "A's AR issued before B is settled");
    }
    let last = *order.last().unwrap();
    assert!(
        settle[&last].1 < ar[&last],
        "root callback: wait last RS, then last AR"
    );
}

#[test]
fn fsdp2_copy_in_and_copy_out_bytes() {
    let (g, _) = generator("paper/exp-b.toml", StrategyKind::Fsdp2);
    let prog = g.program(3).unwrap();
    let mut ags = 0;
    for o in &prog.ops {
        let Payload::Collective(c) = o.payload else {
            continue;
        };
        if c.kind != CollectiveKind::AllGather || o.category != Category::FsdpAg {
            continue;
        }
        ags += 1;
        // copy-in (copy stream) of this rank's shard bytes right before the all-gather.
        let cin = &prog.ops[o.deps[0].index()];
        assert_eq!(cin.stream, Stream::Copy);
        assert_eq!(cin.category, Category::Copy);
        let Payload::Copy(w) = cin.payload else {
            panic!("copy-in is a copy")
        };
        assert_eq!(w.bytes, c.input_bytes);
        // copy-out on the compute stream of the whole gathered buffer.
        let cout = prog
            .ops
            .iter()
            .find(|x| x.deps.contains(&o.id) && x.category == Category::Copy)
            .expect("copy-out");
        assert_eq!(cout.stream, Stream::Compute);
        let Payload::Copy(w) = cout.payload else {
            panic!("copy-out is a copy")
        };
        assert_eq!(w.bytes, c.output_bytes);
    }
    assert_eq!(ags, 97);
    // Reduce-scatter copy-in (chunk_cat) on the compute stream with the RS input bytes.
    for o in &prog.ops {
        let Payload::Collective(c) = o.payload else {
            continue;
        };
        if c.kind == CollectiveKind::ReduceScatter && o.category == Category::FsdpRs {
            let cin = &prog.ops[o.deps[0].index()];
            assert_eq!(cin.stream, Stream::Compute);
            assert!(matches!(cin.payload, Payload::Copy(w) if w.bytes == c.input_bytes));
        }
    }
}

#[test]
fn prefetch_depth_orders_forward_all_gathers() {
    // exp-c: prefetch depth 2; the all-gather of layer i+2 is issued before layer i computes.
    let (g, _) = generator("paper/exp-c.toml", StrategyKind::HyperParallel);
    let prog = g.program(0).unwrap();
    let pos = |prefix: &str| {
        prog.ops
            .iter()
            .position(|o| o.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
            .unwrap_or_else(|| panic!("{prefix}"))
    };
    assert!(pos("mb0.layers.7.self_attn.q_proj.weight.ag") < pos("mb0.layers.5.fwd"));
    assert!(pos("mb0.layers.8.self_attn.q_proj.weight.ag") > pos("mb0.layers.5.fwd"));
}

#[test]
fn bad_inputs_give_clear_errors() {
    let (mut s, p, f) = load("paper/exp-b.toml");
    s.file.train.global_batch = 33;
    let err = ProgramGenerator::new(&s, &p, &f, StrategyKind::HyperParallel)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[train] global_batch 33"), "{err}");
    assert!(
        err.contains("micro_batch 2") && err.contains("data-parallel degree 16"),
        "{err}"
    );
    let err = StrategyKind::parse("fsdp3").unwrap_err().to_string();
    assert!(
        err.contains("unknown strategy 'fsdp3'") && err.contains("megatron-ddp"),
        "{err}"
    );
    let (s, p, f) = load("paper/exp-b.toml");
    let g = ProgramGenerator::new(&s, &p, &f, StrategyKind::Fsdp2).unwrap();
    assert!(
        g.program(16)
            .unwrap_err()
            .to_string()
            .contains("outside the job")
    );
    assert!(g.groups(99).is_err());
    // A sharding plan from another scenario is caught.
    let (_, p2, _) = load("paper/exp-c.toml");
    let err = ProgramGenerator::new(&s, &p2, &f, StrategyKind::Fsdp2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("same scenario"), "{err}");
}

#[test]
fn variant_options_override_the_base() {
    let (g, _) = generator("paper/exp-b.toml", StrategyKind::Fsdp2);
    assert_eq!(g.options().prefetch_depth, 0);
    let (g, _) = generator("paper/exp-b.toml", StrategyKind::HyperParallel);
    assert_eq!(g.options().prefetch_depth, 1);
    assert!(g.options().reshard_after_forward);
}

/// Generation speed and the figures quoted in the report (`--nocapture` prints them).
#[test]
fn generation_report() {
    for rel in ["paper/exp-b.toml", "paper/exp-c.toml", "paper/exp-d.toml"] {
        let (s, p, f) = load(rel);
        for kind in strategies(&s) {
            let t = Instant::now();
            let g = ProgramGenerator::new(&s, &p, &f, kind).unwrap();
            let new_t = t.elapsed();
            let t = Instant::now();
            let prog = g.program(g.world_size() - 1).unwrap();
            let prog_t = t.elapsed();
            let t = Instant::now();
            let n = 200.min(g.world_size());
            for r in 0..n {
                std::hint::black_box(g.template_key(r));
                std::hint::black_box(g.groups(r).unwrap());
            }
            let key_t = t.elapsed() / n as u32;
            let unaligned = prog
                .ops
                .iter()
                .filter(|o| o.category == Category::FsdpAg)
                .filter_map(|o| o.payload.as_collective())
                .filter(|c| !c.aligned_512)
                .count();
            println!(
                "{rel} {kind}: {} ops, new {new_t:?}, program {prog_t:?}, key+groups {key_t:?} | \
                 AG {} ({unaligned} unaligned) {:.3} GB, RS {} {:.3} GB, AR {}, TP {}, EP {}, CP {}",
                prog.ops.len(),
                count(&prog, Category::FsdpAg, CollectiveKind::AllGather),
                shard_bytes(&prog, Category::FsdpAg, CollectiveKind::AllGather) as f64 / 1e9,
                count(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter),
                shard_bytes(&prog, Category::FsdpRs, CollectiveKind::ReduceScatter) as f64 / 1e9,
                count(&prog, Category::FsdpAr, CollectiveKind::AllReduce),
                prog.ops
                    .iter()
                    .filter(|o| o.category == Category::Tp)
                    .count(),
                prog.ops
                    .iter()
                    .filter(|o| o.category == Category::Ep)
                    .count(),
                prog.ops
                    .iter()
                    .filter(|o| o.category == Category::Cp)
                    .count(),
            );
            assert!(prog_t.as_secs_f64() < 5.0, "{rel} {kind}: {prog_t:?}");
        }
    }
}

/// Position of the op named `name` in `p`.
fn op_index(p: &StepProgram, name: &str) -> usize {
    p.ops
        .iter()
        .position(|o| o.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no op named {name}"))
}

/// One HCCL stream per process group: on exp B (pure FSDP, one shard group) every FSDP
/// all-gather and reduce-scatter of both systems runs on the same stream, so a unit's
/// reduce-scatter queues behind the all-gathers issued before it instead of sharing the
/// link with them (torch_npu `ProcessGroupHCCL` runs a group's collectives on its own
/// stream).
#[test]
fn exp_b_shard_group_collectives_share_one_stream() {
    for kind in [StrategyKind::HyperParallel, StrategyKind::Fsdp2] {
        let (g, _) = generator("paper/exp-b.toml", kind);
        let prog = g.program(0).unwrap();
        let streams: std::collections::BTreeSet<Stream> = prog
            .ops
            .iter()
            .filter(|o| matches!(o.category, Category::FsdpAg | Category::FsdpRs))
            .filter(|o| o.payload.as_collective().is_some())
            .map(|o| o.stream)
            .collect();
        assert_eq!(
            streams.into_iter().collect::<Vec<_>>(),
            [Stream::AllGather],
            "{kind}"
        );
    }
    // Issue order on that stream in FSDP2's backward: the next block's all-gather (default
    // backward prefetch) before this block's reduce-scatter.
    let (g, _) = generator("paper/exp-b.toml", StrategyKind::Fsdp2);
    let prog = g.program(0).unwrap();
    assert!(op_index(&prog, "layers.46.ag.bwd") < op_index(&prog, "layers.47.rs"));
    assert!(op_index(&prog, "layers.47.rs") < op_index(&prog, "layers.45.ag.bwd"));
}

/// FSDP2's pre-backward hook prefetches the previous unit by default whenever no explicit
/// backward-prefetch list is set, so exp B's `prefetch_depth = 0` on the FSDP2 side still
/// issues block k-1's backward all-gather before block k's backward compute.
#[test]
fn fsdp2_backward_prefetch_survives_depth_zero() {
    use hpfsdp_program::strategy::fsdp2::backward_prefetch_depth;
    assert_eq!(backward_prefetch_depth(0), 1);
    assert_eq!(backward_prefetch_depth(2), 2);
    let (g, _) = generator("paper/exp-b.toml", StrategyKind::Fsdp2);
    assert_eq!(g.options().prefetch_depth, 0);
    let prog = g.program(0).unwrap();
    for k in [2usize, 20, 47] {
        let ag = op_index(&prog, &format!("layers.{}.ag.bwd", k - 1));
        let bwd = op_index(&prog, &format!("layers.{k}.bwd"));
        assert!(ag < bwd, "block {} not prefetched before block {k}", k - 1);
    }
    // Forward stays implicit: block k+1's all-gather comes after block k's copy-out.
    assert!(op_index(&prog, "layers.3.copy_out") < op_index(&prog, "layers.4.ag"));
}

/// HyperParallel's root (embedding, final norm, `lm_head`) on exp B: gathered once, in the
/// root's pre-forward before any block, kept through backward and resharded after the last
/// backward stage; prefetch links the blocks only, so block 0 in forward and block 47 in
/// backward are gathered by their own hooks (after the root's gathers, after the head's
/// backward compute) while every other block is prefetched one ahead (`prefetch_depth = 1`);
/// the root's post-backward (its reduce-scatters) comes after every block's.
#[test]
fn hyperparallel_root_is_gathered_once_and_outside_the_prefetch_chain() {
    let (g, f) = generator("paper/exp-b.toml", StrategyKind::HyperParallel);
    assert_eq!(g.options().grad_accum_steps, 1);
    assert_eq!(g.options().prefetch_depth, 1);
    let prog = g.program(0).unwrap();
    let root = ["embed_tokens.weight", "norm.weight", "lm_head.weight"];
    for r in root {
        op_index(&prog, &format!("{r}.ag"));
        assert!(
            prog.ops
                .iter()
                .all(|o| o.name.as_deref() != Some(&format!("{r}.ag.bwd"))),
            "{r} gathered again for backward"
        );
    }
    // Forward: the root's gathers in unit order, then block 0's (not prefetched by the root).
    let embed_ag = op_index(&prog, "embed_tokens.weight.ag");
    let head_ag = op_index(&prog, "lm_head.weight.ag");
    let first_block_ag = prog
        .ops
        .iter()
        .position(|o| {
            o.category == Category::FsdpAg && name(&prog, o.id.index()).starts_with("layers.")
        })
        .unwrap();
    assert!(embed_ag < head_ag && head_ag < first_block_ag);
    assert!(name(&prog, first_block_ag).starts_with("layers.0."));
    // Block 1 is prefetched by block 0: issued before block 0's forward compute.
    assert!(
        op_index(&prog, "layers.1.self_attn.q_proj.weight.ag") < op_index(&prog, "layers.0.fwd")
    );
    // Backward: nobody prefetches block 47, it is gathered after the head's backward is
    // issued; block 46 is prefetched by block 47.
    let head_bwd = op_index(&prog, "lm_head.bwd");
    let b47 = op_index(&prog, "layers.47.self_attn.q_proj.weight.ag.bwd");
    assert!(head_bwd < b47);
    assert!(
        op_index(&prog, "layers.46.self_attn.q_proj.weight.ag.bwd")
            < op_index(&prog, "layers.47.bwd")
    );
    // The root's post-backward fires last: its reduce-scatters (embedding, final norm,
    // lm_head, in unit order) come after block 0's and after the embedding's backward.
    let rs = |n: &str| op_index(&prog, &format!("{n}.rs"));
    let embed_bwd = op_index(&prog, "embed_tokens.bwd");
    assert!(rs("layers.0.self_attn.q_proj.weight") < rs("embed_tokens.weight"));
    assert!(embed_bwd < rs("embed_tokens.weight"));
    assert!(rs("embed_tokens.weight") < rs("norm.weight"));
    assert!(rs("norm.weight") < rs("lm_head.weight"));
    // Memory: the root's gathered bytes are allocated once and freed after the embedding's
    // backward, the last stage.
    let root_bytes: u64 = f
        .params
        .iter()
        .filter(|p| {
            root.iter()
                .any(|r| p.name.ends_with(r) && !p.name.contains("layers."))
        })
        .map(|p| p.all_gather.bytes_out_per_rank)
        .sum();
    let params_freed_after: u64 = prog
        .ops
        .iter()
        .skip(embed_bwd)
        .flat_map(|o| o.memory.iter())
        .filter(|m| m.tag == hpfsdp_program::MemTag::Params)
        .map(|m| m.free_bytes)
        .sum();
    assert_eq!(params_freed_after, root_bytes);
}

/// Exp B's measured all-gathers per step, 125 (FSDP2) and 1,087 (HyperParallel), decompose
/// into the FSDP all-gathers plus one fused Muon gather per Newton-Schulz memory batch (28
/// in the revision that ran exp B, where every batch closes at the 2^29 / S cap on its own,
/// `ns_batch_fill_owners = false`). FSDP2: 97 units (root + 48 blocks forward, 48 blocks
/// backward), exactly. HyperParallel: 1,059 = 2 x 531 - 3, every parameter gathered for
/// forward and the 528 block parameters again for backward; the three root parameters
/// (embedding, final norm, `lm_head`) are gathered once (its trainer never reshards the
/// root after forward, see the `hyperparallel` module documentation).
#[test]
fn exp_b_measured_all_gather_counts() {
    let path = root().join("paper/exp-b.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("ns_batch_fill_owners = false"));
    let s = Scenario::from_str_at(&text, &path).unwrap();
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(&s, &p);
    let root = root_sharded_params(&f);
    assert_eq!(root, 3);
    for (kind, fsdp, measured) in [
        (StrategyKind::Fsdp2, 97, 125),
        (StrategyKind::HyperParallel, 2 * 531 - root, 1087),
    ] {
        let g = ProgramGenerator::new(&s, &p, &f, kind).unwrap();
        let prog = g.program(0).unwrap();
        let unit_ag = count(&prog, Category::FsdpAg, CollectiveKind::AllGather);
        let muon_ag = count(&prog, Category::Optimizer, CollectiveKind::AllGather);
        assert_eq!(unit_ag, fsdp, "{kind}");
        assert_eq!(muon_ag, 28, "{kind}");
        assert_eq!(unit_ag + muon_ag, measured, "{kind}");
    }
}
