//! HyperParallel's TP-replicate gradient all-reduces (`launch_tp_replicate_reduce_and_apply`
//! in the root backward hook, `all_reduce_source_replicate_grad_inplace` per parameter): one
//! all-reduce over `tp` per TP-partial parameter per micro-batch, of its reduced shard.

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, StepProgram};
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind};
use std::path::PathBuf;

fn path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(rel)
}

fn program_of(s: &Scenario) -> (StepProgram, hpfsdp_plan::fsdp::FsdpPlan) {
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(s, &p);
    let g = ProgramGenerator::new(s, &p, &f, StrategyKind::HyperParallel).unwrap();
    (g.program(0).unwrap(), f)
}

/// `(name, receive bytes)` of every gradient-sync all-reduce over `tp` of the program (not the
/// activation all-reduces of row-parallel outputs without sequence parallelism).
fn tp_all_reduces(p: &StepProgram) -> Vec<(String, u64)> {
    p.ops
        .iter()
        .filter(|o| o.category == Category::Tp)
        .filter_map(|o| {
            let c = o.payload.as_collective()?;
            let name = o.name.clone().unwrap_or_default();
            (c.kind == CollectiveKind::AllReduce && name.ends_with(".grad_sync.tp"))
                .then_some((name, c.output_bytes))
        })
        .collect()
}

#[test]
fn exp_a_all_reduces_each_tp_partial_gradient_once_per_micro_batch() {
    let s = Scenario::load(&path("paper/exp-a-mbs2.toml")).unwrap();
    let (prog, fsdp) = program_of(&s);
    let ars = tp_all_reduces(&prog);
    // 48 layers x (both norms, q_norm, k_norm, router gate) + the final norm, on each of the
    // 4 micro-batches (global batch 32 / (micro batch 2 x DP 4)).
    assert_eq!(
        ars.len(),
        (48 * 5 + 1) * 4,
        "{:?}",
        &ars[..ars.len().min(8)]
    );
    for m in 0..4 {
        let prefix = format!("mb{m}.");
        let of_mb: Vec<_> = ars.iter().filter(|(n, _)| n.starts_with(&prefix)).collect();
        assert_eq!(of_mb.len(), 48 * 5 + 1, "micro-batch {m}");
    }
    // Each carries one parameter's reduced shard in the reduce dtype (bf16), not a fused
    // per-unit buffer.
    for name in [
        "layers.7.self_attn.q_norm.weight",
        "layers.7.mlp.gate.weight",
        "norm.weight",
    ] {
        let p = fsdp
            .params
            .iter()
            .find(|p| p.name == format!("model.{name}"))
            .unwrap();
        let label = format!("mb3.{name}.grad_sync.tp");
        let (_, bytes) = ars
            .iter()
            .find(|(n, _)| *n == label)
            .unwrap_or_else(|| panic!("{label} missing"));
        assert_eq!(*bytes, p.reduce_scatter.bytes_out_per_rank, "{name}");
        assert_eq!(*bytes, p.padded_shard_numel * 2, "{name}");
    }
}

#[test]
fn no_tp_all_reduce_without_sequence_parallelism() {
    let file = path("paper/exp-a-mbs2.toml");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("sequence_parallel = true", "sequence_parallel = false");
    let s = Scenario::from_str_at(&text, &file).unwrap();
    let (prog, _) = program_of(&s);
    assert!(tp_all_reduces(&prog).is_empty());
}

#[test]
fn exp_a_tp_all_reduces_average_so_torch_npu_divides_each() {
    // HyperParallel passes the state's `reduce_op_type` (AVG, as for its reduce-scatters);
    // HCCL has no AVG, torch_npu's `allreduce` sums and divides the output on its stream.
    let s = Scenario::load(&path("paper/exp-a-mbs2.toml")).unwrap();
    let (prog, _) = program_of(&s);
    let divs: Vec<_> = prog
        .ops
        .iter()
        .filter(|o| {
            o.name
                .as_deref()
                .is_some_and(|n| n.ends_with(".grad_sync.tp.div"))
        })
        .collect();
    assert_eq!(divs.len(), (48 * 5 + 1) * 4);
    for d in divs {
        assert_eq!(d.category, Category::Tp);
        assert_eq!(d.stream, hpfsdp_program::step::Stream::AllReduce);
        assert!(matches!(
            d.payload,
            hpfsdp_program::step::Payload::Compute(ref w) if w.kernels == 1
        ));
    }
}
