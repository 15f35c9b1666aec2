//! The H200 harness's held-out runs (`scenarios/gpu/*.toml` marked HELD OUT): each loads and
//! simulates, and each differs from its held-in sibling the way its one change must move the
//! step (more tokens take longer, recomputation trades time for memory, accumulation repeats
//! forward and backward but steps the optimizer once). No measured figure of these runs exists
//! here or is asserted; their predictions are recorded in docs/calibration.md.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::calibration::phases::phase_device_s;
use hpfsdp_sim::profile::HardwareProfile;
use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, prepare, run_prepared};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Step time (s), peak memory (bytes) and forward, backward and optimizer device time (s) of
/// `scenarios/gpu/<name>.toml` on its own profile.
fn simulate(name: &str) -> (f64, u64, [f64; 3]) {
    let s = Scenario::load(&root().join(format!("scenarios/gpu/{name}.toml")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let profile =
        HardwareProfile::load_named(&s.file.hardware, root().join("scenarios/hardware")).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, "fsdp2", None, true).unwrap();
    let run = run_prepared(&prepared, &profile, &RunOptions::default()).unwrap();
    let phases = phase_device_s(&run.result, &run.rank0_program).unwrap();
    (
        run.result.step_time_s(),
        run.result.peak_memory_bytes,
        phases,
    )
}

#[test]
fn held_out_dense_14b_runs_move_the_way_their_change_must() {
    let (base_s, base_peak, base_ph) = simulate("dense14b-8l-mbs1");
    let (mbs2_s, mbs2_peak, mbs2_ph) = simulate("dense14b-8l-mbs2");
    let (re_s, re_peak, re_ph) = simulate("dense14b-8l-mbs2-recompute");
    let (acc_s, acc_peak, acc_ph) = simulate("dense14b-8l-mbs1-accum2");
    // Twice the tokens: more time, at most twice the forward and backward; the same optimizer.
    assert!(
        mbs2_s > base_s && mbs2_s < 2.0 * base_s,
        "{mbs2_s} vs {base_s}"
    );
    for i in 0..2 {
        assert!(mbs2_ph[i] > base_ph[i] && mbs2_ph[i] < 2.0 * base_ph[i] + 1e-3);
    }
    assert!((mbs2_ph[2] - base_ph[2]).abs() < 0.01 * base_ph[2]);
    assert!(mbs2_peak >= base_peak);
    // Recomputation runs the forward again inside the backward and keeps less.
    assert!(re_s > mbs2_s && re_ph[1] > mbs2_ph[1], "{re_s} vs {mbs2_s}");
    assert!(re_peak < mbs2_peak, "{re_peak} vs {mbs2_peak}");
    // Two accumulated micro-batches: two forwards and backwards (summed per phase, as the
    // harness sums its CUDA events), one optimizer step.
    assert!(acc_ph[0] > 1.8 * base_ph[0] && acc_ph[1] > 1.8 * base_ph[1]);
    assert!((acc_ph[2] - base_ph[2]).abs() < 0.01 * base_ph[2]);
    assert!(acc_s > mbs2_s, "{acc_s} vs {mbs2_s}");
    assert!(acc_peak > base_peak);
}

#[test]
fn held_out_dense_runs_of_other_shapes_simulate() {
    let (small_s, small_peak, _) = simulate("dense1p7b-28l-mbs1");
    let (mbs4_s, mbs4_peak, _) = simulate("dense1p7b-28l-mbs4");
    assert!(mbs4_s > small_s && mbs4_s < 4.0 * small_s);
    assert!(mbs4_peak > small_peak);
    // Qwen3-4B, 36 layers: more parameters and layers than the 1.7B-shaped run.
    let (four_s, four_peak, _) = simulate("dense4b-36l-mbs1");
    assert!(four_s > small_s && four_peak > small_peak);
}
