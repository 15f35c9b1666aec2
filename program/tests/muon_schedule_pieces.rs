//! HyperParallel Muon schedules share rank-independent pieces between ranks (held
//! parameters, replica-owned sets, replica-broadcast bytes per owner: `hyperparallel::Pieces`
//! in `OptCtx`). A rank's program must not depend on which ranks filled those pieces first:
//! every rank's program from a generator that already built every other rank (in reverse
//! order, through template keys and programs) equals the one from a fresh generator that
//! builds that rank alone, on `mini-exp-d` (EP, TP, replica subgroups, shard and local paths)
//! and on the Muon miniatures.

use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};

mod common;
use common::{Plans, mini_exp_d, muon_miniatures, plans_of};
use hpfsdp_plan::scenario::Scenario;

/// `muon-replica-24` on 2 replicas x 3 shards: replicated parameters whose FSDP shards are
/// uneven, so replica-broadcast bytes differ by shard position.
fn uneven_hsdp() -> Plans {
    let at = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plan/tests/fixtures/muon-replica-24.toml");
    let text = std::fs::read_to_string(&at).unwrap();
    let text = text
        .replace("dp_replicate = 24", "dp_replicate = 2")
        .replace("dp_shard = 2", "dp_shard = 3")
        .replace("global_batch = 48", "global_batch = 6")
        .replace("dies_per_machine = 16", "dies_per_machine = 6")
        .replace("machines_per_supernode = 3", "machines_per_supernode = 1");
    plans_of(Scenario::from_str_at(&text, &at).unwrap())
}

fn check(x: &Plans) -> usize {
    let kind = StrategyKind::HyperParallel;
    let o = OptimizerStrategy::HyperParallelMuon;
    let Ok(warm) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
        return 0;
    };
    let w = warm.world_size();
    let keys: Vec<u64> = (0..w).rev().map(|r| warm.template_key(r)).collect();
    for r in (0..w).rev() {
        warm.program_unnamed(r).unwrap();
    }
    for (rank, key) in (0..w).rev().zip(keys) {
        let cold = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o).unwrap();
        let name = &x.s.file.name;
        assert_eq!(
            cold.template_key(rank),
            key,
            "{name} rank {rank}: template key"
        );
        assert_eq!(
            cold.program_unnamed(rank).unwrap(),
            warm.program_unnamed(rank).unwrap(),
            "{name} rank {rank}"
        );
    }
    w
}

#[test]
fn hyperparallel_schedules_do_not_depend_on_which_rank_builds_first() {
    let mut ranks = check(&mini_exp_d());
    assert!(ranks > 1, "mini-exp-d has several ranks");
    assert_eq!(check(&uneven_hsdp()), 6);
    for x in &muon_miniatures() {
        ranks += check(x);
    }
    assert!(ranks > 8);
}

/// `p` with every op name dropped.
fn unnamed(mut p: hpfsdp_program::step::StepProgram) -> hpfsdp_program::step::StepProgram {
    for op in &mut p.ops {
        op.name = None;
    }
    p
}

/// Equal slot inputs mean equal schedule parts (`hyperparallel::SlotInputs`, the cache key of
/// `hp_parts`): once every rank's template key has filled the part cache (whichever rank of
/// a key comes first builds its part), each rank's unnamed program, assembled from parts
/// other ranks built, equals its named program (built from its own view, nothing cached)
/// with the names dropped. Returns the ranks that reused another rank's schedule.
fn check_parts(x: &Plans) -> usize {
    let kind = StrategyKind::HyperParallel;
    let o = OptimizerStrategy::HyperParallelMuon;
    let Ok(g) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
        return 0;
    };
    let w = g.world_size();
    let keys: Vec<u64> = (0..w).map(|r| g.template_key(r)).collect();
    for rank in (0..w).rev() {
        let name = &x.s.file.name;
        let own = unnamed(g.program(rank).unwrap());
        assert_eq!(g.program_unnamed(rank).unwrap(), own, "{name} rank {rank}");
        assert_eq!(g.program_shared(rank).unwrap(), own, "{name} rank {rank}");
    }
    let distinct: std::collections::HashSet<&u64> = keys.iter().collect();
    w - distinct.len()
}

#[test]
fn cached_schedule_parts_equal_each_rank_s_own_build() {
    let mut shared = check_parts(&mini_exp_d()) + check_parts(&uneven_hsdp());
    for x in &muon_miniatures() {
        shared += check_parts(x);
    }
    // Some ranks did take parts another rank built (equal keys).
    assert!(shared > 0);
}

/// Template keys are exact on a shared model path: two ranks whose programs are equal up to
/// group ranks and names have equal keys, so folding generates no program twice. (The class
/// signature in a key was once the digest of the class's first program outside its
/// optimizer schedule, which took in that rank's own landing copies: on exp-d 278 templates
/// were generated for 203 distinct programs.) Returns the templates.
fn check_exact_keys(x: &Plans) -> usize {
    let kind = StrategyKind::HyperParallel;
    let o = OptimizerStrategy::HyperParallelMuon;
    let Ok(g) = ProgramGenerator::with_optimizer(&x.s, &x.p, &x.f, kind, o) else {
        return 0;
    };
    let mut firsts: std::collections::BTreeMap<u64, usize> = Default::default();
    for r in 0..g.world_size() {
        firsts.entry(g.template_key(r)).or_insert(r);
    }
    let shape = |p: &hpfsdp_program::step::StepProgram| {
        let groups: Vec<(String, usize)> = p
            .groups
            .iter()
            .map(|g| (g.label.clone(), g.ranks.len()))
            .collect();
        (
            p.ops.clone(),
            p.resident.clone(),
            p.kernel_mixes.clone(),
            groups,
        )
    };
    let programs: Vec<(usize, _)> = firsts
        .values()
        .map(|&r| (r, shape(&g.program_shared(r).unwrap())))
        .collect();
    for (i, (a, pa)) in programs.iter().enumerate() {
        for (b, pb) in &programs[i + 1..] {
            let name = &x.s.file.name;
            assert!(
                pa != pb,
                "{name}: ranks {a} and {b} have equal programs, other keys"
            );
        }
    }
    programs.len()
}

#[test]
fn equal_programs_have_equal_template_keys() {
    let mut templates = check_exact_keys(&mini_exp_d()) + check_exact_keys(&uneven_hsdp());
    for x in &muon_miniatures() {
        templates += check_exact_keys(x);
    }
    assert!(templates > 8);
}
