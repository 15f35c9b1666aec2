//! The flat-buffer work around MatrixFSDP's owner collectives and HyperParallel's
//! mixed-precision casts, counted in the step programs of the muon-vs-matrixfsdp comparison
//! (FP32 master weights, bf16 parameters, f32 reduction). Each test would have caught one
//! omission of the programs before they modelled it:
//!
//! - MatrixFSDP publishes a unit with one broadcast per owner, after casting and copying the
//!   rank's local shard into the full buffer (`flat_buffer.py` `start_all_gather_full_params`,
//!   `collectives.py` `broadcast_rank_segments_1d_into_async`);
//! - it casts every gradient of the unit to f32, then zeroes and packs the compact owner
//!   workspace, before the per-owner reduces read it (`collect_grad_bucket`,
//!   `_fill_compact_owner_reduce_scatter_input`);
//! - every unit with owner-placed matrices keeps its f32 compact workspace resident across
//!   steps (`ElasticParamBuffer.acquire_persistent_rank_chunk_workspace`);
//! - the owner divides its chunk and copies it out once the reduces are waited
//!   (`reduce_owner_rank_chunks_1d_async`), nothing on a rank that owns nothing of the unit;
//! - HyperParallel casts each all-gathered shard from the FP32 master and each gradient to the
//!   reduce dtype (notes `hyper-parallel.md` 5.2, 5.6), and casts nothing in bf16-only exp B.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{MemTag, Payload, StepProgram};
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};
use std::collections::HashMap;

#[allow(dead_code)] // shared helpers this file does not use
mod common;
use common::{Plans, plans_of, root};

fn load(rel: &str) -> Plans {
    plans_of(Scenario::load(&root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

fn program(x: &Plans, o: OptimizerStrategy, rank: usize) -> StepProgram {
    ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, StrategyKind::HyperParallel, o)
        .unwrap_or_else(|e| panic!("{o}: {e}"))
        .program(rank)
        .unwrap()
}

/// (launches, HBM bytes) of a compute op's kernel mix.
fn mix_totals(p: &StepProgram, i: usize) -> (u32, u64) {
    match p.ops[i].payload {
        Payload::Compute(w) => {
            let mix = w.mix.expect("copy-in ops carry a kernel mix");
            let k = &p.kernel_mixes[&mix];
            (
                k.iter().map(|w| w.count).sum(),
                k.iter().map(|w| w.hbm_bytes).sum(),
            )
        }
        _ => panic!("op {i} is not a compute op"),
    }
}

/// Index of the op named exactly `name`, if any.
fn find(p: &StepProgram, name: &str) -> Option<usize> {
    p.ops.iter().position(|o| o.name.as_deref() == Some(name))
}

/// Per layer of one forward: (owner -> published bytes of its broadcast, bytes in and out of
/// the layer's unplaced all-gathers).
struct LayerComm {
    owners: HashMap<usize, u64>,
    ag_in: u64,
    ag_out: u64,
}

fn layer_comm(p: &StepProgram, layer: usize) -> LayerComm {
    let prefix = format!("layers.{layer}.");
    let mut lc = LayerComm {
        owners: HashMap::new(),
        ag_in: 0,
        ag_out: 0,
    };
    for o in &p.ops {
        let (Some(n), Some(c)) = (o.name.as_deref(), o.payload.as_collective()) else {
            continue;
        };
        let Some(rest) = n.strip_prefix(&prefix).filter(|r| !r.ends_with(".bwd")) else {
            continue;
        };
        if let Some(owner) = rest.strip_prefix("pub.o") {
            let owner: usize = owner.parse().expect(n);
            assert!(
                lc.owners.insert(owner, c.output_bytes).is_none(),
                "{n} twice"
            );
        } else if rest.ends_with(".ag") {
            lc.ag_in += c.input_bytes;
            lc.ag_out += c.output_bytes;
        }
    }
    lc
}

/// One broadcast per owner of a layer, carrying all of that owner's bf16 matrices, after a
/// copy-in op (cast of the rank's FP32 local shard, copy into the full buffer) that the
/// broadcasts wait for.
#[test]
fn matrixfsdp_publishes_once_per_owner_after_its_copy_in() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let layers = x.s.model.config.num_hidden_layers;
    for rank in [0usize, 5, 15] {
        let p = program(&x, OptimizerStrategy::MatrixFsdp, rank);
        let mut owned_anywhere = false;
        for l in 0..layers {
            let lc = layer_comm(&p, l);
            assert!(
                (1..=7).contains(&lc.owners.len()),
                "layer {l}: {} owners",
                lc.owners.len()
            );
            let owned_elems = lc.owners.get(&rank).map_or(0, |b| b / 2);
            owned_anywhere |= owned_elems > 0;
            let local = owned_elems + lc.ag_in / 2;
            let ci = find(&p, &format!("layers.{l}.pub.copy_in"))
                .unwrap_or_else(|| panic!("rank {rank} layer {l}: no publication copy-in"));
            // Cast f32 -> bf16 (4 + 2 bytes) and copy into the full buffer (2 + 2 bytes).
            assert_eq!(mix_totals(&p, ci), (2, 10 * local), "rank {rank} layer {l}");
            for owner in lc.owners.keys() {
                let b = find(&p, &format!("layers.{l}.pub.o{owner}")).unwrap();
                assert!(
                    p.ops[b].deps.iter().any(|d| d.index() == ci),
                    "rank {rank} layer {l}: broadcast o{owner} does not wait for the copy-in"
                );
            }
        }
        assert!(owned_anywhere, "rank {rank} owns no matrix");
    }
}

/// Per layer in backward: the casts of all the unit's gradients (bf16 -> f32, one per
/// parameter), then after the previous unit's settle the workspace `zero_` and one copy per
/// gradient, which every owner reduce of the unit waits for; the owner's settle divides and
/// copies exactly its chunk, and a rank owning nothing of the layer settles nothing.
#[test]
fn matrixfsdp_packs_its_gradient_bucket_and_settles_owned_chunks() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let layers = x.s.model.config.num_hidden_layers;
    let mut settled = 0;
    for rank in [0usize, 7] {
        let p = program(&x, OptimizerStrategy::MatrixFsdp, rank);
        let mut workspaces = 0u64;
        for l in 0..layers {
            let lc = layer_comm(&p, l);
            // Whole-gradient elements of the layer and its sharded parameters (7 matrices and
            // the four norm weights of a Qwen3 block).
            let full: u64 = lc.owners.values().sum::<u64>() / 2 + lc.ag_out / 2;
            let cast = find(&p, &format!("layers.{l}.grad.cast")).expect("gradient casts");
            let pack = find(&p, &format!("layers.{l}.grad.pack")).expect("bucket packing");
            assert_eq!(mix_totals(&p, cast), (11, 6 * full), "layer {l}");
            assert_eq!(mix_totals(&p, pack), (1 + 11, 12 * full), "layer {l}");
            workspaces += 4 * full;
            assert!(cast < pack);
            // The previous unit (layer l + 1) is settled between the casts and the packing.
            if let Some(prev) = find(&p, &format!("layers.{}.reduce.settle", l + 1)) {
                assert!(cast < prev && prev < pack, "layer {l}: settle out of order");
            }
            let mut reduces = 0;
            for owner in lc.owners.keys() {
                let r = find(&p, &format!("layers.{l}.reduce.o{owner}")).unwrap();
                assert!(p.ops[r].deps.iter().any(|d| d.index() == pack), "layer {l}");
                reduces += 1;
            }
            assert_eq!(reduces, lc.owners.len());
            let owned = lc.owners.get(&rank).map_or(0, |b| b / 2);
            match find(&p, &format!("layers.{l}.reduce.settle")) {
                Some(s) => {
                    assert!(owned > 0, "rank {rank} layer {l}: settles nothing it owns");
                    // Division (4 + 4 bytes) and copy-out (4 + 4 bytes) of the owned chunk.
                    assert_eq!(mix_totals(&p, s), (2, 16 * owned));
                    settled += 1;
                }
                None => assert_eq!(owned, 0, "rank {rank} layer {l}: owned chunk unsettled"),
            }
        }
        // Each layer's persistent compact f32 workspace (the whole layer's numel) stays
        // resident across steps.
        let resident: u64 = p
            .resident
            .iter()
            .filter(|r| r.tag == MemTag::Buffers)
            .map(|r| r.bytes)
            .sum();
        assert_eq!(resident, workspaces, "rank {rank}: persistent workspaces");
    }
    assert!(settled > 0);
}

/// HyperParallel with FP32 master weights: one cast per all-gathered shard (f32 -> bf16)
/// before each layer's gathers, one per gradient (bf16 -> f32) before its reduce-scatters;
/// with one dtype throughout (exp B) no cast at all.
#[test]
fn hyperparallel_casts_only_under_mixed_precision() {
    let x = load("paper/muon-vs-matrixfsdp.toml");
    let p = program(&x, OptimizerStrategy::HyperParallelMuon, 3);
    let layers = x.s.model.config.num_hidden_layers;
    for l in 0..layers {
        let (mut shard, mut full, mut n) = (0u64, 0u64, 0u32);
        for o in &p.ops {
            let (Some(name), Some(c)) = (o.name.as_deref(), o.payload.as_collective()) else {
                continue;
            };
            if name.starts_with(&format!("layers.{l}.")) && name.ends_with(".ag") {
                shard += c.input_bytes / 2;
                full += c.output_bytes / 2;
                n += 1;
            }
        }
        assert_eq!(n, 11, "layer {l}: 11 sharded parameters");
        let ag = find(&p, &format!("layers.{l}.ag.cast")).expect("parameter casts");
        assert_eq!(mix_totals(&p, ag), (n, 6 * shard));
        let rs = find(&p, &format!("layers.{l}.rs.cast")).expect("gradient casts");
        assert_eq!(mix_totals(&p, rs), (n, 6 * full));
    }
    let b = load("paper/exp-b.toml");
    let p = program(&b, OptimizerStrategy::HyperParallelMuon, 0);
    assert!(
        !p.ops
            .iter()
            .any(|o| o.name.as_deref().is_some_and(|n| n.ends_with(".cast"))),
        "exp B casts although it is bf16 throughout"
    );
}
