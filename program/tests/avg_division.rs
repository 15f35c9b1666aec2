//! torch_npu's `ReduceOp.AVG` in the step programs (`hpfsdp_program::strategy::avg_division`):
//! one in-place division of each averaged collective's output, on that collective's HCCL
//! stream, which everything that waits for the collective waits for; none where the op sums
//! or the group has one rank.

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, OpId, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::avg_division::is_collective_stream_division;
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind};
use std::path::PathBuf;

fn program(rel: &str, kind: StrategyKind) -> StepProgram {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(rel);
    let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(&s, &p);
    let g = ProgramGenerator::new(&s, &p, &f, kind).unwrap_or_else(|e| panic!("{rel}: {e}"));
    g.program(0).unwrap()
}

fn name(p: &StepProgram, id: OpId) -> &str {
    p.ops[id.index()].name.as_deref().unwrap_or("")
}

/// The divisions of `p`: (op id, the collective it follows, HBM bytes).
fn divisions(p: &StepProgram) -> Vec<(OpId, OpId, u64)> {
    p.ops
        .iter()
        .filter(|o| is_collective_stream_division(o))
        .map(|o| {
            let Payload::Compute(w) = &o.payload else {
                unreachable!()
            };
            (o.id, o.deps[0], w.hbm_bytes)
        })
        .collect()
}

fn collectives(p: &StepProgram, cat: Category, kind: CollectiveKind) -> Vec<OpId> {
    p.ops
        .iter()
        .filter(|o| o.category == cat)
        .filter(|o| o.payload.as_collective().is_some_and(|c| c.kind == kind))
        .map(|o| o.id)
        .collect()
}

/// Experiment B, HyperParallel: the measured "per-parameter post-reduction division" is one
/// kernel per reduce-scatter (531), each over the reduce-scatter's output shard (3.817 GB of
/// shards in all, read and written once), on the shard group's HCCL stream right behind its
/// reduce-scatter and ahead of the next collective issued there. The compute stream runs no
/// division: the modelled ~8 ms of compute-stream settle kernels this replaced would fail
/// the first and the stream assertions.
#[test]
fn exp_b_hyperparallel_divides_each_shard_on_the_hccl_stream() {
    let p = program("paper/exp-b.toml", StrategyKind::HyperParallel);
    let rs = collectives(&p, Category::FsdpRs, CollectiveKind::ReduceScatter);
    let divs = divisions(&p);
    assert_eq!(rs.len(), 531);
    assert_eq!(divs.len(), rs.len(), "one division per reduce-scatter");
    let mut shard_bytes = 0;
    for &(div, coll, bytes) in &divs {
        let (d, c) = (&p.ops[div.index()], &p.ops[coll.index()]);
        let cop = c.payload.as_collective().unwrap();
        assert_eq!(cop.kind, CollectiveKind::ReduceScatter, "{}", name(&p, div));
        assert_eq!(bytes, 2 * cop.output_bytes, "{}: the shard", name(&p, div));
        assert_eq!(d.stream, c.stream, "{}", name(&p, div));
        assert_eq!(
            d.stream,
            Stream::AllGather,
            "the dense shard group's stream"
        );
        // Next op on that stream: a collective issued after the division queues behind it.
        let next = p
            .ops
            .iter()
            .skip(div.index() + 1)
            .find(|o| o.stream == d.stream);
        if let Some(n) = next {
            assert!(n.payload.as_collective().is_some(), "{}", name(&p, n.id));
        }
        shard_bytes += cop.output_bytes;
    }
    assert!(
        (shard_bytes as f64 / 1e9 - 3.817).abs() < 0.005,
        "{shard_bytes}"
    );
    let compute_divisions = p
        .ops
        .iter()
        .filter(|o| o.stream == Stream::Compute && o.category == Category::FsdpRs)
        .count();
    assert_eq!(
        compute_divisions, 0,
        "one micro-batch: nothing settles on compute"
    );
}

/// Experiment B, FSDP2 (bf16 reduce dtype: `ReduceOp.AVG`): one division per unit
/// reduce-scatter (49), and what the compute stream waits for before the next unit's
/// copy-in is that division, not the bare reduce-scatter.
#[test]
fn exp_b_fsdp2_divides_each_unit_output() {
    let p = program("paper/exp-b.toml", StrategyKind::Fsdp2);
    let rs = collectives(&p, Category::FsdpRs, CollectiveKind::ReduceScatter);
    let divs = divisions(&p);
    assert_eq!(rs.len(), 49);
    assert_eq!(
        divs.iter().map(|d| d.1).collect::<Vec<_>>(),
        rs,
        "one division right after each reduce-scatter"
    );
    let waited = p
        .ops
        .iter()
        .filter(|o| matches!(o.payload, Payload::Copy(_)))
        .filter(|o| o.deps.iter().any(|d| divs.iter().any(|x| x.0 == *d)))
        .count();
    assert_eq!(
        waited, 48,
        "each later unit's copy-in waits for the previous division"
    );
}

/// HSDP (2 replicas x 4 shards): each replica all-reduce reads reduce-scatter outputs the
/// host waited for, so it depends on their divisions; HyperParallel's replica all-reduce
/// sums (its own division follows on the compute stream), so no division follows it on the
/// all-reduce stream.
#[test]
fn hsdp_all_reduces_wait_for_the_divisions() {
    let p = program("verify/dense-hsdp2x4.toml", StrategyKind::HyperParallel);
    let divs = divisions(&p);
    assert!(!divs.is_empty());
    assert!(
        divs.iter()
            .all(|d| p.ops[d.0.index()].category == Category::FsdpRs)
    );
    let ars = collectives(&p, Category::FsdpAr, CollectiveKind::AllReduce);
    assert!(!ars.is_empty());
    for ar in ars {
        let deps = &p.ops[ar.index()].deps;
        assert!(
            deps.iter().any(|d| divs.iter().any(|x| x.0 == *d)),
            "{} waits for a division",
            name(&p, ar)
        );
    }
}

/// No division where nothing averages: the expert shard group of mini-exp-d has one rank
/// (`edp_shard = 1`, no reduce-scatter at all), so every division is a dense one, one per
/// dense reduce-scatter.
#[test]
fn no_division_on_a_single_rank_shard_group() {
    let p = program("fixtures/mini-exp-d.toml", StrategyKind::HyperParallel);
    let rs = collectives(&p, Category::FsdpRs, CollectiveKind::ReduceScatter);
    let divs = divisions(&p);
    assert!(!rs.is_empty());
    assert_eq!(divs.len(), rs.len());
    assert!(
        divs.iter()
            .all(|d| p.ops[d.0.index()].stream == Stream::AllGather)
    );
}

/// Experiment A (four micro-batches per rank): every micro-batch's reduce-scatters divide;
/// the compute stream adds each reduced gradient into the held one from the second
/// micro-batch on (`apply_reduced_grad`), one kernel per parameter, never on the first.
#[test]
fn exp_a_divides_every_micro_batch_and_accumulates_after_the_first() {
    let p = program("paper/exp-a-mbs2.toml", StrategyKind::HyperParallel);
    let per_mb = |prefix: &str, pick: &dyn Fn(&hpfsdp_program::step::Op) -> bool| {
        p.ops
            .iter()
            .filter(|o| o.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
            .filter(|o| pick(o))
            .count()
    };
    let is_div = |o: &hpfsdp_program::step::Op| is_collective_stream_division(o);
    let is_add = |o: &hpfsdp_program::step::Op| {
        o.category == Category::FsdpRs && o.stream == Stream::Compute
    };
    let is_rs = |o: &hpfsdp_program::step::Op| {
        o.category == Category::FsdpRs
            && o.payload
                .as_collective()
                .is_some_and(|c| c.kind == CollectiveKind::ReduceScatter)
    };
    let rs0 = per_mb("mb0.", &is_rs);
    assert!(rs0 > 48 * 10, "{rs0}");
    for mb in 0..4 {
        let prefix = format!("mb{mb}.");
        assert_eq!(per_mb(&prefix, &is_rs), rs0, "micro-batch {mb}");
        assert_eq!(per_mb(&prefix, &is_div), rs0, "micro-batch {mb}");
        let adds = if mb == 0 { 0 } else { rs0 };
        assert_eq!(per_mb(&prefix, &is_add), adds, "micro-batch {mb}");
    }
}
