//! Optimizer strategies in step programs: every strategy validates on the Muon scenarios;
//! HyperParallel's NS work is deduplicated across shard and replica domains; naive repeats the
//! single-device work on every rank; replica-owner momentum is 1/R_s of the naive state;
//! under the canonical mapping with topology replica subgroups no HyperParallel optimizer
//! byte crosses supernodes (and the launcher rule warns); template keys still fold identical
//! programs; at most one batch in flight; the exp-b optimizer all-gather counts against the
//! calibration; exp-d generation time and template keys; every communicator's members issue
//! the same collective sequence.

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute, ReplicaSubgroupRule, build_muon_plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::topology::Tier;
use hpfsdp_program::step::{Category, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::muon::ns_cost::ns_flops;
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyError, StrategyKind};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const MUON_SCENARIOS: [&str; 4] = [
    "paper/muon-vs-dmuon.toml",
    "paper/muon-vs-matrixfsdp.toml",
    "paper/muon-vs-flexshard.toml",
    "paper/exp-b.toml",
];

mod common;
use common::{Plans, mini_exp_d, muon_miniatures, plans_of, root, verify_muon};

fn load(rel: &str) -> Plans {
    plans_of(Scenario::load(&root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

/// A scenario file with text edits (each `(from, to)` must match), parsed at its own path.
fn edited(rel: &str, edits: &[(&str, &str)], append: &str) -> Plans {
    let path = root().join(rel);
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{rel}: no '{from}'");
        text = text.replacen(from, to, 1);
    }
    text.push_str(append);
    plans_of(Scenario::from_str_at(&text, &path).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

/// A verify scenario switched to Muon + AdamW.
fn gen_with(x: &Plans, kind: StrategyKind, o: OptimizerStrategy) -> ProgramGenerator {
    ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o)
        .unwrap_or_else(|e| panic!("{} {kind} {o}: {e}", x.s.file.name))
}

fn fsdp_strategies(s: &Scenario) -> Vec<StrategyKind> {
    std::iter::once(&s.file.fsdp.strategy)
        .chain(&s.file.fsdp.baselines)
        .map(|n| StrategyKind::parse(n).unwrap())
        .collect()
}

/// True for the op names of Newton-Schulz calls (`...ns<k>`).
fn is_ns(name: &str) -> bool {
    name.rsplit_once(".ns")
        .is_some_and(|(_, k)| !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()))
}

/// NS matmul FLOPs of one program: the GEMM entries of its NS ops' kernel mixes (every NS op
/// carries one; the element-wise kernels' FLOPs are not counted).
fn ns_flops_of(p: &StepProgram) -> u64 {
    p.ops
        .iter()
        .filter(|o| o.category == Category::Optimizer && is_ns(o.name.as_deref().unwrap_or("")))
        .map(|o| match o.payload {
            Payload::Compute(w) => {
                let mix = w.mix.expect("NS ops carry a kernel mix");
                p.kernel_mixes[&mix]
                    .iter()
                    .filter(|k| k.class.name() == "gemm")
                    .map(|k| k.flops)
                    .sum::<u64>()
            }
            _ => 0,
        })
        .sum()
}

/// Single-device NS FLOPs of every Muon matrix of the plan.
fn single_device_ns(m: &MuonPlan, steps: u64) -> u64 {
    m.params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon)
        .map(|p| {
            let (r, c) = p.core_shape.unwrap();
            p.matrices * ns_flops(r, c, steps)
        })
        .sum()
}

fn optimizer_collectives(p: &StepProgram, kind: CollectiveKind) -> usize {
    p.ops
        .iter()
        .filter(|o| o.category == Category::Optimizer)
        .filter_map(|o| o.payload.as_collective())
        .filter(|c| c.kind == kind)
        .count()
}

#[test]
fn optimizer_strategy_names_round_trip() {
    for o in OptimizerStrategy::ALL {
        assert_eq!(OptimizerStrategy::parse(o.name()).unwrap(), o);
        assert_eq!(o.to_string().parse::<OptimizerStrategy>().unwrap(), o);
    }
    for b in hpfsdp_plan::scenario::MUON_BASELINES {
        assert!(OptimizerStrategy::parse(b).unwrap().is_muon(), "{b}");
    }
    assert_eq!(
        OptimizerStrategy::parse("hyperparallel").unwrap(),
        OptimizerStrategy::HyperParallelMuon
    );
    let err = OptimizerStrategy::parse("zero9").unwrap_err().to_string();
    assert!(
        err.contains("unknown optimizer strategy 'zero9'") && err.contains("flexshard"),
        "{err}"
    );
}

#[test]
fn defaults_and_errors() {
    let b = load("paper/exp-b.toml");
    for (kind, want) in [
        (
            StrategyKind::HyperParallel,
            OptimizerStrategy::HyperParallelMuon,
        ),
        (StrategyKind::Fsdp2, OptimizerStrategy::HyperParallelMuon),
        (StrategyKind::MegatronDdp, OptimizerStrategy::Moonlight),
    ] {
        let g = ProgramGenerator::new(&b.s, &b.p, &b.f, kind).unwrap();
        assert_eq!(g.optimizer(), want, "{kind}");
    }
    // Owner placement needs the per-parameter hyperparallel FSDP schedule.
    let err = ProgramGenerator::with_optimizer(
        &b.s,
        &b.p,
        &b.f,
        StrategyKind::Fsdp2,
        OptimizerStrategy::DMuon,
    )
    .unwrap_err();
    assert!(matches!(err, StrategyError::UnsupportedOptimizer { .. }));
    assert!(err.to_string().contains("[fsdp] strategy"), "{err}");
    // AdamW scenarios: adamw by default, Muon strategies refused with the key to change.
    let v = load("verify/dense-hsdp2x4.toml");
    let g = ProgramGenerator::new(&v.s, &v.p, &v.f, StrategyKind::HyperParallel).unwrap();
    assert_eq!(g.optimizer(), OptimizerStrategy::AdamW);
    let err = ProgramGenerator::with_optimizer(
        &v.s,
        &v.p,
        &v.f,
        StrategyKind::HyperParallel,
        OptimizerStrategy::Naive,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("kind = \"muon+adamw\""), "{err}");
}

#[test]
fn every_optimizer_strategy_validates() {
    let mut all: Vec<Plans> = MUON_SCENARIOS.iter().map(|r| load(r)).collect();
    all.push(verify_muon("verify/dense-hsdp2x4.toml"));
    all.push(verify_muon("verify/moe-ep2-fsdp2.toml"));
    for x in &all {
        let mut kinds = fsdp_strategies(&x.s);
        if !kinds.contains(&StrategyKind::MegatronDdp) {
            kinds.push(StrategyKind::MegatronDdp);
        }
        for kind in kinds {
            for o in OptimizerStrategy::ALL {
                let g = match ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) {
                    Ok(g) => g,
                    Err(StrategyError::UnsupportedOptimizer { .. }) => {
                        assert!(o.owner_placement() && kind != StrategyKind::HyperParallel);
                        continue;
                    }
                    Err(e) => panic!("{} {kind} {o}: {e}", x.s.file.name),
                };
                let w = g.world_size();
                let ranks: Vec<usize> = if w <= 8 {
                    (0..w).collect()
                } else {
                    vec![0, w / 2 + 1, w - 1]
                };
                for r in ranks {
                    let p = g
                        .program(r)
                        .unwrap_or_else(|e| panic!("{} {kind} {o} rank {r}: {e}", x.s.file.name));
                    p.validate().unwrap();
                    assert!(p.ops.iter().all(|op| op.name.is_some()));
                    let opt = p
                        .ops
                        .iter()
                        .filter(|op| op.category == Category::Optimizer)
                        .count();
                    assert!(opt > 0, "{} {kind} {o} rank {r}", x.s.file.name);
                }
            }
        }
    }
}

/// Each matrix is orthogonalized once per shard group and replica subgroup: the NS FLOPs of
/// all ranks add up to the single-device NS FLOPs times R / R_s; naive runs all of it on
/// every rank.
#[test]
fn ns_flops_dedup() {
    let cases: Vec<(Plans, u64)> = vec![
        (load("paper/exp-b.toml"), 1),
        (load("paper/muon-vs-flexshard.toml"), 1),
        (load("fixtures/muon-hsdp-2x8.toml"), 1),
        (load("paper/muon-vs-dmuon.toml"), 1),
        (verify_muon("verify/dense-hsdp2x4.toml"), 1),
        // Subgroups of one: every replica recomputes (deterministic recomputation).
        (
            edited(
                "verify/dense-hsdp2x4.toml",
                &[("kind = \"adamw\"", "kind = \"muon+adamw\"")],
                "\n[optimizer.muon]\nreplica_count = 1\n",
            ),
            2,
        ),
    ];
    for (x, subgroups) in &cases {
        let m = build_muon_plan(&x.s, &x.p, &x.f);
        let single = single_device_ns(&m, 5);
        assert!(single > 0);
        let hp = gen_with(
            x,
            StrategyKind::HyperParallel,
            OptimizerStrategy::HyperParallelMuon,
        );
        let naive = gen_with(x, StrategyKind::HyperParallel, OptimizerStrategy::Naive);
        let flex = gen_with(x, StrategyKind::HyperParallel, OptimizerStrategy::FlexShard);
        let mut total = 0;
        let mut flex_total = 0;
        let mut per_rank = Vec::new();
        for r in 0..hp.world_size() {
            let f = ns_flops_of(&hp.program(r).unwrap());
            per_rank.push(f);
            total += f;
            flex_total += ns_flops_of(&flex.program(r).unwrap());
            assert_eq!(
                ns_flops_of(&naive.program(r).unwrap()),
                single,
                "{} naive rank {r}",
                x.s.file.name
            );
        }
        assert_eq!(total, single * subgroups, "{}", x.s.file.name);
        // FlexShard: once per shard group, every replica again.
        let replicas = x.s.file.mesh.dp_replicate as u64;
        assert_eq!(flex_total, single * replicas, "{}", x.s.file.name);
        println!(
            "{}: single-device NS {:.3} TFLOP; hyperparallel per rank {:?} GFLOP",
            x.s.file.name,
            single as f64 / 1e12,
            per_rank
                .iter()
                .map(|f| f / 1_000_000_000)
                .collect::<Vec<_>>()
        );
    }
}

/// Replica-owner momentum: summed over ranks, exactly 1/R_s of the naive (one copy per
/// replica) state. Per rank it is only roughly 1/R_s: owners are balanced per batch with a
/// lexicographic tie-break, so coordinate 0 wins every odd-count batch (3 expert down
/// projections per batch here).
#[test]
fn momentum_is_one_over_rs_of_naive() {
    let x = load("fixtures/muon-hsdp-2x8.toml");
    let m = build_muon_plan(&x.s, &x.p, &x.f);
    let rs = m.replica_count.unwrap_or(x.s.file.mesh.dp_replicate) as u64;
    assert_eq!(rs, 2);
    let hp = gen_with(
        &x,
        StrategyKind::HyperParallel,
        OptimizerStrategy::HyperParallelMuon,
    );
    let naive = gen_with(&x, StrategyKind::HyperParallel, OptimizerStrategy::Naive);
    let (mut h, mut n) = (0, 0);
    for r in 0..hp.world_size() {
        let (hm, ha) = hp.optimizer_state_bytes(r).unwrap();
        let (nm, na) = naive.optimizer_state_bytes(r).unwrap();
        assert_eq!(ha, na, "same AdamW state");
        assert!(hm < nm && hm > nm / rs / 2, "rank {r}: {hm} vs {nm}/{rs}");
        h += hm;
        n += nm;
        if r == 0 || r == 8 {
            println!(
                "muon-hsdp-2x8 rank {r} momentum: hyperparallel {:.3} GB, naive {:.3} GB",
                hm as f64 / 1e9,
                nm as f64 / 1e9
            );
        }
    }
    assert_eq!(h * rs, n);
    // The resident optimizer memory carries it.
    let prog = hp.program(0).unwrap();
    let (hm, ha) = hp.optimizer_state_bytes(0).unwrap();
    let res = prog
        .resident
        .iter()
        .find(|r| r.tag == hpfsdp_program::MemTag::Optimizer)
        .unwrap()
        .bytes;
    assert_eq!(res, hm + ha);
}

/// Canonical mapping: shard axis = the dies of one supernode, replicas across supernodes.
/// With `replica_subgroups = "topology"` (each replica's machine holds no other replica:
/// subgroups of one, each supernode recomputes) no HyperParallel optimizer collective crosses
/// supernodes, as with `replica_count = 1`. With the default launcher rule (R = 2 <= dies per
/// machine: no split, notes 6.5) the replica broadcasts do, and only they; the plan warns,
/// naming the axis, the bytes and the fix.
#[test]
fn canonical_mapping_sends_no_optimizer_bytes_across_supernodes() {
    let topo = [
        ("machines_per_supernode = 2", "machines_per_supernode = 1"),
        ("supernodes = 1", "supernodes = 2"),
    ];
    // (inter-supernode bytes, intra bytes, inter bytes off the optimizer stream, rank 0's
    // inter-supernode replica broadcast input bytes), over every rank's optimizer ops.
    let tier_bytes = |x: &Plans| -> (u64, u64, u64, u64) {
        let g = gen_with(
            x,
            StrategyKind::HyperParallel,
            OptimizerStrategy::HyperParallelMuon,
        );
        let (mut inter, mut intra, mut replica_inter, mut rank0) = (0, 0, 0, 0);
        for r in 0..g.world_size() {
            let p = g.program(r).unwrap();
            for o in p.ops.iter().filter(|o| o.category == Category::Optimizer) {
                if let Some(c) = o.payload.as_collective() {
                    if c.tier == Tier::InterSupernode {
                        inter += c.input_bytes.max(c.output_bytes);
                        if o.stream != Stream::Optimizer {
                            replica_inter += c.input_bytes;
                            if r == 0 {
                                rank0 += c.input_bytes;
                            }
                        }
                    } else {
                        intra += c.input_bytes.max(c.output_bytes);
                    }
                }
            }
        }
        (inter, intra, replica_inter, rank0)
    };
    let topology = edited(
        "fixtures/muon-hsdp-2x8.toml",
        &topo,
        "\n[optimizer.muon]\nreplica_subgroups = \"topology\"\n",
    );
    assert_eq!(
        topology.s.topology.dies_per_supernode(),
        topology.s.file.mesh.dp_shard
    );
    let m = build_muon_plan(&topology.s, &topology.p, &topology.f);
    assert_eq!(m.replica_subgroups, ReplicaSubgroupRule::Topology);
    assert_eq!(m.replica_subgroup_sizes.get("dp_replicate"), Some(&1));
    assert_eq!(m.replica_count, Some(1));
    assert!(m.lints.is_empty(), "{:?}", m.lints);
    let (inter, intra, _, _) = tier_bytes(&topology);
    assert_eq!(inter, 0, "optimizer bytes across supernodes");
    assert!(intra > 0);
    // The same as an explicit replica_count = 1.
    let split = edited(
        "fixtures/muon-hsdp-2x8.toml",
        &topo,
        "\n[optimizer.muon]\nreplica_count = 1\n",
    );
    assert_eq!(tier_bytes(&split), (inter, intra, 0, 0));

    let launcher = edited("fixtures/muon-hsdp-2x8.toml", &topo, "");
    let (inter, intra, replica, rank0) = tier_bytes(&launcher);
    println!(
        "canonical mapping, launcher rule (R_s = R = 2): {:.3} GB inter-supernode (all replica \
         broadcasts), {:.3} GB intra-supernode; topology subgroups: 0 inter",
        inter as f64 / 1e9,
        intra as f64 / 1e9
    );
    assert_eq!(inter, replica);
    assert!(inter > 0);
    let m = build_muon_plan(&launcher.s, &launcher.p, &launcher.f);
    assert_eq!(m.replica_subgroups, ReplicaSubgroupRule::Launcher);
    assert_eq!(m.replica_count, None);
    let [lint] = m.lints.as_slice() else {
        panic!("one lint expected: {:?}", m.lints);
    };
    println!("{lint}");
    assert_eq!(lint.code, "muon-replica-subgroup-crosses-supernodes");
    assert_eq!(lint.axis.as_deref(), Some("dp_replicate"));
    assert!(lint.message.contains(&format!("{rank0} bytes")), "{lint}");
    assert!(
        lint.fix.contains("replica_subgroups = \"topology\""),
        "{lint}"
    );
    // Inside one supernode (the scenario as written) the launcher subgroups do not warn.
    let inside = load("fixtures/muon-hsdp-2x8.toml");
    assert!(
        build_muon_plan(&inside.s, &inside.p, &inside.f)
            .lints
            .is_empty()
    );
}

/// `[optimizer.muon] replica_subgroups`: unknown values and a conflicting `replica_count`
/// are rejected with the key, the allowed values and the fix.
#[test]
fn replica_subgroups_key_errors() {
    let path = root().join("fixtures/muon-hsdp-2x8.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let err = |append: &str| {
        Scenario::from_str_at(&format!("{text}{append}"), &path)
            .unwrap_err()
            .to_string()
    };
    let e = err("\n[optimizer.muon]\nreplica_subgroups = \"machine\"\n");
    assert!(
        e.contains("[optimizer.muon] replica_subgroups = \"machine\"")
            && e.contains("launcher, topology"),
        "{e}"
    );
    let e = err("\n[optimizer.muon]\nreplica_subgroups = \"topology\"\nreplica_count = 2\n");
    assert!(
        e.contains("replica_count = 2") && e.contains("remove replica_count"),
        "{e}"
    );
    let ok = format!("{text}\n[optimizer.muon]\nreplica_subgroups = \"launcher\"\n");
    assert!(Scenario::from_str_at(&ok, &path).is_ok());
}

/// The shard path's Muon ops of `p` by memory batch ("b.m" units in issue order of their
/// first gather) and kind (`ag`, `relay`, `apply`, `ns`), with their op positions.
fn memory_batch_positions(
    p: &StepProgram,
) -> (Vec<String>, HashMap<(String, &'static str), Vec<usize>>) {
    let unit_of = |n: &str| -> Option<(String, String)> {
        let rest = n.strip_prefix("muon.b")?;
        let (b, rest) = rest.split_once(".m")?;
        let (m, what) = rest.split_once('.')?;
        Some((format!("{b}.{m}"), what.to_string()))
    };
    let mut order: Vec<String> = Vec::new();
    let mut pos: HashMap<(String, &'static str), Vec<usize>> = HashMap::new();
    for (i, o) in p.ops.iter().enumerate() {
        let n = o.name.as_deref().unwrap_or("");
        let Some((u, what)) = unit_of(n) else {
            continue;
        };
        let kind = if what.starts_with("ag") {
            if !order.contains(&u) {
                order.push(u.clone());
            }
            "ag"
        } else if what.starts_with("relay") {
            "relay"
        } else if what == "apply" {
            "apply"
        } else if is_ns(n) {
            "ns"
        } else {
            continue;
        };
        pos.entry((u, kind)).or_default().push(i);
    }
    (order, pos)
}

/// The shard path runs each NS memory batch to the end before the next starts, as
/// HyperParallel's `_process_shard_params` (3ad2a77) does: `for sub_batch in safe_batches:`
/// gather, NS, then `_fused_broadcast_and_apply(sub_batch)` (relay broadcasts, then the
/// apply, which waits for them). So batch j's relay broadcasts come after its last NS and
/// wait on it; its apply comes after them; the gathers of batch j+1 come after that apply
/// and wait on the compute stream for it (no prefetch: the shard group's stream waits for
/// the compute issued before a collective). Only the replica broadcasts stay in flight: a
/// batch's replica broadcasts land before the broadcasts of the batch after next are issued.
#[test]
fn at_most_one_batch_in_flight() {
    let x = load("paper/exp-b.toml");
    let g = gen_with(
        &x,
        StrategyKind::HyperParallel,
        OptimizerStrategy::HyperParallelMuon,
    );
    let p = g.program(0).unwrap();
    let (order, pos) = memory_batch_positions(&p);
    // 28 fused-gather memory batches in the Muon revision exp-b.toml pins
    // (`ns_batch_fill_owners = false`).
    assert_eq!(order.len(), 28, "fused-gather NS batches on exp-b");
    let get = |u: &str, k: &str| pos.get(&(u.to_string(), k)).cloned().unwrap_or_default();
    let mut checked = 0;
    for j in 0..order.len() {
        let (ns, relay, apply) = (
            get(&order[j], "ns"),
            get(&order[j], "relay"),
            get(&order[j], "apply"),
        );
        assert_eq!(apply.len(), 1, "one apply per memory batch {}", order[j]);
        assert!(
            !relay.is_empty(),
            "relay broadcasts of memory batch {}",
            order[j]
        );
        let (first_relay, last_relay) = (relay[0], *relay.last().unwrap());
        if let Some(&last_ns) = ns.last() {
            assert!(first_relay > last_ns, "relay of {} before its NS", order[j]);
            assert!(
                p.ops[first_relay].deps.iter().any(|d| d.index() >= last_ns),
                "relay of {} does not wait for its NS",
                order[j]
            );
            checked += 1;
        }
        assert!(
            apply[0] > last_relay,
            "apply of {} before its relay",
            order[j]
        );
        if let Some(next) = order.get(j + 1) {
            let first_ag = get(next, "ag")[0];
            assert!(
                first_ag > apply[0],
                "gathers of {next} before the apply of {}",
                order[j]
            );
            assert!(
                p.ops[first_ag].deps.iter().any(|d| d.index() >= apply[0]),
                "gathers of {next} do not wait for the apply of {}",
                order[j]
            );
        }
    }
    assert!(checked >= 4, "rank 0 runs NS in {checked} batches");
}

/// Only the replica broadcasts stay in flight across memory batches: a batch's replica
/// broadcasts land before the broadcasts of the batch after next are issued (the HSDP
/// fixture muon-hsdp-2x8).
#[test]
fn replica_broadcasts_land_within_two_batches() {
    let x = load("fixtures/muon-hsdp-2x8.toml");
    let g = gen_with(
        &x,
        StrategyKind::HyperParallel,
        OptimizerStrategy::HyperParallelMuon,
    );
    let p = g.program(3).unwrap();
    let batch =
        |n: &str| -> Option<usize> { n.strip_prefix("muon.b")?.split('.').next()?.parse().ok() };
    let mut first_rb: Vec<(usize, usize)> = Vec::new();
    let mut land: HashMap<usize, usize> = HashMap::new();
    for (i, o) in p.ops.iter().enumerate() {
        let n = o.name.as_deref().unwrap_or("");
        let Some(b) = batch(n) else { continue };
        if n.contains(".rb.") && first_rb.last().is_none_or(|x| x.0 != b) {
            first_rb.push((b, i));
        }
        if n.ends_with(".land") {
            land.insert(b, i);
        }
    }
    assert!(first_rb.len() > 2);
    for w in first_rb.windows(3) {
        let (b0, _) = w[0];
        let (_, rb1) = w[1];
        let (_, rb2) = w[2];
        assert!(
            land[&b0] > rb1,
            "batch {b0} landed before the next batch flushed"
        );
        assert!(
            land[&b0] < rb2,
            "batch {b0} still in flight two batches later"
        );
    }
}

/// Optimizer all-gathers per step on exp-b: one fused gather per NS memory batch. The
/// calibration measured 28 (FSDP2: 125 - 97; HyperParallel: 1,087 - 1,059), which is what
/// `ns_batch_fill_owners = false` gives, the revision exp-b.toml pins (the current
/// `min_batch_size = S` gives 6 projection batches of 16 plus 4 small-matrix batches = 10,
/// checked in plan/tests/fsdp_muon_plans.rs).
#[test]
fn exp_b_optimizer_gather_counts() {
    let x = load("paper/exp-b.toml");
    let mut counts = Vec::new();
    for kind in [StrategyKind::HyperParallel, StrategyKind::Fsdp2] {
        let g = ProgramGenerator::new(&x.s, &x.p, &x.f, kind).unwrap();
        let p = g.program(0).unwrap();
        let ag = optimizer_collectives(&p, CollectiveKind::AllGather);
        let bc = optimizer_collectives(&p, CollectiveKind::Broadcast);
        let aligned = p
            .ops
            .iter()
            .filter(|o| o.category == Category::Optimizer)
            .filter_map(|o| o.payload.as_collective())
            .all(|c| c.aligned_512);
        println!(
            "exp-b {kind}: {ag} optimizer all-gathers (all 512-B aligned: {aligned}), {bc} relay broadcasts"
        );
        assert!(aligned);
        counts.push(ag);
    }
    // Both FSDP layouts shard every matrix on dim 0 over 16: the same Muon plan.
    assert_eq!(counts[0], counts[1]);
    assert_eq!(counts[0], 28);
    for o in [
        OptimizerStrategy::Naive,
        OptimizerStrategy::Moonlight,
        OptimizerStrategy::FlexShard,
    ] {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let p = g.program(0).unwrap();
        println!(
            "exp-b hyperparallel + {o}: {} all-gathers, {} all-to-alls",
            optimizer_collectives(&p, CollectiveKind::AllGather),
            optimizer_collectives(&p, CollectiveKind::AllToAll)
        );
    }
}

/// Owner placement: DMuon and MatrixFSDP publish placed matrices by broadcast and reduce
/// gradients to owners; their optimizer steps have no collective on placed matrices; the
/// owner holds the whole matrix and its momentum.
#[test]
fn owner_placement_baselines() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    for o in [OptimizerStrategy::MatrixFsdp, OptimizerStrategy::DMuon] {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let mut mom = 0;
        for r in 0..g.world_size() {
            let p = g.program(r).unwrap();
            let pubs = p
                .ops
                .iter()
                .filter(|op| op.category == Category::FsdpAg)
                .filter_map(|op| op.payload.as_collective())
                .filter(|c| c.kind == CollectiveKind::Broadcast)
                .count();
            assert!(pubs > 0, "{o}");
            assert_eq!(
                optimizer_collectives(&p, CollectiveKind::AllGather),
                0,
                "{o}"
            );
            mom += g.optimizer_state_bytes(r).unwrap().0;
        }
        // The Qwen3-14B matrices of this scenario are all placed: one momentum copy in total,
        // in the dtype of the gradient the owner reads: MatrixFSDP's f32 workspace, DMuon's
        // bf16 reduced gradient (`zeros_like(grad)`).
        let m = build_muon_plan(&x.s, &x.p, &x.f);
        let grad_bytes = match o {
            OptimizerStrategy::DMuon => 2,
            _ => 4,
        };
        let full: u64 = m
            .params
            .iter()
            .filter(|p| p.route == OptimizerRoute::Muon)
            .map(|p| p.numel() * grad_bytes)
            .sum();
        assert_eq!(mom, full, "{o}");
    }
    // DMuon publishes for each recompute and again for the backward.
    let g = gen_with(&x, StrategyKind::HyperParallel, OptimizerStrategy::DMuon);
    let p = g.program(0).unwrap();
    assert!(p.ops.iter().any(|o| {
        o.name
            .as_deref()
            .is_some_and(|n| n.ends_with(".pub.recompute"))
    }));
}

/// DMuon on a recomputed layer publishes twice (its hooks, `dmuon/_core/state.py`): the
/// prefetched publication feeds the recompute forward; the backward's own publication starts
/// only once the recompute forward is done and the backward waits for it, so nothing hides
/// it. MatrixFSDP keeps FSDP2's lifecycle: one publication per backward, issued before the
/// recompute. Non-placed parameters (norms) are gathered once either way.
#[test]
fn dmuon_republishes_after_the_recompute_forward() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let layer = "layers.3.";
    for o in [OptimizerStrategy::DMuon, OptimizerStrategy::MatrixFsdp] {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let p = g.program(0).unwrap();
        let named = |suffix: &str| -> Vec<usize> {
            p.ops
                .iter()
                .enumerate()
                .filter(|(_, op)| {
                    op.name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(layer) && n.ends_with(suffix))
                })
                .map(|(i, _)| i)
                .collect()
        };
        let on_compute = |v: Vec<usize>| -> Vec<usize> {
            v.into_iter()
                .filter(|&i| p.ops[i].stream == Stream::Compute)
                .collect()
        };
        let recompute = on_compute(named(".recompute"));
        let bwd = on_compute(named(".bwd"));
        let pub_bwd = named(".pub.bwd");
        let norms_bwd = named("norm.weight.ag.bwd");
        assert!(!recompute.is_empty() && !bwd.is_empty(), "{o}");
        assert!(!norms_bwd.is_empty(), "{o}: norms are gathered in backward");
        let deps_of =
            |i: usize| -> Vec<usize> { p.ops[i].deps.iter().map(|d| d.0 as usize).collect() };
        let after_recompute = |i: usize| deps_of(i).iter().any(|d| recompute.contains(d));
        match o {
            OptimizerStrategy::DMuon => {
                assert_eq!(
                    named(".pub.recompute").len(),
                    7,
                    "7 matrices published for the recompute"
                );
                assert_eq!(pub_bwd.len(), 7, "and again for the backward");
                assert!(pub_bwd.iter().all(|&i| after_recompute(i)));
                let first_bwd = *bwd.first().unwrap();
                // The publications share the all-gather stream: waiting the last waits all.
                let last_pub = pub_bwd.iter().max().unwrap();
                assert!(deps_of(first_bwd).contains(last_pub));
                assert!(norms_bwd.iter().all(|&i| !after_recompute(i)));
            }
            _ => {
                // MatrixFSDP publishes per owner (`<unit>.pub.o<owner>.bwd`,
                // `broadcast_rank_segments_1d_into_async`): one broadcast per distinct owner
                // of the layer's seven matrices.
                let per_owner: Vec<usize> = named(".bwd")
                    .into_iter()
                    .filter(|&i| p.ops[i].name.as_deref().unwrap().contains(".pub.o"))
                    .collect();
                assert!(named(".pub.recompute").is_empty(), "{o}");
                assert!(pub_bwd.is_empty(), "{o}: no per-matrix publication");
                assert!((1..=7).contains(&per_owner.len()), "{o}: {per_owner:?}");
                assert!(per_owner.iter().all(|&i| !after_recompute(i)), "{o}");
            }
        }
    }
}

/// Equal template keys give programs equal up to their groups' ranks and op names (labels
/// for reports, which folding ignores), for Muon programs.
#[test]
fn muon_template_keys_fold_identical_programs() {
    // Per-expert weights (mini-exp-d): EP classes whose programs differ only in names share
    // keys.
    let all = muon_miniatures();
    for x in &all {
        let name = &x.s.file.name;
        for kind in StrategyKind::ALL {
            for o in OptimizerStrategy::ALL {
                let Ok(g) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
                    continue;
                };
                let mut by_key: HashMap<u64, StepProgram> = HashMap::new();
                for rank in 0..g.world_size() {
                    let mut prog = g.program(rank).unwrap();
                    for grp in &mut prog.groups {
                        grp.ranks = vec![grp.ranks.len()];
                    }
                    for op in &mut prog.ops {
                        op.name = None;
                    }
                    prog.rank = 0;
                    let key = g.template_key(rank);
                    match by_key.get(&key) {
                        Some(first) => assert_eq!(first, &prog, "{name} {kind} {o} rank {rank}"),
                        None => {
                            by_key.insert(key, prog);
                        }
                    }
                }
                if name == "mini-exp-d" && o == OptimizerStrategy::AdamW {
                    assert_eq!(by_key.len(), 1, "{kind}: EP classes share one template");
                }
            }
        }
    }
}

/// exp-d: generation time per rank and distinct template keys (`--nocapture` prints them).
#[test]
fn exp_d_generation_and_template_keys() {
    let x = load("paper/exp-d.toml");
    let t = Instant::now();
    let g = ProgramGenerator::new(&x.s, &x.p, &x.f, StrategyKind::HyperParallel).unwrap();
    let new_t = t.elapsed();
    assert_eq!(g.optimizer(), OptimizerStrategy::HyperParallelMuon);
    let w = g.world_size();
    let t = Instant::now();
    let keys: HashSet<u64> = (0..w).map(|r| g.template_key(r)).collect();
    let keys_t = t.elapsed();
    let t = Instant::now();
    let sample = [0, 1, 17, w / 2, w - 1];
    let mut ops = 0;
    for &r in &sample {
        ops = g.program(r).unwrap().ops.len();
    }
    let per_rank = t.elapsed() / sample.len() as u32;
    let p = g.program(0).unwrap();
    println!(
        "exp-d hyperparallel+muon: new {new_t:?}, {} distinct template keys over {w} ranks \
         (all keys {keys_t:?}), program {per_rank:?} per rank, {ops} ops; rank 0: {} \
         optimizer all-gathers, {} broadcasts, NS {:.3} TFLOP",
        keys.len(),
        optimizer_collectives(&p, CollectiveKind::AllGather),
        optimizer_collectives(&p, CollectiveKind::Broadcast),
        ns_flops_of(&p) as f64 / 1e12
    );
    assert!(per_rank.as_secs_f64() < 1.0, "{per_rank:?}");
}

/// One call on a communicator: (kind, dtype, input bytes, output bytes).
type Call = (CollectiveKind, hpfsdp_plan::model::DType, u64, u64);

/// Checks that the members of every communicator (label and ranks) issue identical call
/// sequences on it; returns the number of member sequences compared.
fn communicators_agree(g: &ProgramGenerator) -> Result<usize, String> {
    let mut first: HashMap<(String, Vec<usize>), (usize, Vec<Call>)> = HashMap::new();
    let mut compared = 0;
    for r in 0..g.world_size() {
        let p = g.program(r).map_err(|e| e.to_string())?;
        let mut per: Vec<Vec<Call>> = vec![Vec::new(); p.groups.len()];
        for c in p.ops.iter().filter_map(|o| o.payload.as_collective()) {
            per[c.group.index()].push((c.kind, c.dtype, c.input_bytes, c.output_bytes));
        }
        for (gi, seq) in per.into_iter().enumerate() {
            let key = (p.groups[gi].label.clone(), p.groups[gi].ranks.clone());
            match first.get(&key) {
                Some((r0, s0)) => {
                    compared += 1;
                    if *s0 != seq {
                        let i = s0.iter().zip(&seq).take_while(|(a, b)| a == b).count();
                        return Err(format!(
                            "communicator '{}' {:?}: rank {r0} and rank {r} differ at call {i}: \
                             {:?} vs {:?}",
                            key.0,
                            key.1,
                            s0.get(i),
                            seq.get(i)
                        ));
                    }
                }
                None => {
                    first.insert(key, (r, seq));
                }
            }
        }
    }
    Ok(compared)
}

/// A 32-rank exp-d in miniature: MLA + per-expert MoE, dense HSDP 2 x 8 x TP 2 and expert
/// 4 replicas x EP 4 x ETP 2, so that a dense shard group spans EP classes whose replica
/// owners of an expert batch differ (an expert batch sits between two dense batches in plan
/// order, and some classes own none of it).
/// Regression (exp-d: "rank 697 op#30179 is broadcast ..., but rank 705 issued all-gather
/// ... as the same call"): every member of a communicator issues the same collective
/// sequence, for every Muon optimizer strategy on every FSDP strategy. The HyperParallel
/// Muon used to prefetch the next gathers at "the rank's previous non-empty NS batch", which
/// depends on the EP class and on replica ownership in other domains, so a dense shard group
/// saw a prefetched gather before a relay broadcast on some members and after it on others.
#[test]
fn communicator_members_issue_identical_sequences() {
    let mut all: Vec<Plans> = MUON_SCENARIOS.iter().map(|r| load(r)).collect();
    all.push(mini_exp_d());
    for x in &all {
        for kind in StrategyKind::ALL {
            for o in OptimizerStrategy::ALL.into_iter().filter(|o| o.is_muon()) {
                let Ok(g) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
                    assert!(o.owner_placement() && kind != StrategyKind::HyperParallel);
                    continue;
                };
                let n = communicators_agree(&g)
                    .unwrap_or_else(|e| panic!("{} {kind} {o}: {e}", x.s.file.name));
                assert!(n > 0, "{} {kind} {o}", x.s.file.name);
            }
        }
    }
}

/// The same check on exp-d itself (768 ranks, about 25 CPU s per optimizer strategy in
/// release builds; the strategies are independent, so one worker per core takes them in
/// turn): `cargo test --workspace --release --test strategy_muon -- --ignored`.
#[test]
#[ignore = "slow: generates 768 exp-d programs per optimizer strategy"]
fn exp_d_communicator_members_issue_identical_sequences() {
    let x = load("paper/exp-d.toml");
    let muon: Vec<OptimizerStrategy> = OptimizerStrategy::ALL
        .into_iter()
        .filter(|o| o.is_muon())
        .collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(muon.len());
    // A panic in a worker fails the test when the scope ends.
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while let Some(&o) = muon.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let g = gen_with(&x, StrategyKind::HyperParallel, o);
                    communicators_agree(&g).unwrap_or_else(|e| panic!("exp-d {o}: {e}"));
                }
            });
        }
    });
}

/// Moonlight (ZeRO-1 distributed optimizer): each rank orthogonalizes only the matrices
/// overlapping its partition of the bucket's flat buffer, so over the job every matrix is
/// orthogonalized at least once and the total stays below naive's every-matrix-everywhere;
/// only the matrices straddling a partition boundary are gathered.
#[test]
fn moonlight_orthogonalizes_only_the_partition_overlap() {
    let x = load("paper/muon-vs-dmuon.toml");
    let m = build_muon_plan(&x.s, &x.p, &x.f);
    let single = single_device_ns(&m, 5);
    let g = gen_with(
        &x,
        StrategyKind::HyperParallel,
        OptimizerStrategy::Moonlight,
    );
    let naive = gen_with(&x, StrategyKind::HyperParallel, OptimizerStrategy::Naive);
    let mut total = 0;
    for r in 0..g.world_size() {
        let p = g.program(r).unwrap();
        let f = ns_flops_of(&p);
        assert!(f < single, "rank {r} orthogonalizes every matrix");
        total += f;
        assert!(
            optimizer_collectives(&p, CollectiveKind::AllGather)
                < optimizer_collectives(&naive.program(r).unwrap(), CollectiveKind::AllGather),
            "rank {r}: only straddling matrices are gathered"
        );
    }
    println!(
        "moonlight: {:.1} TFLOP over 16 ranks, single device {:.1} TFLOP",
        total as f64 / 1e12,
        single as f64 / 1e12
    );
    assert!(total >= single, "some matrix is orthogonalized nowhere");
    assert!(total < single * g.world_size() as u64);
}

/// MatrixFSDP reduces a unit's gradients once per owner rank (`reduce_owner_rank_chunks_1d_async`
/// with the default `owner_broadcast` backend): per layer, one reduce per distinct owner,
/// named by owner, carrying together the whole fp32 gradients of every matrix that owner
/// holds (the layer's seven matrices in total); DMuon keeps one reduce per matrix.
#[test]
fn matrixfsdp_reduces_once_per_owner() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let m = build_muon_plan(&x.s, &x.p, &x.f);
    let layer = "layers.5.";
    let grad_bytes: u64 = m
        .params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon && p.name.contains(layer))
        .map(|p| p.numel() * 4)
        .sum();
    let reduces = |o: OptimizerStrategy| -> Vec<(String, u64)> {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let p = g.program(0).unwrap();
        p.ops
            .iter()
            .filter_map(|op| {
                let n = op.name.as_deref()?;
                let c = op.payload.as_collective()?;
                (n.contains(layer) && n.contains(".reduce")).then(|| (n.to_string(), c.input_bytes))
            })
            .collect()
    };
    let mf = reduces(OptimizerStrategy::MatrixFsdp);
    let dm = reduces(OptimizerStrategy::DMuon);
    assert_eq!(dm.len(), 7, "{dm:?}");
    assert!(!mf.is_empty() && mf.len() <= 7, "{mf:?}");
    // Unit-level names "<unit>.reduce.o<owner>", one per owner.
    let owners: HashSet<usize> = mf
        .iter()
        .map(|(n, _)| {
            let (unit, owner) = n.rsplit_once(".reduce.o").expect(n);
            assert!(!unit.contains("proj"), "{n}: a per-matrix reduce");
            owner.parse::<usize>().expect(n)
        })
        .collect();
    assert_eq!(owners.len(), mf.len(), "one reduce per owner: {mf:?}");
    assert!(owners.iter().all(|&o| o < 16));
    // MatrixFSDP reduces its f32 workspace; DMuon reduces each gradient as autograd produced
    // it, in bf16 (`dmuon/_backends/fsdp2/group.py` `reduce_grads`: `dist.reduce(grad, ...)`
    // with no cast), half the bytes.
    assert_eq!(mf.iter().map(|x| x.1).sum::<u64>(), grad_bytes);
    assert_eq!(dm.iter().map(|x| x.1).sum::<u64>(), grad_bytes / 2);
    // Over the whole model some owner holds two matrices of one layer (greedy balance over
    // 168 matrices and 16 owners), so there are fewer reduces than placed matrices.
    let count = |o: OptimizerStrategy| {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let p = g.program(0).unwrap();
        p.ops
            .iter()
            .filter(|op| op.name.as_deref().is_some_and(|n| n.contains(".reduce")))
            .count()
    };
    let (mf_all, dm_all) = (
        count(OptimizerStrategy::MatrixFsdp),
        count(OptimizerStrategy::DMuon),
    );
    assert_eq!(dm_all, 168);
    assert!(mf_all < dm_all, "{mf_all} per-owner reduces");
}

/// HyperParallel relays per NS memory batch, not once per assignment
/// (`_process_shard_params` at 3ad2a77): on the dense MatrixFSDP comparison, rank 0's program
/// issues exactly the plan's per-memory-batch relay broadcasts, with their bytes (their order
/// against NS and gathers is checked by `at_most_one_batch_in_flight`).
#[test]
fn relays_follow_the_memory_batches() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let m = build_muon_plan(&x.s, &x.p, &x.f);
    let g = gen_with(
        &x,
        StrategyKind::HyperParallel,
        OptimizerStrategy::HyperParallelMuon,
    );
    let p = g.program(0).unwrap();
    let relays: Vec<u64> = p
        .ops
        .iter()
        .filter(|o| o.name.as_deref().is_some_and(|n| n.contains(".relay.")))
        .filter_map(|o| o.payload.as_collective().map(|c| c.input_bytes))
        .collect();
    let planned: Vec<u64> = m
        .batches
        .iter()
        .flat_map(|b| b.memory_relays.iter().flatten().map(|r| r.1))
        .collect();
    assert!(m.batches.iter().all(|b| b.memory_batches.len() > 1));
    assert_eq!(relays.len(), planned.len());
    assert_eq!(relays.iter().sum::<u64>(), planned.iter().sum::<u64>());
    assert!(
        relays.len() > 16,
        "{} relays: one set per assignment",
        relays.len()
    );
}

/// The GEMM kernels of a program's NS ops.
fn ns_gemms(p: &StepProgram) -> Vec<hpfsdp_plan::kernel::KernelWork> {
    p.ops
        .iter()
        .filter(|o| o.category == Category::Optimizer && is_ns(o.name.as_deref().unwrap_or("")))
        .flat_map(|o| match o.payload {
            Payload::Compute(w) => p.kernel_mixes[&w.mix.expect("NS ops carry a kernel mix")]
                .iter()
                .filter(|k| k.class.name() == "gemm")
                .copied()
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect()
}

/// The owner baselines run their optimizers as the code does on the comparison's NPUs
/// (`dmuon/optim/muon.py` `_step_muon`, `torch.optim.Muon` `_single_tensor_muon`): one NS call
/// per owned matrix (every NS GEMM has batch 1: DMuon's same-shape batches need its CUDA-only
/// `profiled_ilp` strategy), each matrix orthogonalized exactly once over the job; DMuon's
/// Gram-space NS takes the `torch.mm` path (no CUDA SYRK on an NPU), `8m²n + 28m³` FLOPs per
/// matrix with full GEMMs, MatrixFSDP's the standard `20m²n + 10m³`; momentum is launched per
/// parameter (three tensor ops for DMuon, two lerps for torch.optim.Muon).
#[test]
fn owner_baselines_orthogonalize_one_matrix_at_a_time() {
    let x = load("paper/muon-vs-dmuon.toml");
    let m = build_muon_plan(&x.s, &x.p, &x.f);
    let muon: Vec<(u64, u64)> = m
        .params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon)
        .map(|p| {
            let (r, c) = p.core_shape.unwrap();
            assert_eq!(p.matrices, 1, "{}: dense 2-D matrices", p.name);
            (r.min(c), r.max(c))
        })
        .collect();
    let gram: u64 = muon
        .iter()
        .map(|&(a, b)| 8 * a * a * b + 28 * a * a * a)
        .sum();
    for (o, expected, per_param_momentum) in [
        (OptimizerStrategy::DMuon, gram, 3),
        (OptimizerStrategy::MatrixFsdp, single_device_ns(&m, 5), 2),
    ] {
        let g = gen_with(&x, StrategyKind::HyperParallel, o);
        let (mut total, mut owned) = (0u64, 0usize);
        for r in 0..g.world_size() {
            let p = g.program(r).unwrap();
            let gemms = ns_gemms(&p);
            assert!(
                gemms.iter().all(|k| matches!(
                    k.class,
                    hpfsdp_plan::kernel::KernelClass::Gemm { batch: 1, .. }
                )),
                "{o} rank {r}: a batched NS GEMM"
            );
            total += gemms.iter().map(|k| k.flops).sum::<u64>();
            let Some(mom) = p
                .ops
                .iter()
                .find(|op| op.name.as_deref() == Some("muon.owned.momentum"))
            else {
                continue;
            };
            let Payload::Compute(w) = mom.payload else {
                panic!("{o}: momentum is compute")
            };
            let launches: u32 = p.kernel_mixes[&w.mix.unwrap()]
                .iter()
                .map(|k| k.count)
                .sum();
            assert_eq!(launches % per_param_momentum, 0, "{o} rank {r}");
            owned += (launches / per_param_momentum) as usize;
        }
        assert_eq!(owned, muon.len(), "{o}: every matrix owned once");
        assert_eq!(total, expected, "{o}: NS GEMM FLOPs over the job");
    }
}

/// DMuon iterates over its coefficient list (five Polar Express sets) whatever the scenario's
/// `ns_steps` (`gram_newton_schulz_local` ignores `steps`); the other implementations follow
/// `ns_steps`.
#[test]
fn dmuon_ignores_ns_steps() {
    let flops = |x: &Plans, o: OptimizerStrategy| -> u64 {
        let g = gen_with(x, StrategyKind::HyperParallel, o);
        (0..g.world_size())
            .map(|r| ns_flops_of(&g.program(r).unwrap()))
            .sum()
    };
    let five = load("paper/muon-vs-dmuon.toml");
    let three = edited(
        "paper/muon-vs-dmuon.toml",
        &[("ns_steps = 5", "ns_steps = 3")],
        "",
    );
    assert_eq!(
        flops(&five, OptimizerStrategy::DMuon),
        flops(&three, OptimizerStrategy::DMuon)
    );
    let (m5, m3) = (
        flops(&five, OptimizerStrategy::MatrixFsdp),
        flops(&three, OptimizerStrategy::MatrixFsdp),
    );
    assert_eq!(m3 * 5, m5 * 3, "torch.optim.Muon runs ns_steps iterations");
}

/// HyperParallel's `apply_reduced_grad` (`TorchHSDPParamV2`, `platform/torch/fully_shard/
/// param.py`) casts the reduced shard to the parameter's own dtype before assigning it
/// (`reduced_grad.to(self.orig_dtype)` when they differ and no FP32 main grad is kept). With a
/// bf16 master and an f32 reduction (muon-vs-dmuon, one micro-batch, no replicas) every
/// reduce-scatter output is cast once on the compute stream after its division: one kernel
/// per parameter reading 4 and writing 2 bytes per element of the shard, so the settle ops
/// move 1.5 times the reduce-scatter output bytes. With FP32 master weights
/// (muon-vs-matrixfsdp) or an FP32 `main_grad` (`[fsdp] fp32_main_grad`) there is no cast
/// and, on one micro-batch, no settle op at all for the reduce-scattered parameters.
#[test]
fn reduced_gradients_are_cast_back_to_the_master_dtype() {
    let settles = |rel: &str, main_grad: bool| -> (usize, u64, usize, u64) {
        let x = if main_grad {
            let from = "reduce_dtype = \"f32\"";
            edited(
                rel,
                &[(from, &format!("{from}\nfp32_main_grad = true"))],
                "",
            )
        } else {
            load(rel)
        };
        let g = gen_with(
            &x,
            StrategyKind::HyperParallel,
            OptimizerStrategy::HyperParallelMuon,
        );
        let p = g.program(0).unwrap();
        let rs: Vec<u64> = p
            .ops
            .iter()
            .filter(|o| o.category == Category::FsdpRs)
            .filter_map(|o| o.payload.as_collective())
            .filter(|c| c.kind == CollectiveKind::ReduceScatter)
            .map(|c| c.output_bytes)
            .collect();
        let settle: Vec<(u32, u64)> = p
            .ops
            .iter()
            .filter(|o| o.name.as_deref().is_some_and(|n| n.ends_with(".settle")))
            .filter_map(|o| match &o.payload {
                Payload::Compute(w) => Some((w.kernels, w.hbm_bytes)),
                _ => None,
            })
            .collect();
        assert!(
            settle.iter().all(|&(k, _)| k == 1),
            "{rel}: one cast kernel per parameter"
        );
        (
            rs.len(),
            rs.iter().sum(),
            settle.len(),
            settle.iter().map(|x| x.1).sum(),
        )
    };
    let (n_rs, rs_bytes, n_settle, settle_bytes) = settles("paper/muon-vs-dmuon.toml", false);
    assert!(n_rs > 100, "{n_rs} reduce-scatters");
    assert_eq!(n_settle, n_rs, "one cast per reduced shard");
    assert_eq!(2 * settle_bytes, 3 * rs_bytes, "read f32, write bf16");
    let (n_rs, _, n_settle, _) = settles("paper/muon-vs-matrixfsdp.toml", false);
    assert!(n_rs > 100, "{n_rs} reduce-scatters");
    assert_eq!(n_settle, 0, "FP32 master weights: nothing to cast");
    // `[fsdp] fp32_main_grad = true` (`apply_grad_on_fp32_main_grad`): the f32 reduced shard
    // becomes the FP32 main gradient as it is.
    let (n_rs, _, n_settle, _) = settles("paper/muon-vs-dmuon.toml", true);
    assert!(n_rs > 100, "{n_rs} reduce-scatters");
    assert_eq!(n_settle, 0, "FP32 main_grad: nothing to cast");
}

/// DMuon's Stage-1 reduces of a layer sit in one `dist._coalescing_manager` block
/// (`dmuon/_backends/fsdp2/group.py` `reduce_grads`), which fuses nothing on an NPU:
/// `reduce` is not one of c10d's fast-path coalesced collectives, and torch_npu's
/// `ProcessGroupHCCL::collective` launches each `HcclReduce` on the group's stream at call
/// time. So a layer still issues one reduce per matrix, all together after the layer's
/// backward (same stream, same dependencies, no compute issued between them), each carrying
/// its whole bf16 gradient.
#[test]
fn dmuon_layer_reduces_run_back_to_back() {
    let x = load("paper/muon-vs-dmuon.toml");
    let g = gen_with(&x, StrategyKind::HyperParallel, OptimizerStrategy::DMuon);
    let p = g.program(0).unwrap();
    for layer in ["layers.0.", "layers.17.", "layers.29."] {
        let idx: Vec<usize> = p
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(layer) && n.ends_with(".reduce"))
            })
            .map(|(i, _)| i)
            .collect();
        assert_eq!(idx.len(), 7, "{layer}: one reduce per matrix");
        let first = &p.ops[idx[0]];
        // Only the layer's norms' reduce-scatters and their in-place AVG divisions come
        // between them, all on the same HCCL stream: nothing on the compute stream.
        for o in (idx[0]..=idx[6]).map(|i| &p.ops[i]) {
            assert!(
                o.stream == first.stream,
                "{layer}: {:?} between the reduces {idx:?}",
                o.name
            );
        }
        for &i in &idx {
            let o = &p.ops[i];
            assert_eq!(o.stream, first.stream, "{layer}: one HCCL stream");
            assert_eq!(o.deps, first.deps, "{layer}: one issue point");
            let c = o.payload.as_collective().unwrap();
            assert_eq!(c.dtype, hpfsdp_plan::model::DType::Bf16, "{layer}: no cast");
        }
    }
}

/// The optimizer reads the gradient in the dtype the FSDP runtime leaves it: after
/// `apply_reduced_grad`'s cast, the bf16 master dtype (muon-vs-dmuon), so HyperParallel's
/// Muon momentum (`zeros_like(grad)`) takes 2 bytes per element; with an FP32 `main_grad`
/// (`[fsdp] fp32_main_grad = true`) it takes 4, and the momentum kernels move f32 gradients.
#[test]
fn momentum_follows_the_applied_gradient_dtype() {
    let rel = "paper/muon-vs-dmuon.toml";
    let from = "reduce_dtype = \"f32\"";
    let main_grad = edited(
        rel,
        &[(from, &format!("{from}\nfp32_main_grad = true"))],
        "",
    );
    let cast = load(rel);
    let state_and_bytes = |x: &Plans| -> (u64, u64) {
        let g = gen_with(
            x,
            StrategyKind::HyperParallel,
            OptimizerStrategy::HyperParallelMuon,
        );
        let p = g.program(0).unwrap();
        let momentum: u64 = p
            .ops
            .iter()
            .filter(|o| o.name.as_deref().is_some_and(|n| n.ends_with(".momentum")))
            .filter_map(|o| match &o.payload {
                Payload::Compute(w) => Some(w.hbm_bytes),
                _ => None,
            })
            .sum();
        (g.optimizer_state_bytes(0).unwrap().0, momentum)
    };
    let (bf16_state, bf16_bytes) = state_and_bytes(&cast);
    let (f32_state, f32_bytes) = state_and_bytes(&main_grad);
    assert!(bf16_state > 0 && bf16_bytes > 0);
    assert_eq!(2 * bf16_state, f32_state);
    // Read gradient and momentum, write momentum in that dtype, plus the bf16 NS input:
    // 3 x 4 + 2 against 3 x 2 + 2 bytes per element.
    assert_eq!(8 * f32_bytes, 14 * bf16_bytes);
}
