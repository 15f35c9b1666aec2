//! Programs built on a shared model path (`ProgramGenerator::program_shared`) equal the
//! programs generated whole (`program_unnamed`) on every rank, for every FSDP strategy and
//! optimizer strategy of the verify miniatures (with Muon) and `mini-exp-d`; on the Muon
//! hyperparallel programs the model path really is shared (one prefix per model key, the
//! same `Arc` on every rank of the key); the result does not depend on which rank builds a
//! path first.

use hpfsdp_program::step::{Category, StepProgram};
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};
use std::collections::HashMap;
use std::sync::Arc;

mod common;
use common::{mini_exp_d, muon_miniatures};

#[test]
fn shared_programs_equal_whole_programs() {
    let mut split = 0;
    for x in &muon_miniatures() {
        let name = &x.s.file.name;
        for kind in StrategyKind::ALL {
            for o in OptimizerStrategy::ALL {
                let Ok(g) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
                    continue;
                };
                let mut prefixes = HashMap::new();
                for rank in 0..g.world_size() {
                    let shared = g.program_shared(rank).unwrap();
                    let whole = g.program_unnamed(rank).unwrap();
                    assert_eq!(shared, whole, "{name} {kind} {o} rank {rank}");
                    assert_eq!(shared.ops.to_vec(), whole.ops.to_vec());
                    let Some(key) = g.model_key(rank) else {
                        assert!(shared.ops.shared().is_none(), "{name} {kind} {o}");
                        continue;
                    };
                    // The prefix is the model path: no optimizer-schedule op in it, and the
                    // same allocation on every rank of the key.
                    let prefix = shared.ops.shared().expect("a model key shares its path");
                    assert!(!prefix.ops.is_empty());
                    assert!(
                        prefix.check.is_some(),
                        "{name} {kind} {o}: prefix validated"
                    );
                    let first = prefixes.entry(key).or_insert_with(|| prefix.clone());
                    assert!(Arc::ptr_eq(first, prefix), "{name} {kind} {o} rank {rank}");
                    split += 1;
                }
            }
        }
    }
    assert!(split > 0, "some programs were built on a shared model path");
}

/// Which rank builds a model path first does not change any program.
#[test]
fn shared_programs_do_not_depend_on_generation_order() {
    let x = mini_exp_d();
    let kind = StrategyKind::HyperParallel;
    let o = OptimizerStrategy::HyperParallelMuon;
    let forward = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o).unwrap();
    let backward = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o).unwrap();
    let w = forward.world_size();
    let a: Vec<StepProgram> = (0..w).map(|r| forward.program_shared(r).unwrap()).collect();
    let mut b: Vec<StepProgram> = (0..w)
        .rev()
        .map(|r| backward.program_shared(r).unwrap())
        .collect();
    b.reverse();
    assert_eq!(a, b);
    // The optimizer tail is each rank's own: it starts with the first optimizer op.
    let p = &a[w - 1];
    let prefix_len = p.ops.prefix_len();
    assert!(prefix_len > 0 && prefix_len < p.ops.len());
    assert!(
        p.ops
            .iter()
            .take(prefix_len)
            .all(|op| op.category != Category::Optimizer)
    );
}
