//! `[train] tp_comm_overlap`: scenario keys and their errors, and the programs of the paper's
//! TP4 EP4 scenario (exp-a-mbs2) with `none` (the default, unchanged programs) and `fused`
//! (TP all-gathers and reduce-scatters cut into pipelined chunks next to their GEMMs).
//!
//! The program checks hold whatever kernels the compute segments list: they look at names,
//! dependencies and totals only (the chunk shapes are unit-tested in
//! `program/src/strategy/tp_overlap.rs`).

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::PlanError;
use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, OpId, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::tp_overlap::TpCommOverlap;
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind, StrategyOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn exp_a() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper/exp-a-mbs2.toml")
}

/// exp-a-mbs2 with its `tp_comm_overlap*` lines replaced by `keys` (written under `[train]`).
fn exp_a_text(keys: &str) -> String {
    let text = std::fs::read_to_string(exp_a()).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("tp_comm_overlap"))
        .collect();
    kept.join("\n")
        .replacen("[train]\n", &format!("[train]\n{keys}"), 1)
}

fn exp_a_with(keys: &str) -> Result<Scenario, PlanError> {
    Scenario::from_str_at(&exp_a_text(keys), &exp_a())
}

/// The scenario error of `keys`: (line, message); the line must hold `key`.
fn error_of(keys: &str, key: &str) -> (usize, String) {
    let text = exp_a_text(keys);
    match Scenario::from_str_at(&text, &exp_a()) {
        Err(PlanError::Scenario {
            file,
            line,
            message,
        }) => {
            assert_eq!(file, exp_a().display().to_string());
            let written = text.lines().nth(line - 1).unwrap_or("");
            assert!(
                written.trim_start().starts_with(key),
                "line {line}: {written}"
            );
            (line, message)
        }
        other => panic!("{keys}: expected a scenario error, got {other:?}"),
    }
}

#[test]
fn bad_values_name_the_key_line_and_the_fix() {
    let (_, m) = error_of("tp_comm_overlap = \"mc2\"\n", "tp_comm_overlap");
    assert!(m.contains("\"mc2\"") && m.contains("none, fused"), "{m}");
    let (_, m) = error_of(
        "tp_comm_overlap = \"fused\"\ntp_comm_overlap_chunks = 0\n",
        "tp_comm_overlap_chunks",
    );
    assert!(m.contains("at least 1"), "{m}");
    let (_, m) = error_of("tp_comm_overlap_chunks = 2\n", "tp_comm_overlap_chunks");
    assert!(m.contains("needs tp_comm_overlap = \"fused\""), "{m}");
    // A wrong type is a parse error naming the key too.
    let (_, m) = error_of("tp_comm_overlap = true\n", "tp_comm_overlap");
    assert!(m.contains("tp_comm_overlap"), "{m}");
}

#[test]
fn none_is_the_default_and_fused_defaults_to_the_tp_degree() {
    let opts = |keys: &str| {
        let s = exp_a_with(keys).unwrap();
        StrategyOptions::resolve(&s, StrategyKind::HyperParallel)
            .unwrap()
            .tp_comm_overlap
    };
    assert_eq!(opts(""), TpCommOverlap::None);
    assert_eq!(opts("tp_comm_overlap = \"none\"\n"), TpCommOverlap::None);
    assert_eq!(
        opts("tp_comm_overlap = \"fused\"\n"),
        TpCommOverlap::Fused { chunks: 4 }
    );
    assert_eq!(
        opts("tp_comm_overlap = \"fused\"\ntp_comm_overlap_chunks = 2\n"),
        TpCommOverlap::Fused { chunks: 2 }
    );
    // The paper scenario itself keeps the measured runs' serialized TP collectives.
    let s = Scenario::load(&exp_a()).unwrap();
    assert_eq!(s.file.train.tp_comm_overlap, "none");
}

fn program(keys: &str) -> StepProgram {
    let s = exp_a_with(keys).unwrap();
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(&s, &p);
    ProgramGenerator::new(&s, &p, &f, StrategyKind::HyperParallel)
        .unwrap()
        .program(0)
        .unwrap()
}

fn name(p: &StepProgram, id: OpId) -> &str {
    p.ops[id.0 as usize].name.as_deref().unwrap_or("")
}

/// `(base name, chunk index)` of a chunk op `<base>.c<i>`.
fn chunk(name: &str) -> Option<(&str, usize)> {
    let (base, i) = name.rsplit_once(".c")?;
    Some((base, i.parse().ok()?))
}

/// TP collectives by base name: (ops, input bytes, output bytes, kind).
fn tp_collectives(p: &StepProgram) -> HashMap<String, (usize, u64, u64, CollectiveKind)> {
    let mut out: HashMap<String, (usize, u64, u64, CollectiveKind)> = HashMap::new();
    // Collectives only (the TP gradient all-reduces' AVG divisions are TP kernels).
    let colls = p.ops.iter().filter(|o| o.payload.as_collective().is_some());
    for o in colls.filter(|o| o.category == Category::Tp) {
        let n = name(p, o.id);
        let base = chunk(n).map_or(n, |(b, _)| b);
        let c = o.payload.as_collective().unwrap();
        let e = out.entry(base.to_string()).or_insert((0, 0, 0, c.kind));
        assert_eq!(e.3, c.kind, "{n}: chunks keep the kind");
        e.0 += 1;
        e.1 += c.input_bytes;
        e.2 += c.output_bytes;
    }
    out
}

fn compute_flops(p: &StepProgram) -> u64 {
    p.ops
        .iter()
        .filter_map(|o| match &o.payload {
            Payload::Compute(w) => Some(w.flops),
            _ => None,
        })
        .sum()
}

#[test]
fn fused_program_chunks_tp_collectives_and_keeps_bytes_and_flops() {
    let none = program("");
    let explicit = program("tp_comm_overlap = \"none\"\n");
    assert_eq!(none, explicit, "none is the default");
    let fused = program("tp_comm_overlap = \"fused\"\n");
    assert_eq!(compute_flops(&none), compute_flops(&fused));
    let (a, b) = (tp_collectives(&none), tp_collectives(&fused));
    assert!(
        a.values().all(|x| x.0 == 1),
        "none issues whole collectives"
    );
    assert_eq!(a.len(), b.len());
    let mut chunked = [0usize; 2];
    for (n, x) in &a {
        let y = b.get(n).unwrap_or_else(|| panic!("{n} missing when fused"));
        assert_eq!((y.1, y.2), (x.1, x.2), "{n}: bytes kept");
        assert!(y.0 == 1 || y.0 == 4, "{n}: {} ops", y.0);
        if y.0 == 4 {
            chunked[usize::from(n.ends_with(".bwd"))] += 1;
        }
        if n.contains(".out.logits.") {
            assert_eq!(y.0, 1, "{n}: the logits gather feeds the loss, not a GEMM");
        }
    }
    assert!(
        chunked[0] > 0 && chunked[1] > 0,
        "forward and backward fuse: {chunked:?}"
    );
}

#[test]
fn fused_chunks_pipeline_with_their_compute_chunks() {
    let p = program("tp_comm_overlap = \"fused\"\ntp_comm_overlap_chunks = 2\n");
    let mut users: HashMap<OpId, Vec<OpId>> = HashMap::new();
    for o in &p.ops {
        for d in &o.deps {
            users.entry(*d).or_default().push(o.id);
        }
    }
    let mut seen = 0;
    for o in p.ops.iter().filter(|o| o.category == Category::Tp) {
        let Some((base, i)) = chunk(name(&p, o.id)) else {
            continue;
        };
        seen += 1;
        assert!(i < 2, "{base}: chunk {i} of 2");
        assert_eq!(o.stream, Stream::Parallel);
        let partner = if o.payload.as_collective().unwrap().kind == CollectiveKind::AllGather {
            // Compute chunk i (and nothing else) waits for gather chunk i.
            let u = &users[&o.id];
            assert_eq!(u.len(), 1, "{base}.c{i}: {u:?}");
            u[0]
        } else {
            // Reduce chunk i waits for compute chunk i only.
            assert_eq!(o.deps.len(), 1, "{base}.c{i}");
            o.deps[0]
        };
        let op = &p.ops[partner.0 as usize];
        assert_eq!(op.stream, Stream::Compute, "{base}.c{i}");
        assert!(matches!(op.payload, Payload::Compute(_)));
        let (_, j) = chunk(name(&p, partner)).unwrap_or_else(|| panic!("{base}.c{i}"));
        assert_eq!(j, i, "{base}: chunk {i} pairs with compute chunk {j}");
    }
    assert!(seen > 0);
}
