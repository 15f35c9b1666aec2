//! transformers' `eager` experts loop (`[model] experts_implementation = "eager"`) against
//! the grouped_mm path on the Qwen3-30B-A3B-shaped four-layer step of one H200
//! (`scenarios/gpu/moe30b-4l-mbs1-{eager,grouped}.toml`, identical but for the choice): the
//! loop's launches, device -> host syncs and host events per hit expert, and what they do to
//! the predicted step. No measured figure of the eager run is used or asserted.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{MemTag, Payload, StepProgram, Stream};
use hpfsdp_program::strategy::eager_experts::{
    DOWN_SYNCS_PER_EXPERT, GATE_UP_SYNCS_PER_EXPERT, LAYER_SYNCS,
};
use hpfsdp_program::strategy::host_events::{
    EAGER_ACT_PER_EXPERT, EAGER_COMBINE_PER_EXPERT, EAGER_DOWN_PER_EXPERT, EAGER_GATE_UP_PER_EXPERT,
};
use hpfsdp_sim::calibration::phases::phase_device_s;
use hpfsdp_sim::profile::HardwareProfile;
use hpfsdp_sim::result::{LaunchCounts, SimResult};
use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, prepare, run_prepared};
use std::path::Path;

const LAYERS: u64 = 4;
const EXPERTS: u64 = 128;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Rank 0's program and the simulated step of `scenarios/gpu/moe30b-4l-mbs1-<path>.toml`.
fn run(path: &str) -> (StepProgram, SimResult) {
    let file = root().join(format!("scenarios/gpu/moe30b-4l-mbs1-{path}.toml"));
    let s = Scenario::load(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
    let profile =
        HardwareProfile::load_named(&s.file.hardware, root().join("scenarios/hardware")).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, "fsdp2", None, true).unwrap();
    let run = run_prepared(&prepared, &profile, &RunOptions::default()).unwrap();
    (run.rank0_program, run.result)
}

/// Host ops that wait on device work (the device -> host syncs).
fn syncs(p: &StepProgram) -> u64 {
    p.ops
        .iter()
        .filter(|o| o.stream == Stream::Host && !o.deps.is_empty())
        .count() as u64
}

/// The decoder layer whose compute op of pass `pass` (`.fwd`, `.bwd`) `name` is:
/// `layers.<i><pass>` or one of its pieces `layers.<i><pass>.part<j>` (not its FSDP copies).
fn layer_of(name: &str, pass: &str) -> Option<usize> {
    let (layer, tail) = name.strip_prefix("layers.")?.split_once('.')?;
    let tail = format!(".{tail}");
    let piece = tail
        .strip_prefix(pass)
        .is_some_and(|p| p.is_empty() || p.starts_with(".part"));
    piece.then(|| layer.parse().ok()).flatten()
}

/// Production host CPU operator events of the compute ops of pass `pass` (`.fwd`, `.bwd`).
fn events(p: &StepProgram, pass: &str) -> u64 {
    p.ops
        .iter()
        .filter(|o| matches!(o.payload, Payload::Compute(_)))
        .filter(|o| {
            o.name
                .as_deref()
                .is_some_and(|n| n.ends_with(pass) || n.contains(&format!("{pass}.part")))
        })
        .map(|o| u64::from(o.host_cpu_events))
        .sum()
}

/// Working bytes (`MemTag::Other` allocations) of each decoder layer's compute ops of pass
/// `pass` (`.fwd`, `.bwd`).
fn layer_working_bytes(p: &StepProgram, pass: &str) -> Vec<u64> {
    let mut out = vec![0; LAYERS as usize];
    for o in &p.ops {
        if let Some(l) = o.name.as_deref().and_then(|n| layer_of(n, pass)) {
            out[l] += o
                .memory
                .iter()
                .filter(|m| m.tag == MemTag::Other)
                .map(|m| m.alloc_bytes)
                .sum::<u64>();
        }
    }
    out
}

#[test]
fn eager_layers_hold_a_full_size_expert_gradient_in_backward() {
    let (grouped, _) = run("grouped");
    let (eager, _) = run("eager");
    // gate_up_proj [128, 1536, 2048] in bf16 beside its accumulated gradient; the int64
    // one_hot mask [4096, 8, 128] through the forward loop.
    assert_eq!(
        layer_working_bytes(&eager, ".bwd"),
        vec![128 * 1536 * 2048 * 2; 4]
    );
    assert_eq!(
        layer_working_bytes(&eager, ".fwd"),
        vec![4096 * 8 * 128 * 8; 4]
    );
    assert_eq!(layer_working_bytes(&grouped, ".bwd"), vec![0; 4]);
    assert_eq!(layer_working_bytes(&grouped, ".fwd"), vec![0; 4]);
}

#[test]
fn eager_loop_launches_syncs_and_host_events_per_hit_expert() {
    let (grouped, g) = run("grouped");
    let (eager, e) = run("eager");
    // Every one of the 128 experts is hit by 32,768 routed copies.
    let per_layer_syncs =
        LAYER_SYNCS + EXPERTS as u32 * (GATE_UP_SYNCS_PER_EXPERT + DOWN_SYNCS_PER_EXPERT);
    assert_eq!(per_layer_syncs, 1 + 128 * 5);
    assert_eq!(syncs(&grouped), 0);
    assert_eq!(syncs(&eager), LAYERS * u64::from(per_layer_syncs));
    // Host events: the census per hit expert on the four parts of the loop.
    let per_expert = [
        EAGER_GATE_UP_PER_EXPERT,
        EAGER_ACT_PER_EXPERT,
        EAGER_DOWN_PER_EXPERT,
        EAGER_COMBINE_PER_EXPERT,
    ];
    let fwd: u64 = per_expert.iter().map(|p| u64::from(p.fwd)).sum();
    let bwd: u64 = per_expert.iter().map(|p| u64::from(p.bwd)).sum();
    assert_eq!((fwd, bwd), (76, 123), "the census's events per expert");
    assert!(events(&eager, ".fwd") > events(&grouped, ".fwd") + LAYERS * EXPERTS * (fwd - 10));
    assert!(events(&eager, ".bwd") > events(&grouped, ".bwd") + LAYERS * EXPERTS * (bwd - 10));
    // Kernels: 13 forward and 37 backward per hit expert and layer (the loop's count, far
    // above the grouped path's few per layer).
    let (gk, ek) = (
        LaunchCounts::of(&grouped).device_kernels,
        LaunchCounts::of(&eager).device_kernels,
    );
    assert!(
        ek > gk + LAYERS * EXPERTS * (13 + 37 - 8),
        "eager {ek} vs grouped {gk}"
    );
    // The grouped step is untouched by the eager model; the eager one is host-bound in
    // forward (the device idles at every sync) and streams every 3-D parameter's gradient
    // once per expert in backward: several times slower.
    assert!(
        e.step_time_s() > 4.0 * g.step_time_s(),
        "{} vs {}",
        e.step_time_s(),
        g.step_time_s()
    );
    let [gf, gb, go] = phase_device_s(&g, &grouped).unwrap();
    let [ef, eb, eo] = phase_device_s(&e, &eager).unwrap();
    for (name, r, [f, b, o], k) in [
        ("grouped", &g, [gf, gb, go], gk),
        ("eager", &e, [ef, eb, eo], ek),
    ] {
        eprintln!(
            "{name}: step {:.1} ms, forward {:.1} / backward {:.1} / optimizer {:.1} ms device, \
             peak {:.2} GiB, {k} kernels",
            r.step_time_s() * 1e3,
            f * 1e3,
            b * 1e3,
            o * 1e3,
            r.peak_memory_bytes as f64 / (1u64 << 30) as f64,
        );
    }
    assert!(ef > 5.0 * gf, "forward {ef} vs {gf}");
    assert!(eb > 5.0 * gb, "backward {eb} vs {gb}");
    assert!((eo - go).abs() < 1e-3 * go, "optimizer {eo} vs {go}");
}
