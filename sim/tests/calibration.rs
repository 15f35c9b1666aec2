//! The A3 profile as committed must reproduce experiment B (the held-in calibration case):
//! the HyperParallel-FSDP vs FSDP2 step-time difference within -29.7% ± 3 percentage points and
//! each absolute step time within 10% of the measured one.

use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::{CalibrationSet, Figure, PAPER_A3_RUNS};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The shipped runs file of the paper's held-in experiments, scenarios loaded.
fn paper_set() -> CalibrationSet {
    CalibrationSet::load(&[root().join(PAPER_A3_RUNS)]).unwrap()
}

#[test]
fn experiment_b_matches_measurement_with_the_committed_a3_profile() {
    let profile =
        HardwareProfile::load(root().join("scenarios/hardware/ascend-910c-a3.toml")).unwrap();
    let set = paper_set();
    let c = set.compare(&profile).unwrap();
    let d = &c.differences[0];
    assert_eq!(d.difference.name, "exp_b");
    let diff_pp = d.error_pp().unwrap();
    assert!(
        diff_pp.abs() <= 3.0,
        "experiment B difference predicted {:.2}% vs measured {:.2}% ({diff_pp:+.2} pp)",
        d.predicted * 100.0,
        d.difference.measured * 100.0
    );
    for run in ["PyTorch FSDP2", "HyperParallel-FSDP"] {
        let row = c.row(run, Figure::StepTimeS).unwrap();
        let err = row.relative_error().unwrap();
        assert!(
            err.abs() <= 0.10,
            "{run}: predicted step {:.3} s vs measured {:.3} s ({:+.1}%)",
            row.predicted,
            row.measured,
            err * 100.0
        );
    }
}

#[test]
fn derived_collective_counts_are_not_entered() {
    // Reduce-scatters per step are derived from the model and the plan: HyperParallel issues
    // one per parameter (531 on Qwen3-30B-A3B with fused experts), FSDP2 one per unit (49).
    let profile =
        HardwareProfile::load(root().join("scenarios/hardware/ascend-910c-a3.toml")).unwrap();
    let set = paper_set();
    let c = set.compare(&profile).unwrap();
    assert_eq!(
        c.row("HyperParallel-FSDP", Figure::ReduceScatters)
            .unwrap()
            .predicted,
        531.0
    );
    assert_eq!(
        c.row("PyTorch FSDP2", Figure::ReduceScatters)
            .unwrap()
            .predicted,
        49.0
    );
}

/// HyperParallel's "per-parameter post-reduction division" (about 81.7 ms measured in exp B)
/// is a held-in, gating figure computed from the simulated program: the 531 shard-size
/// divisions torch_npu runs after the AVG reduce-scatters, i.e. one read and write of every
/// reduce-scatter output at the profile's memory bandwidth plus one device launch each. It
/// follows the profile (not an entered value), and FSDP2 has no row (its table entry is for
/// a per-parameter division, which it does not run). The figure is the divisions' simulated
/// spans: with side-stream kernels running concurrently that is exactly their own cost; with
/// the A3 profile's `wait_for_vector_cores` each division also waits for the vector cores of
/// the compute stream's current kernel, so the figure is larger.
#[test]
fn post_reduction_division_is_computed_from_the_program() {
    use hpfsdp_sim::calibration::gates::rule_of;
    use hpfsdp_sim::calibration::params::set;
    use hpfsdp_sim::profile::SideStreamKernels;
    let shipped =
        HardwareProfile::load(root().join("scenarios/hardware/ascend-910c-a3.toml")).unwrap();
    assert_eq!(
        shipped.device.side_stream_kernels,
        SideStreamKernels::WaitForVectorCores
    );
    let mut profile = shipped.clone();
    profile.device.side_stream_kernels = SideStreamKernels::Concurrent;
    let set_b = paper_set();
    let only_b = |r: &hpfsdp_sim::calibration::MeasuredRun| r.experiment == "B";
    let c = set_b.compare_where(&profile, only_b).unwrap();
    let fig = Figure::PostReductionDivisionS;
    assert!(rule_of(fig).gating);
    assert!(c.row("PyTorch FSDP2", fig).is_none());
    let row = c.row("HyperParallel-FSDP", fig).unwrap();
    assert_eq!(row.measured, 0.0817);
    let rs_bytes = c
        .row("HyperParallel-FSDP", Figure::ReduceScatterBytes)
        .unwrap()
        .predicted;
    let expected = |p: &HardwareProfile| {
        2.0 * rs_bytes / (p.device.hbm_bandwidth_bytes_per_s * p.calibration.hbm_efficiency)
            + 531.0 * p.calibration.device_launch_us_per_kernel * 1e-6
    };
    // The figure sums 531 spans of whole nanoseconds: up to 531 ns of rounding on ~8 ms.
    assert!(
        (row.predicted / expected(&profile) - 1.0).abs() < 1e-4,
        "{} vs {}",
        row.predicted,
        expected(&profile)
    );
    // Half the memory efficiency: the memory part doubles.
    let eff = profile.calibration.hbm_efficiency;
    assert!(set(&mut profile, "calibration.hbm_efficiency", eff / 2.0));
    let slow = set_b.compare_where(&profile, only_b).unwrap();
    let slow_row = slow.row("HyperParallel-FSDP", fig).unwrap();
    assert!((slow_row.predicted / expected(&profile) - 1.0).abs() < 1e-4);
    assert!(slow_row.predicted > 1.8 * row.predicted);
    // The shipped profile: the same divisions plus their waits for cores.
    let waiting = set_b.compare_where(&shipped, only_b).unwrap();
    let waiting_row = waiting.row("HyperParallel-FSDP", fig).unwrap();
    assert!(
        waiting_row.predicted > 1.5 * expected(&shipped),
        "{} vs own cost {}",
        waiting_row.predicted,
        expected(&shipped)
    );
}

/// A calibration set simulates lean (only the critical rank's breakdown, the timelines of
/// rank 0 and of the critical rank, no memory series) and reads rank 0's program once: every
/// figure and host row it predicts is, bit for bit, what a full simulation of the run
/// (`simulate_strategy` with the default options) gives through the standalone figure
/// functions.
#[test]
fn lean_calibration_simulations_predict_the_full_simulations_figures() {
    use hpfsdp_plan::CollectiveKind;
    use hpfsdp_plan::scenario::Scenario;
    use hpfsdp_program::step::Payload;
    use hpfsdp_sim::calibration::compare::{
        post_reduction_division_span_s, weighted_fsdp_bandwidth,
    };
    use hpfsdp_sim::calibration::phases::phase_device_s;
    use hpfsdp_sim::host_cost::HostTotals;
    use hpfsdp_sim::result::LaunchCounts;
    use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, simulate_strategy};
    let profile =
        HardwareProfile::load(root().join("scenarios/hardware/ascend-910c-a3.toml")).unwrap();
    let set = paper_set();
    let lean = set.compare(&profile).unwrap();
    let mut checked = 0;
    for run in set.runs() {
        let plans = ScenarioPlans::new(Scenario::load(&run.scenario).unwrap());
        let options = RunOptions {
            validation_mode: run.validation_mode,
            optimizer: run.optimizer.clone(),
            ..RunOptions::default()
        };
        let full = simulate_strategy(&plans, &run.strategy, &profile, &options).unwrap();
        let (r, rank0) = (&full.result, &full.rank0_program);
        let launches = LaunchCounts::of(rank0);
        let collective_bytes = |kind: CollectiveKind| -> (f64, f64) {
            let mut n = (0.0, 0.0);
            for op in &rank0.ops {
                if let Payload::Collective(c) = &op.payload
                    && c.kind == kind
                {
                    n.0 += 1.0;
                    n.1 += match kind {
                        CollectiveKind::AllGather => c.input_bytes,
                        _ => c.output_bytes,
                    } as f64;
                }
            }
            n
        };
        let (ag, ag_bytes) = collective_bytes(CollectiveKind::AllGather);
        let (rs, rs_bytes) = collective_bytes(CollectiveKind::ReduceScatter);
        let [fwd, bwd, opt] = phase_device_s(r, rank0).unwrap();
        let want = [
            (Figure::StepTimeS, r.step_time_s()),
            (Figure::ForwardDeviceS, fwd),
            (Figure::BackwardDeviceS, bwd),
            (Figure::OptimizerDeviceS, opt),
            (
                Figure::ExposedCommS,
                r.breakdown.exposed_comm_ns as f64 * 1e-9,
            ),
            (Figure::OverlapRate, r.breakdown.overlap_rate),
            (Figure::CopyS, r.breakdown.copy_ns as f64 * 1e-9),
            (
                Figure::PostReductionDivisionS,
                post_reduction_division_span_s(r, rank0).unwrap(),
            ),
            (Figure::DeviceKernels, launches.device_kernels as f64),
            (Figure::Collectives, launches.collectives as f64),
            (Figure::AllGathers, ag),
            (Figure::ReduceScatters, rs),
            (Figure::AllGatherBytes, ag_bytes),
            (Figure::ReduceScatterBytes, rs_bytes),
            (
                Figure::ValidationCpuEvents,
                HostTotals::of(rank0.ops.iter()).validation_events as f64,
            ),
            (Figure::PeakAllocatedBytes, r.peak_memory_bytes as f64),
            (Figure::WeightedBandwidth, weighted_fsdp_bandwidth(r, rank0)),
        ];
        for row in lean.rows.iter().filter(|row| row.run == run.label) {
            if let Some((_, w)) = want.iter().find(|(f, _)| *f == row.figure) {
                assert_eq!(
                    row.predicted.to_bits(),
                    w.to_bits(),
                    "{} {:?}: lean {} vs full {w}",
                    run.label,
                    row.figure,
                    row.predicted
                );
                checked += 1;
            }
        }
        let host = lean.host.iter().find(|h| h.run == run.label).unwrap();
        assert_eq!(
            host.totals,
            HostTotals::of(rank0.ops.iter()),
            "{}",
            run.label
        );
        assert_eq!(host.host_busy_s, r.breakdown.host_busy_ns as f64 * 1e-9);
        assert_eq!(host.step_s, r.step_time_s());
    }
    assert!(checked >= 20, "only {checked} figures compared");
}

mod joint_fit {
    //! The joint fit on the measured runs: a cheap twin in the suite (two constants, experiment
    //! B only) and the full fit as an ignored test (its leave-one-out folds are checked by
    //! `calibration_priors.rs`).

    use super::{paper_set, root};
    use hpfsdp_sim::HardwareProfile;
    use hpfsdp_sim::calibration::fit::{cost, fit_joint};
    use hpfsdp_sim::calibration::gates::rule_of;
    use hpfsdp_sim::calibration::lm::LmOptions;
    use hpfsdp_sim::calibration::params::{FitParam, get, set};
    use hpfsdp_sim::calibration::verdict::check;
    use hpfsdp_sim::calibration::{CalibrationSet, Figure};

    /// The paper runs file's fit constant `key`.
    fn fit_param(set: &CalibrationSet, key: &str) -> FitParam {
        set.fit_param(key).unwrap().clone()
    }

    fn a3() -> HardwareProfile {
        HardwareProfile::load(root().join("scenarios/hardware/ascend-910c-a3.toml")).unwrap()
    }

    #[test]
    fn two_constants_fitted_on_experiment_b_from_a_bad_start_recover_the_copy_time() {
        let set_b = paper_set();
        let mut start = a3();
        // A deliberately bad start: copy efficiency halved, intra-machine efficiency at 0.9.
        set(&mut start, "calibration.copy_efficiency", 0.25);
        set(&mut start, "tiers.intra_machine.efficiency", 0.9);
        let params = [
            fit_param(&set_b, "calibration.copy_efficiency"),
            fit_param(&set_b, "tiers.intra_machine.efficiency"),
        ];
        let options = LmOptions {
            max_iterations: 8,
            ..LmOptions::default()
        };
        let out = fit_joint(&set_b, &start, &params, |r| r.experiment == "B", &options).unwrap();
        assert!(
            out.cost < out.cost_start,
            "{} -> {}",
            out.cost_start,
            out.cost
        );
        for p in &out.params {
            assert!(p.value >= p.param.min && p.value <= p.param.max, "{p:?}");
        }
        // Only experiment-B rows were simulated.
        assert!(out.comparison.rows.iter().all(|r| r.experiment == "B"));
        // The FSDP2 copy time depends on the copy efficiency alone: the fit must bring it back
        // within its tolerance from +110% at the start (the other residuals of the FSDP2 step
        // pull against it, so not to zero).
        let copy = out.comparison.row("PyTorch FSDP2", Figure::CopyS).unwrap();
        let err = copy.relative_error().unwrap();
        let tolerance = rule_of(Figure::CopyS).tolerance;
        assert!(
            tolerance.passes(copy.measured, copy.predicted),
            "copy time error {:+.1}% outside {}",
            err * 100.0,
            tolerance.label()
        );
        // Same inputs, same result.
        let again = fit_joint(&set_b, &start, &params, |r| r.experiment == "B", &options).unwrap();
        assert_eq!(
            get(&again.profile, "calibration.copy_efficiency"),
            get(&out.profile, "calibration.copy_efficiency")
        );
    }

    /// The unmodelled host work's upper bound is the tighter of its fixed ceiling and the
    /// measured exp-A step over the MODEL's exp-A launches, every start is reported, and the
    /// host-bound start begins at 90% of that bound. Cheap: one constant, exp A only, two
    /// iterations per start.
    #[test]
    fn the_host_bound_counts_the_models_launches_and_every_start_is_reported() {
        use hpfsdp_sim::calibration::fit::{
            HOST_BOUND_START_FRACTION, START_LABELS, resolved_bound,
        };
        let set_all = paper_set();
        let start = a3();
        let param = fit_param(&set_all, "calibration.host_unmodelled_us_per_kernel");
        let c = set_all.compare(&start).unwrap();
        let launches: f64 = [Figure::DeviceKernels, Figure::Collectives]
            .iter()
            .map(|f| c.row("production mode", *f).unwrap().predicted)
            .sum();
        let resolved = resolved_bound(&param, &c);
        // The tighter of the fixed ceiling and the measured step over the model's launches.
        assert!(
            (resolved.max - param.max.min(6.070e6 / launches)).abs() < 1e-9,
            "{resolved:?}"
        );
        let options = LmOptions {
            max_iterations: 2,
            ..LmOptions::default()
        };
        let out = fit_joint(
            &set_all,
            &start,
            &[param],
            |r| r.experiment == "A mbs2",
            &options,
        )
        .unwrap();
        assert_eq!(out.params[0].param.max, resolved.max);
        let labels: Vec<&str> = out.starts.iter().map(|s| s.label).collect();
        assert_eq!(labels, START_LABELS);
        let host = &out.starts[2];
        assert!((host.start[0] - HOST_BOUND_START_FRACTION * resolved.max).abs() < 1e-6);
        let best = out
            .starts
            .iter()
            .map(|s| s.cost)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(out.cost, best);
        assert!(out.params[0].value <= resolved.max);
    }

    /// A constant the measurements push past a bound ends ON it and is flagged: fitted on
    /// exp B alone, the collective host cost is pulled below the measured per-call minimum
    /// (FSDP2's 9.5 ms over the model's 334 calls is 28 us, HyperParallel's 153.2 ms over its
    /// 1,781 is 86 us, and their compromise lies under 54.6 us). Cheap: one constant, exp B
    /// only, four iterations per start.
    #[test]
    fn a_constant_pushed_past_its_bound_is_flagged_at_it() {
        use hpfsdp_sim::calibration::fit::AtBound;
        let set_all = paper_set();
        let param = fit_param(&set_all, "calibration.host_launch_us_per_collective");
        let options = LmOptions {
            max_iterations: 4,
            ..LmOptions::default()
        };
        let b = |r: &hpfsdp_sim::calibration::MeasuredRun| r.experiment == "B";
        let out = fit_joint(&set_all, &a3(), std::slice::from_ref(&param), b, &options).unwrap();
        let fitted = &out.params[0];
        assert_eq!(fitted.at_bound, Some(AtBound::Lower), "{fitted:?}");
        assert_eq!(fitted.value, param.min);
    }

    /// The finding the public launch bounds make (README "Cost model", Host): even at the
    /// public ceiling of an eager launch (32.5 us per kernel) and without the fitted
    /// unmodelled host work, the model's exp-A step stays more than its 10% tolerance short
    /// of the measured 6.070 s, so exp A's host-bound time is host work the model does not
    /// issue, not launch cost (hence `host_unmodelled_us_per_kernel`). When the model gains
    /// that work this test fails: then the residual should fit near its floor.
    #[test]
    fn the_public_launch_ceiling_leaves_experiment_a_short_of_its_measured_step() {
        // The public ceiling of an eager op's host time on an A3 host: 130.1 us per
        // `(x.npu() + y.npu()).cpu()` loop over its four eager ops (pypto/issues/1919).
        const KERNEL_LAUNCH_CEILING_US: f64 = 130.1 / 4.0;
        let set_all = paper_set();
        let mut at_ceiling = a3();
        set(
            &mut at_ceiling,
            "calibration.host_launch_us_per_kernel",
            KERNEL_LAUNCH_CEILING_US,
        );
        set(
            &mut at_ceiling,
            "calibration.host_unmodelled_us_per_kernel",
            0.0,
        );
        let a = |r: &hpfsdp_sim::calibration::MeasuredRun| r.experiment == "A mbs2";
        let c = set_all.compare_where(&at_ceiling, a).unwrap();
        let step = c.row("production mode", Figure::StepTimeS).unwrap();
        assert!(
            step.predicted < 0.9 * step.measured,
            "exp A at {KERNEL_LAUNCH_CEILING_US} us per launch: {} s vs {} s measured",
            step.predicted,
            step.measured
        );
    }

    /// Experiment B is device-bound: its step times move by less than 1% (a tenth of their
    /// tolerance) when the host time per kernel goes from 5 us to the shipped profile's
    /// (launch plus unmodelled host work, ~97 us, against a ~2.6 s device
    /// step; only the launches between the Muon optimizer's 28 strictly ordered gather / NS /
    /// relay batches reach the critical path), so the host-bound exp-A solution costs exp B
    /// next to nothing.
    #[test]
    fn experiment_b_is_insensitive_to_the_host_cost_per_kernel() {
        let set_all = paper_set();
        let mut low = a3();
        set(&mut low, "calibration.host_launch_us_per_kernel", 5.0);
        set(&mut low, "calibration.host_unmodelled_us_per_kernel", 0.0);
        let high = a3();
        let per_kernel = get(&high, "calibration.host_launch_us_per_kernel").unwrap()
            + get(&high, "calibration.host_unmodelled_us_per_kernel").unwrap();
        assert!(
            per_kernel > 50.0,
            "shipped host cost per kernel {per_kernel} us: the comparison needs a host-heavy profile"
        );
        let b = |r: &hpfsdp_sim::calibration::MeasuredRun| r.experiment == "B";
        let (cl, ch) = (
            set_all.compare_where(&low, b).unwrap(),
            set_all.compare_where(&high, b).unwrap(),
        );
        for run in ["PyTorch FSDP2", "HyperParallel-FSDP"] {
            let (l, h) = (
                cl.row(run, Figure::StepTimeS).unwrap().predicted,
                ch.row(run, Figure::StepTimeS).unwrap().predicted,
            );
            assert!(
                (h / l - 1.0).abs() < 1e-2,
                "{run}: {l} s at 5 us, {h} s at {per_kernel} us"
            );
        }
    }

    #[test]
    fn the_verdict_is_not_green_over_a_row_outside_tolerance() {
        let set_all = paper_set();
        let mut bad = a3();
        set(&mut bad, "calibration.copy_efficiency", 0.2);
        let c = set_all.compare(&bad).unwrap();
        let checked = check(&c, false);
        let copy = checked
            .rows
            .iter()
            .find(|r| r.row.run == "PyTorch FSDP2" && r.row.figure == Figure::CopyS)
            .unwrap();
        assert!(copy.gating && !copy.passed);
        assert!(!checked.passed);
        assert!(cost(&c) > 0.0);
    }

    /// The full joint fit over every measured run. Its experiment and run folds (the same
    /// `leave_one_out` + `leave_one_run_out` from the shipped profile with every constant and
    /// the default solver) are computed and checked by `calibration_priors.rs`'s ignored
    /// `every_folds_result_is_blind_to_the_profiles_fitted_values`, which needs them anyway.
    #[test]
    #[ignore = "full joint fit: every constant, every measured run (~17 CPU s)"]
    fn full_joint_fit() {
        let set_all = paper_set();
        let start = a3();
        let options = LmOptions::default();
        let out = fit_joint(&set_all, &start, set_all.fit_params(), |_| true, &options).unwrap();
        assert!(out.cost <= out.cost_start);
        for p in &out.params {
            assert!(p.value >= p.param.min && p.value <= p.param.max, "{p:?}");
        }
    }
}
