//! FSDP/HSDP and Muon plans against hand calculations: exp-b's per-parameter all-gather and
//! reduce-scatter sizes (bf16, 16 shards, zero-copy) and per-micro-batch collective counts;
//! uneven ceil-chunk sharding on a tiny model; experts that shard dim 1 when too few remain
//! per rank; per-expert weights under EP x expert TP; the HSDP fused all-reduce buffers of
//! the muon-hsdp-2x8 fixture (payload rounded up to 512 B, offsets back to back); Muon routing, core
//! shapes, matrix-plane gather predicate, HSDP batches, the 2^29 / shard-size NS memory cap,
//! greedy owner balance and replica subgroups (24 replicas on 16-die machines -> 12).

use hpfsdp_plan::chunk_range;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan, ParamFsdp, build_fsdp_plan, round_up_512};
use hpfsdp_plan::muon::{
    MuonBatch, MuonParam, MuonPlan, NS_BATCH_NUMEL, OptimizerRoute, build_muon_plan,
    replica_subgroup_size,
};
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::topology::Tier;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

struct Plans {
    scenario: Scenario,
    sharding: ShardingPlan,
    fsdp: FsdpPlan,
    muon: MuonPlan,
}

fn paper(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/paper")
        .join(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn plans(path: &Path) -> Plans {
    plans_from(Scenario::load(path).unwrap_or_else(|e| panic!("{e}")))
}

fn plans_from(scenario: Scenario) -> Plans {
    let sharding = plan(&scenario.model, &scenario.planner_input());
    assert!(
        !sharding.has_errors(),
        "{}: {:?}",
        scenario.file.name,
        sharding.lints
    );
    let fsdp = build_fsdp_plan(&scenario, &sharding);
    let muon = build_muon_plan(&scenario, &sharding, &fsdp);
    Plans {
        scenario,
        sharding,
        fsdp,
        muon,
    }
}

fn fp<'a>(p: &'a Plans, name: &str) -> &'a ParamFsdp {
    p.fsdp
        .param(name)
        .unwrap_or_else(|| panic!("no FSDP plan for {name}"))
}

fn mp<'a>(p: &'a Plans, name: &str) -> (usize, &'a MuonParam) {
    p.muon
        .params
        .iter()
        .enumerate()
        .find(|(_, x)| x.name == name)
        .unwrap_or_else(|| panic!("no Muon plan for {name}"))
}

fn batch_of(p: &Plans, idx: usize) -> &MuonBatch {
    p.muon
        .batches
        .iter()
        .find(|b| b.params.contains(&idx))
        .unwrap()
}

// ---------------------------------------------------------------- FSDP

#[test]
fn exp_b_q_proj_and_embedding_sizes() {
    let p = plans(&paper("exp-b.toml"));
    let shard = &p.fsdp.groups["dense.shard"];
    assert_eq!(shard.size, 16);
    assert_eq!(shard.tier, Tier::IntraMachine);
    assert_eq!(shard.rank0_group, (0..16).collect::<Vec<_>>());
    assert_eq!(p.fsdp.groups["dense.replicate"].size, 1);

    // q_proj [4096,2048] over 16: 256 rows each, 524288 elements, bf16 all-gather.
    let q = fp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.domain, DataDomain::Dense);
    assert_eq!(q.plan_local_shape, [4096, 2048]);
    assert_eq!(q.shard_dim, 0);
    assert_eq!(q.local_shape, [256, 2048]);
    assert_eq!(q.padded_shard_numel, 524_288);
    assert_eq!(q.all_gather.bytes_in_per_rank, 1_048_576);
    assert_eq!(q.all_gather.bytes_out_per_rank, 16_777_216);
    assert!(q.all_gather.aligned_512);
    // bf16 reduction (HCCL bf16): the full gradient in, the shard out.
    assert_eq!(q.reduce_scatter.bytes_in_per_rank, 16_777_216);
    assert_eq!(q.reduce_scatter.bytes_out_per_rank, 1_048_576);
    assert!(q.zero_copy && q.copy_reason.is_none());
    assert_eq!(q.ar_offset_elems, None);
    assert_eq!(p.fsdp.units[q.unit].name, "model.layers.0");

    // Embedding [151936,2048] over 16: 9496 rows exactly.
    let e = fp(&p, "model.embed_tokens.weight");
    assert_eq!(e.local_shape, [9496, 2048]);
    assert_eq!(e.padded_shard_numel, 9496 * 2048);
    assert_eq!(e.all_gather.bytes_in_per_rank, 9496 * 2048 * 2);
    assert_eq!(p.fsdp.units[e.unit].name, "model.embed_tokens");
    let h = fp(&p, "lm_head.weight");
    assert_eq!(p.fsdp.units[h.unit].name, "model.norm+lm_head");

    // Fused experts stay in the dense domain without EP: [128,1536,2048] -> [8,1536,2048].
    let gu = fp(&p, "model.layers.47.mlp.experts.gate_up_proj");
    assert_eq!(gu.domain, DataDomain::Dense);
    assert_eq!(gu.local_shape, [8, 1536, 2048]);
    assert_eq!(gu.padded_shard_numel, 8 * 1536 * 2048);
    assert!(gu.zero_copy);
    // Norm [2048] -> 128.
    assert_eq!(
        fp(&p, "model.layers.0.input_layernorm.weight").local_shape,
        [128]
    );
}

#[test]
fn exp_b_collective_counts_per_micro_batch() {
    let p = plans(&paper("exp-b.toml"));
    // 48 layers x 11 params + embedding + final norm + head = 531 parameters, every one
    // sharded: 531 reduce-scatters (the paper's measured count for HyperParallel on exp B),
    // and 2 x 531 - 3 all-gathers with reshard-after-forward: the three root parameters
    // (embedding, final norm, lm_head) are not resharded after forward, so not gathered again
    // for backward (1,059 = the measured 1,087 minus its 28 Muon gathers).
    assert_eq!(p.fsdp.params.len(), 531);
    assert_eq!(p.fsdp.units.len(), 50);
    assert!(p.fsdp.reshard_after_forward);
    let root: Vec<&str> = p
        .fsdp
        .units
        .iter()
        .filter(|u| u.is_root())
        .flat_map(|u| u.params.iter().map(String::as_str))
        .collect();
    assert_eq!(
        root,
        [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight"
        ]
    );
    assert_eq!(p.fsdp.collective_counts(), (1059, 531, 0));
    // Without reshard-after-forward nothing is gathered again: one all-gather per parameter.
    let mut kept = p.fsdp.clone();
    kept.reshard_after_forward = false;
    assert_eq!(kept.collective_counts(), (531, 531, 0));
    assert!(p.fsdp.all_reduces.is_empty());
    assert!(p.fsdp.params.iter().all(|x| x.zero_copy));
    // Units in forward order, each layer's unit holds its 11 parameters.
    assert_eq!(p.fsdp.units[1].name, "model.layers.0");
    assert_eq!(p.fsdp.units[1].layer, Some(0));
    assert_eq!(p.fsdp.units[1].params.len(), 11);
    assert_eq!(
        p.fsdp.units[49].params,
        ["model.norm.weight", "lm_head.weight"]
    );
    let _ = &p.sharding;
}

#[test]
fn uneven_shards_pad_to_the_ceil_chunk() {
    // tiny-dense over 6 shards: hidden 40, vocab 100, kv dim 20, intermediate 72.
    let p = plans(&fixture("fsdp-uneven.toml"));
    assert_eq!(p.fsdp.groups["dense.shard"].size, 6);
    let cases: [(&str, &[u64], &[u64], u64); 6] = [
        (
            "model.layers.0.self_attn.q_proj.weight",
            &[40, 40],
            &[7, 40],
            280,
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            &[20, 40],
            &[4, 40],
            160,
        ),
        ("model.embed_tokens.weight", &[100, 40], &[17, 40], 680),
        (
            "model.layers.1.mlp.gate_proj.weight",
            &[72, 40],
            &[12, 40],
            480,
        ),
        (
            "model.layers.1.mlp.down_proj.weight",
            &[40, 72],
            &[7, 72],
            504,
        ),
        ("model.norm.weight", &[40], &[7], 7),
    ];
    for (name, full, local, padded) in cases {
        let f = fp(&p, name);
        assert_eq!(f.plan_local_shape, full, "{name}");
        assert_eq!(f.shard_dim, 0, "{name}");
        assert_eq!(f.local_shape, local, "{name}");
        assert_eq!(f.padded_shard_numel, padded, "{name}");
        // Rank 0's rows are the ceil chunk; the ranks' real rows add up to the dim.
        let rows: Vec<u64> = (0..6)
            .map(|r| {
                let c = chunk_range(full[0], 6, r);
                c.end - c.start
            })
            .collect();
        assert_eq!(rows[0], local[0], "{name}");
        assert_eq!(rows.iter().sum::<u64>(), full[0], "{name}");
        // Gathered in bf16 from an f32 master: a cast, so not zero-copy.
        assert_eq!(f.all_gather.bytes_in_per_rank, padded * 2, "{name}");
        assert_eq!(f.all_gather.bytes_out_per_rank, padded * 2 * 6, "{name}");
        assert_eq!(f.reduce_scatter.bytes_out_per_rank, padded * 4, "{name}");
        assert_eq!(f.reduce_scatter.bytes_in_per_rank, padded * 4 * 6, "{name}");
        assert!(!f.zero_copy, "{name}");
        assert!(f.copy_reason.as_deref().unwrap().contains("cast"), "{name}");
    }
    // The last ranks hold less (q_proj: 5 rows) or nothing at all (k_proj: 20 = 5 x 4).
    assert_eq!(chunk_range(40, 6, 5), 35..40);
    assert_eq!(chunk_range(20, 6, 5), 20..20);
    // 3360 B is not a multiple of 512.
    let q = fp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.all_gather.bytes_out_per_rank, 3360);
    assert!(!q.all_gather.aligned_512);
}

#[test]
fn experts_shard_dim_1_when_fewer_than_the_shard_group() {
    // tiny-moe: 8 experts over ep 2 -> 4 per rank, expert shard group 8.
    let p = plans(&fixture("fsdp-expert-dim1.toml"));
    assert_eq!(p.fsdp.groups["expert.shard"].size, 8);
    assert_eq!(p.fsdp.groups["dense.shard"].size, 16);
    let gu = fp(&p, "model.layers.0.mlp.experts.gate_up_proj");
    assert_eq!(gu.domain, DataDomain::Expert);
    assert_eq!(gu.plan_local_shape, [4, 64, 64]);
    assert_eq!(gu.shard_dim, 1);
    assert_eq!(gu.local_shape, [4, 8, 64]);
    assert_eq!(gu.padded_shard_numel, 2048);
    assert_eq!(gu.all_gather.bytes_in_per_rank, 4096);
    assert_eq!(gu.all_gather.bytes_out_per_rank, 32_768);
    assert!(!gu.zero_copy);
    assert!(gu.copy_reason.as_deref().unwrap().contains("dim 1"));
    let down = fp(&p, "model.layers.1.mlp.experts.down_proj");
    assert_eq!(down.local_shape, [4, 8, 32]);
    // Attention stays dense: q_proj [64,64] over 16 shards.
    let q = fp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.domain, DataDomain::Dense);
    assert_eq!(q.local_shape, [4, 64]);
    assert!(q.zero_copy);
}

#[test]
fn per_expert_weights_are_sized_on_their_owner_with_expert_tp() {
    // tiny-moe per expert: 8 experts over ep 2 (4 each), etp 2, edp_shard 2.
    let p = plans(&fixture("fsdp-per-expert.toml"));
    assert_eq!(p.fsdp.groups["expert.shard"].size, 2);
    let e = |i: u32, w: &str| format!("model.layers.1.mlp.experts.{i}.{w}.weight");
    assert_eq!(
        p.sharding.param(&e(5, "down_proj")).unwrap().ep_owner,
        Some(1)
    );
    // down_proj [64,32] rowwise etp S(1) -> [64,16] on its owner -> [32,16] per edp shard.
    let d = fp(&p, &e(5, "down_proj"));
    assert_eq!(d.domain, DataDomain::Expert);
    assert_eq!(d.plan_local_shape, [64, 16]);
    assert_eq!(d.local_shape, [32, 16]);
    assert_eq!(d.padded_shard_numel, 512);
    assert_eq!(d.all_gather.bytes_in_per_rank, 1024);
    // gate_proj [32,64] colwise etp S(0) -> [16,64] -> [8,64]; expert 0 is owned by ep 0.
    for i in [0, 5] {
        let g = fp(&p, &e(i, "gate_proj"));
        assert_eq!(g.plan_local_shape, [16, 64], "expert {i}");
        assert_eq!(g.local_shape, [8, 64], "expert {i}");
        assert!(g.zero_copy);
    }
    // Dense attention: q_proj [64,64] tp S(0) -> [32,64] over 4 shards.
    let q = fp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.local_shape, [8, 64]);
}

#[test]
fn hsdp_fused_all_reduce_buffers() {
    // muon-hsdp-2x8: Qwen3-30B-A3B, 2 replicas x 8 shards, f32 reduction.
    let p = plans(&paper("../fixtures/muon-hsdp-2x8.toml"));
    assert_eq!(p.fsdp.groups["dense.replicate"].size, 2);
    assert_eq!(p.fsdp.groups["dense.replicate"].rank0_group, [0, 8]);
    assert_eq!(p.fsdp.groups["dense.shard"].size, 8);
    // One fused buffer per unit (one domain without EP).
    assert_eq!(p.fsdp.all_reduces.len(), p.fsdp.units.len());
    assert_eq!(p.fsdp.collective_counts(), (1059, 531, 50));
    for (ui, ar) in p.fsdp.all_reduces.iter().enumerate() {
        assert_eq!(ar.unit, ui);
        assert_eq!(ar.domain, DataDomain::Dense);
        assert_eq!(ar.params, p.fsdp.units[ui].params);
        assert_eq!(ar.buffer_bytes, round_up_512(ar.payload_bytes));
        assert_eq!(ar.buffer_bytes % 512, 0);
        assert!(ar.buffer_bytes - ar.payload_bytes < 512);
        // Back to back, no per-parameter alignment.
        let mut offset = 0;
        for name in &ar.params {
            let f = fp(&p, name);
            assert_eq!(f.ar_offset_elems, Some(offset), "{name}");
            offset += f.padded_shard_numel;
        }
        assert_eq!(ar.payload_bytes, offset * 4);
    }
    // Layer 0 by hand (elements per shard of 8): q 512x2048, k/v 64x2048, o 256x4096,
    // q/k norms 16, router 16x2048, gate_up 16x1536x2048, down 16x2048x768, two norms 256.
    let ar = &p.fsdp.all_reduces[1];
    assert_eq!(p.fsdp.units[1].name, "model.layers.0");
    let offsets: Vec<u64> = ar
        .params
        .iter()
        .map(|n| fp(&p, n).ar_offset_elems.unwrap())
        .collect();
    assert_eq!(
        offsets,
        [
            0, 1_048_576, 1_179_648, 1_310_720, 2_359_296, 2_359_312, 2_359_328, 2_392_096,
            52_723_744, 77_889_568, 77_889_824
        ]
    );
    assert_eq!(ar.payload_bytes, 77_890_080 * 4);
    assert_eq!(ar.payload_bytes, 311_560_320);
    assert_eq!(ar.buffer_bytes, 311_560_704);
    // The embedding unit: 18992 x 2048 x 4 B is already a multiple of 512.
    let emb = &p.fsdp.all_reduces[0];
    assert_eq!(emb.payload_bytes, 155_582_464);
    assert_eq!(emb.buffer_bytes, emb.payload_bytes);
}

#[test]
fn round_up_512_edges() {
    assert_eq!(round_up_512(0), 0);
    assert_eq!(round_up_512(1), 512);
    assert_eq!(round_up_512(512), 512);
    assert_eq!(round_up_512(513), 1024);
}

// ---------------------------------------------------------------- Muon

/// Checks that every Muon parameter is in exactly one batch, NS memory batches respect the
/// 2^29 / shard-size cap (a lone oversize parameter excepted), and owner loads are balanced.
fn check_batch_invariants(p: &Plans) {
    let mut seen = BTreeSet::new();
    for b in &p.muon.batches {
        for &i in &b.params {
            assert!(seen.insert(i), "param {i} in two batches");
            assert_eq!(p.muon.params[i].route, OptimizerRoute::Muon);
        }
        assert_eq!(
            b.numel,
            b.params
                .iter()
                .map(|&i| p.muon.params[i].numel())
                .sum::<u64>()
        );
        let first = &p.muon.params[b.params[0]];
        let cap = if b.shard_path {
            NS_BATCH_NUMEL / first.shard_size() as u64
        } else {
            NS_BATCH_NUMEL
        };
        let mut in_mem: Vec<usize> = b.memory_batches.iter().flatten().copied().collect();
        in_mem.sort_unstable();
        let mut members = b.params.clone();
        members.sort_unstable();
        assert_eq!(in_mem, members);
        for mb in &b.memory_batches {
            let n: u64 = mb.iter().map(|&i| p.muon.params[i].numel()).sum();
            // Shard path: a memory batch first takes S matrices (min_batch_size = S), then
            // closes at the cap; local path: one.
            let fill = p.scenario.file.optimizer.muon.ns_batch_fill_owners != Some(false);
            let min = if b.shard_path && fill {
                first.shard_size()
            } else {
                1
            };
            assert!(
                mb.len() <= min || n <= cap,
                "memory batch {n} over cap {cap}"
            );
            if b.shard_path && !std::ptr::eq(mb, b.memory_batches.last().unwrap()) {
                assert!(
                    mb.len() >= min,
                    "a shard-path memory batch fills every owner first"
                );
            }
            if !b.shard_path {
                let shapes: BTreeSet<_> = mb.iter().map(|&i| p.muon.params[i].core_shape).collect();
                assert_eq!(shapes.len(), 1, "local NS batches share a core shape");
            }
        }
        let shard_sizes: Vec<usize> = first.shard_axes.iter().map(|a| a.size).collect();
        let replica_sizes: Vec<usize> = first
            .replicate_axes
            .iter()
            .map(|(_, s)| p.muon.replica_count.map_or(*s, |c| (*s).min(c)))
            .collect();
        // Replica owners balance over the whole batch; shard owners balance inside each
        // replica owner's subset of records (notes 6.4/6.5: the shard-domain greedy pass runs
        // over the rank's `owned_records`).
        let no_subsets = BTreeMap::new();
        for (owners, sizes, subsets) in [
            (&b.shard_owner, shard_sizes, &b.replica_owner),
            (&b.replica_owner, replica_sizes, &no_subsets),
        ] {
            if owners.is_empty() {
                continue;
            }
            assert_eq!(owners.len(), b.params.len());
            let coords: usize = sizes.iter().product();
            let mut per_subset: BTreeMap<Option<&Vec<usize>>, BTreeMap<&Vec<usize>, u64>> =
                BTreeMap::new();
            let mut biggest: BTreeMap<Option<&Vec<usize>>, u64> = BTreeMap::new();
            for (i, c) in owners.iter() {
                assert_eq!(c.len(), sizes.len());
                assert!(
                    c.iter().zip(&sizes).all(|(x, s)| x < s),
                    "{c:?} outside {sizes:?}"
                );
                let n = p.muon.params[*i].numel();
                let sub = subsets.get(i);
                *per_subset.entry(sub).or_default().entry(c).or_default() += n;
                let big = biggest.entry(sub).or_default();
                *big = (*big).max(n);
            }
            for (sub, load) in &per_subset {
                let max = load.values().copied().max().unwrap();
                let min = if load.len() < coords {
                    0
                } else {
                    load.values().copied().min().unwrap()
                };
                let biggest = biggest[sub];
                assert!(
                    max - min <= biggest,
                    "loads {min}..{max} differ by more than {biggest} (replica subset {sub:?})"
                );
            }
        }
    }
    let muon_params = p
        .muon
        .params
        .iter()
        .filter(|x| x.route == OptimizerRoute::Muon)
        .count();
    assert_eq!(seen.len(), muon_params);
}

#[test]
fn exp_b_muon_routing_and_shapes() {
    let p = plans(&paper("exp-b.toml"));
    assert_eq!(p.muon.params.len(), 531);
    let adamw = |n: &str, why: &str| {
        let (_, x) = mp(&p, n);
        assert_eq!(x.route, OptimizerRoute::Adamw, "{n}");
        assert!(x.route_reason.contains(why), "{n}: {}", x.route_reason);
        assert_eq!(x.core_shape, None);
    };
    adamw("model.embed_tokens.weight", "embed");
    adamw("lm_head.weight", "lm_head");
    adamw("model.norm.weight", "1-D");
    adamw("model.layers.0.self_attn.q_norm.weight", "1-D");

    // 2-D FSDP-sharded matrices: dim 0 cut by dp_shard -> the matrix plane is sharded.
    let (_, q) = mp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.route, OptimizerRoute::Muon);
    assert_eq!(q.core_shape, Some((4096, 2048)));
    assert_eq!(q.matrices, 1);
    assert_eq!(q.shard_axes.len(), 1);
    assert_eq!(
        (q.shard_axes[0].axis.as_str(), q.shard_axes[0].tensor_dim),
        ("dp_shard", 0)
    );
    assert_eq!(q.shard_size(), 16);
    assert!(q.replicate_axes.is_empty());
    assert!(q.needs_gather);
    let (_, router) = mp(&p, "model.layers.0.mlp.gate.weight");
    assert_eq!(router.route, OptimizerRoute::Muon);
    assert!(router.needs_gather);

    // Fused experts: E matrices each, only the expert dim sharded -> local Newton-Schulz.
    let (gi, gu) = mp(&p, "model.layers.0.mlp.experts.gate_up_proj");
    assert_eq!(gu.route, OptimizerRoute::Muon);
    assert_eq!(gu.matrices, 128);
    assert_eq!(gu.core_shape, Some((1536, 2048)));
    assert!(!gu.needs_gather);
    let (_, down) = mp(&p, "model.layers.0.mlp.experts.down_proj");
    assert_eq!(down.core_shape, Some((2048, 768)));
    assert!(!down.needs_gather);
    assert!(!batch_of(&p, gi).shard_path);

    assert_eq!(
        p.muon
            .params
            .iter()
            .filter(|x| x.route == OptimizerRoute::Muon)
            .count(),
        48 * 7
    );
    assert_eq!(p.muon.replica_count, None);
    assert_eq!(p.muon.devices_per_machine, 16);
}

#[test]
fn exp_b_muon_batches_by_hand() {
    // The earlier HyperParallel revision (`ns_batch_fill_owners = false`, which exp-b.toml
    // states as the revision that ran exp B): every memory batch closes at the cap on its
    // own, which gives the 28 fused Muon gathers per step that exp B measured (125 - 97 on
    // FSDP2).
    let path = paper("exp-b.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("ns_batch_fill_owners = false"));
    let p = plans_from(Scenario::from_str_at(&text, &path).unwrap());
    check_batch_invariants(&p);
    let b = &p.muon.batches;
    // The HSDP cap counts local-shard elements (production-mode parameters are plain local
    // shards): 2^29 local elements per batch. Experts (local Newton-Schulz, no gather): 96
    // fused tensors in four batches (22 + 22 + 39 + 13); then every shard-path matrix
    // (q/k/v/o projections and routers, 918,552,576 whole elements = 57,409,536 local) fits
    // in one batch.
    assert_eq!(b.len(), 5);
    let expert_params: Vec<usize> = b[..4].iter().map(|x| x.params.len()).collect();
    assert_eq!(expert_params, [22, 22, 39, 13]);
    for x in &b[..4] {
        assert!(!x.shard_path);
        assert!(x.shard_owner.is_empty() && x.gather_bytes.is_empty());
        assert!(x.replica_owner.is_empty());
    }
    let local = |x: &hpfsdp_plan::muon::MuonBatch| -> u64 {
        x.params
            .iter()
            .map(|&i| p.muon.params[i].local_numel())
            .sum()
    };
    for x in &b[..3] {
        assert!(local(x) >= 1 << 29, "a full batch reaches the local cap");
    }
    let big = &b[4];
    assert!(big.shard_path);
    assert_eq!(big.params.len(), 240);
    assert_eq!(big.numel, 918_552_576);
    assert_eq!(local(big), 918_552_576 / 16);
    // NS cap 2^29 / 16 = 33,554,432 whole elements: 96 projections of 8,388,608 four at a
    // time, k/v 32 at a time (32 x 1,048,576 = the cap), the 48 routers together: the 28
    // fused gathers per step the measured run shows.
    let mut expected = vec![4; 24];
    expected.extend([32, 32, 32, 48]);
    assert_eq!(
        big.memory_batches.iter().map(Vec::len).collect::<Vec<_>>(),
        expected
    );
    assert_eq!(big.gather_bytes.len(), 28);
    // Fused gather of a projection batch: 4 x (524288 x 2 B) x 16 shards.
    assert_eq!(
        big.gather_bytes[0],
        vec![("dp_shard".to_string(), 67_108_864)]
    );
    // Greedy owners over the whole batch: every coordinate owns 15 matrices.
    let mut per: BTreeMap<&Vec<usize>, usize> = BTreeMap::new();
    for c in big.shard_owner.values() {
        *per.entry(c).or_default() += 1;
    }
    assert_eq!(per.len(), 16);
    assert!(per.values().all(|&n| n == 15), "{per:?}");
    assert_eq!(big.relay_broadcasts.len(), 16);
    // The runtime relays per NS memory batch (HyperParallel `_process_shard_params`):
    // one broadcast per coordinate owning a matrix of that memory batch, the same bytes in
    // total as the assignment's per-coordinate sums.
    assert_eq!(big.memory_relays.len(), big.memory_batches.len());
    for (mb, relays) in big.memory_batches.iter().zip(&big.memory_relays) {
        let coords: BTreeSet<&Vec<usize>> = mb.iter().map(|i| &big.shard_owner[i]).collect();
        assert_eq!(relays.len(), coords.len());
    }
    let per_mem: u64 = big.memory_relays.iter().flatten().map(|r| r.1).sum();
    let whole: u64 = big.relay_broadcasts.iter().map(|r| r.1).sum();
    assert_eq!(per_mem, whole);
}

#[test]
fn exp_b_muon_batches_fill_every_owner() {
    // exp-b as the current HyperParallel revision would run it (`ns_batch_fill_owners` on,
    // the default; exp-b.toml pins the earlier revision that was measured): shard-path
    // memory batches take 16 matrices before the cap.
    let path = paper("exp-b.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "ns_batch_fill_owners = false",
        "ns_batch_fill_owners = true",
    );
    let p = plans_from(Scenario::from_str_at(&text, &path).unwrap());
    check_batch_invariants(&p);
    let b = &p.muon.batches;
    assert_eq!(b.len(), 5);
    let big = &b[4];
    assert!(big.shard_path);
    assert_eq!(big.params.len(), 240);
    // A shard-path memory batch first takes 16 matrices (min_batch_size = shard size): the
    // 96 projections in six batches of 16, k/v 32 at a time, the 48 routers together.
    assert_eq!(
        big.memory_batches.iter().map(Vec::len).collect::<Vec<_>>(),
        [16, 16, 16, 16, 16, 16, 32, 32, 32, 48]
    );
    // Every projection batch keeps all 16 owners busy.
    for mb in &big.memory_batches[..6] {
        let owners: BTreeSet<&Vec<usize>> = mb.iter().map(|i| &big.shard_owner[i]).collect();
        assert_eq!(owners.len(), 16);
    }
    // Fused gather per projection batch: 16 x (524288 x 2 B) x 16 shards.
    assert!(
        big.gather_bytes[..6]
            .iter()
            .all(|g| g == &vec![("dp_shard".to_string(), 268_435_456)])
    );
}

#[test]
fn hsdp_muon_replica_owners_without_split() {
    let p = plans(&paper("../fixtures/muon-hsdp-2x8.toml"));
    check_batch_invariants(&p);
    // A 2-way replica group fits in an 8-die machine: no subgroup split.
    assert_eq!(p.muon.replica_count, None);
    let (qi, q) = mp(&p, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.replicate_axes, [("dp_replicate".to_string(), 2)]);
    assert!(q.needs_gather);
    let b = batch_of(&p, qi);
    assert!(b.shard_path);
    assert!(b.replica_owner.values().all(|c| c.len() == 1 && c[0] < 2));
    assert_eq!(b.replica_broadcasts.len(), 1);
    assert_eq!(b.replica_broadcasts[0].0, "dp_replicate");
    assert!(p.muon.batches.iter().all(|b| !b.replica_owner.is_empty()));
}

#[test]
fn replica_subgroups_follow_devices_per_machine() {
    assert_eq!(replica_subgroup_size(24, 16), Some(12));
    assert_eq!(replica_subgroup_size(16, 16), None);
    assert_eq!(replica_subgroup_size(2, 8), None);
    assert_eq!(replica_subgroup_size(48, 16), Some(16));
    assert_eq!(replica_subgroup_size(17, 16), Some(1));

    // 24 replicas x 2 shards on three 16-die machines.
    let p = plans(&fixture("muon-replica-24.toml"));
    assert_eq!(p.scenario.world_size(), 48);
    assert_eq!(p.fsdp.groups["dense.replicate"].size, 24);
    assert_eq!(p.muon.devices_per_machine, 16);
    assert_eq!(p.muon.replica_count, Some(12));
    check_batch_invariants(&p);
    let coords: BTreeSet<usize> = p
        .muon
        .batches
        .iter()
        .flat_map(|b| b.replica_owner.values().map(|c| c[0]))
        .collect();
    assert!(coords.iter().all(|&c| c < 12), "{coords:?}");
    assert!(coords.len() > 1);
    // The HSDP soft cap scales with the subgroup size: 12 x 512 Mi elements -> one batch.
    assert_eq!(p.muon.batches.len(), 1);
}

#[test]
fn adamw_only_optimizer_routes_everything_to_adamw() {
    let path = fixture("ok-tiny.toml");
    let text = std::fs::read_to_string(&path).unwrap() + "\n[optimizer]\nkind = \"adamw\"\n";
    let scenario = Scenario::from_str_at(&text, &path).unwrap();
    let sharding = plan(&scenario.model, &scenario.planner_input());
    let fsdp = build_fsdp_plan(&scenario, &sharding);
    let muon = build_muon_plan(&scenario, &sharding, &fsdp);
    assert!(muon.params.iter().all(|x| x.route == OptimizerRoute::Adamw));
    assert!(muon.batches.is_empty());
}

/// Per-expert weights under EP: each EP rank reduces only the experts it owns, so the fused
/// cross-replica buffers are per owner (not one buffer summing every owner's experts).
#[test]
fn fused_all_reduce_buffers_are_per_expert_parallel_owner() {
    // exp-d: per-expert Qwen3-MoE weights, ep 16, edp_replicate 2.
    let p = plans(&paper("exp-d.toml"));
    let ep = 16;
    // The first MoE layer (exp-d's first layers are dense).
    let layer = p
        .fsdp
        .params
        .iter()
        .find(|f| f.domain == DataDomain::Expert)
        .unwrap()
        .unit;
    let expert: Vec<_> = p
        .fsdp
        .all_reduces
        .iter()
        .filter(|a| a.unit == layer && a.domain == DataDomain::Expert)
        .collect();
    assert_eq!(expert.len(), ep, "one expert buffer per EP owner");
    for (owner, ar) in expert.iter().enumerate() {
        assert_eq!(ar.ep_owner, Some(owner));
        assert!(!ar.params.is_empty());
        for name in &ar.params {
            assert_eq!(fp(&p, name).ep_owner, Some(owner), "{name}");
        }
        // Balanced experts: every owner's buffer is the same size.
        assert_eq!(ar.payload_bytes, expert[0].payload_bytes);
    }
    let per_owner_params: usize = expert.iter().map(|a| a.params.len()).sum();
    let owned = p
        .fsdp
        .params
        .iter()
        .filter(|f| f.unit == layer && f.domain == DataDomain::Expert && f.ep_owner.is_some())
        .count();
    assert_eq!(per_owner_params, owned);
}
