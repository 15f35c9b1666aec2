//! Measured runs as data: the shipped runs files hold what was hard-wired before (the paper
//! file) and what the H200 harness measured; the paper file's bounds, blind bounds and priors
//! say where they come from; bad runs files are refused naming the file, line and key.

use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::gates::{Tolerance, rule_of};
use hpfsdp_sim::calibration::holdout::Holdout;
use hpfsdp_sim::calibration::params::{MaxFrom, blind_profile, get, outside_sourced_ranges, set};
use hpfsdp_sim::calibration::{CalibrationSet, Figure, PAPER_A3_RUNS, RunsFile};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn paper() -> RunsFile {
    RunsFile::load(&root().join(PAPER_A3_RUNS)).unwrap()
}

/// The paper's held-in figures exactly as `measured_runs()` hard-wired them in Rust before
/// they became data (experiment, run, figure, value), the fixture the file is checked
/// against: same runs, same figures in the same order, bit-for-bit the same values.
fn hard_wired_before() -> Vec<(&'static str, &'static str, Figure, f64)> {
    use Figure::*;
    let gib = 1024.0 * 1024.0 * 1024.0;
    let b = |run, f, v| ("B", run, f, v);
    let a = |run, f, v| ("A mbs2", run, f, v);
    vec![
        b("PyTorch FSDP2", StepTimeS, 3.720),
        b("PyTorch FSDP2", ExposedCommS, 0.9167),
        b("PyTorch FSDP2", OverlapRate, 0.7081),
        b("PyTorch FSDP2", CopyS, 0.4511),
        b("PyTorch FSDP2", AllGathers, 125.0),
        b("PyTorch FSDP2", ReduceScatters, 49.0),
        b("PyTorch FSDP2", AllGatherBytes, 7.670e9),
        b("PyTorch FSDP2", ReduceScatterBytes, 3.817e9),
        b("PyTorch FSDP2", HostCollectiveS, 0.0095),
        b("PyTorch FSDP2", PeakAllocatedBytes, 51.035e9),
        b("PyTorch FSDP2", WeightedBandwidth, 56.78e9),
        b("HyperParallel-FSDP", StepTimeS, 2.614),
        b("HyperParallel-FSDP", ExposedCommS, 0.2554),
        b("HyperParallel-FSDP", OverlapRate, 0.8532),
        b("HyperParallel-FSDP", CopyS, 0.0),
        b("HyperParallel-FSDP", PostReductionDivisionS, 0.0817),
        b("HyperParallel-FSDP", AllGathers, 1087.0),
        b("HyperParallel-FSDP", ReduceScatters, 531.0),
        b("HyperParallel-FSDP", AllGatherBytes, 7.670e9),
        b("HyperParallel-FSDP", ReduceScatterBytes, 3.817e9),
        b("HyperParallel-FSDP", HostCollectiveS, 0.1532),
        b("HyperParallel-FSDP", PeakAllocatedBytes, 50.005e9),
        b("HyperParallel-FSDP", WeightedBandwidth, 125.22e9),
        a("production mode", StepTimeS, 6.070),
        a("production mode", PeakAllocatedBytes, 36.649 * gib),
        a("production mode", DeviceKernels, 57_560.0),
        a("production mode", Collectives, 9_554.0),
        a("validation mode", StepTimeS, 6.244),
        a("validation mode", PeakAllocatedBytes, 36.649 * gib),
        a("validation mode", DeviceKernels, 57_560.0),
        a("validation mode", Collectives, 9_554.0),
        a("validation mode", ValidationOverheadS, 6.244 - 6.070),
        a("validation mode", ValidationCpuEvents, 23_713.0),
    ]
}

#[test]
fn the_paper_runs_file_holds_exactly_the_figures_hard_wired_before() {
    let file = paper();
    assert_eq!(file.hardware, "ascend-910c-a3");
    let got: Vec<(&str, &str, Figure, u64)> = file
        .runs
        .iter()
        .flat_map(|r| {
            r.figures.iter().map(move |m| {
                (
                    r.experiment.as_str(),
                    r.label.as_str(),
                    m.figure,
                    m.value.to_bits(),
                )
            })
        })
        .collect();
    let want: Vec<(&str, &str, Figure, u64)> = hard_wired_before()
        .into_iter()
        .map(|(e, r, f, v)| (e, r, f, v.to_bits()))
        .collect();
    assert_eq!(got, want);
    let strategies: Vec<(&str, bool)> = file
        .runs
        .iter()
        .map(|r| (r.strategy.as_str(), r.validation_mode))
        .collect();
    assert_eq!(
        strategies,
        [
            ("fsdp2", false),
            ("hyperparallel", false),
            ("hyperparallel", false),
            ("hyperparallel", true)
        ]
    );
    // Every figure keeps its default rule and names its source.
    for r in &file.runs {
        for m in &r.figures {
            assert_eq!(m.rule, *rule_of(m.figure), "{} {:?}", r.label, m.figure);
            assert!(!m.source.is_empty());
        }
    }
    // The experiment-B difference, as EXP_B_MEASURED_DIFF was: 2.614 / 3.720 - 1.
    let d = &file.differences[0];
    assert_eq!(d.measured.to_bits(), (2.614f64 / 3.720 - 1.0).to_bits());
    assert_eq!((d.tolerance_pp, d.name.as_str()), (3.0, "exp_b"));
    let keys: Vec<&str> = file.fit.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "calibration.gemm_ceiling",
            "calibration.hbm_efficiency",
            "calibration.copy_efficiency",
            "calibration.host_launch_us_per_kernel",
            "calibration.host_unmodelled_us_per_kernel",
            "calibration.host_launch_us_per_collective",
            "calibration.validation_us_per_cpu_event",
            "tiers.intra_machine.efficiency",
        ]
    );
}

mod paper_constants {
    //! The paper file's fit constants: every bound, blind bound and prior names its source,
    //! and leave-one-out blinds exactly what comes from what it leaves out.

    use super::*;

    /// Floor of the host time of one eager kernel launch on torch_npu (triton-ascend/1675).
    const KERNEL_LAUNCH_FLOOR_US: f64 = 8.6;
    /// One whole eager `torch.add` on Ascend 910B2 (triton-ascend/1675).
    const EAGER_OP_HOST_US: f64 = 12.142;

    /// Public BF16 `torch.matmul` throughput of square GEMMs on one Ascend 910B2 (torch
    /// 2.5.1; github.com/zzc0721/torch-performance-test-data/issues/109): `(n, TFLOPS)`; the
    /// `calibration.gemm_ceiling` prior's centre is their geometric mean efficiency over the
    /// shape model's `s(n)^3` (its source names these points).
    const GEMM_CEILING_PUBLIC_POINTS: [(f64, f64); 4] = [
        (2048.0, 248.30),
        (4096.0, 315.36),
        (8192.0, 301.23),
        (10240.0, 300.94),
    ];
    /// The BF16 peak those points are divided by, TFLOPS.
    const GEMM_CEILING_PUBLIC_PEAK_TFLOPS: f64 = 376.0;

    #[test]
    fn every_bound_names_its_source() {
        let file = paper();
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let sourced = |text: &str| {
            ["ASSUMPTION", "measured", "exp A", "exp B", "github.com/"]
                .iter()
                .any(|w| text.contains(w))
        };
        for p in &file.fit {
            assert!(get(&profile, &p.key).is_some(), "unknown key {}", p.key);
            assert!(sourced(&p.bound_source), "{}: {}", p.key, p.bound_source);
            if let Some(b) = &p.blind {
                assert!(sourced(&b.source), "{} blind: {}", p.key, b.source);
            }
        }
        let param = |key: &str| file.fit.iter().find(|p| p.key == key).unwrap();
        let launch = param("calibration.host_launch_us_per_kernel");
        for needle in [
            "triton-ascend/issues/1675",
            "pypto/issues/1919",
            "8.6 us",
            "32.5 us",
            "12.142",
            "torch_npu 2.8.0, CANN 8.5.0",
        ] {
            assert!(launch.bound_source.contains(needle), "missing {needle}");
        }
        let residual = param("calibration.host_unmodelled_us_per_kernel");
        for needle in ["RESIDUAL", "6.070 s", "MODEL's rank-0"] {
            assert!(residual.bound_source.contains(needle), "missing {needle}");
        }
        assert_eq!(
            residual.max_from,
            MaxFrom::ModelLaunches {
                run: "production mode".into(),
                step_s: 6.070
            }
        );
        assert_eq!(
            (launch.min, launch.max),
            (KERNEL_LAUNCH_FLOOR_US, EAGER_OP_HOST_US)
        );
        assert!(
            (launch.prior.centre - (KERNEL_LAUNCH_FLOOR_US * EAGER_OP_HOST_US).sqrt()).abs() < 0.01
        );
        for r in &file.sourced_ranges {
            assert!(r.min > 0.0 && r.min < r.max, "{}: bad range", r.key);
            assert!(r.source.matches("github.com/").count() >= 2, "{}", r.key);
        }
        assert!(outside_sourced_ranges(&file.sourced_ranges, &profile).is_empty());
    }

    /// Every prior is positive, says where it comes from (a public source or an ASSUMPTION)
    /// and uses none of the held-in figures: they are the fit's data, and a prior built on
    /// them would count them twice and leak them into leave-one-out.
    #[test]
    fn every_prior_is_sourced_and_blind_to_the_held_in_figures() {
        for p in paper().fit {
            let prior = &p.prior;
            assert!(
                ["PUBLIC", "ASSUMPTION"]
                    .iter()
                    .any(|w| prior.source.contains(w)),
                "{}: {}",
                p.key,
                prior.source
            );
            for held_in in [
                "exp A", "exp B", "6.070", "6.244", "2.614", "3.720", "23,713", "153.2", "9.5 ms",
                "451.1", "51.13",
            ] {
                assert!(
                    !prior.source.contains(held_in),
                    "{}: prior source mentions held-in figure {held_in}",
                    p.key
                );
            }
        }
    }

    /// The GEMM ceiling's prior centre is what its public points give through the shape
    /// model (default half-saturation 256, the A3 profile's).
    #[test]
    fn the_gemm_ceiling_prior_follows_its_public_points() {
        let shape = hpfsdp_sim::compute_cost::ComputeSpec::default();
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        assert_eq!(
            profile.compute.shape_factor(4096.0, 4096.0, 4096.0),
            shape.shape_factor(4096.0, 4096.0, 4096.0)
        );
        let logs: Vec<f64> = GEMM_CEILING_PUBLIC_POINTS
            .iter()
            .map(|(n, tflops)| {
                (tflops / GEMM_CEILING_PUBLIC_PEAK_TFLOPS / shape.shape_factor(*n, *n, *n)).ln()
            })
            .collect();
        let centre = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        let file = paper();
        let prior = &file
            .fit
            .iter()
            .find(|p| p.key == "calibration.gemm_ceiling")
            .unwrap()
            .prior;
        assert!(
            (prior.centre - centre).abs() < 0.005,
            "{} vs {centre}",
            prior.centre
        );
        assert!(prior.source.contains("GEMM_CEILING_PUBLIC_POINTS"));
    }

    /// Leave-one-out blinds exactly the bounds and measured constants that use what it
    /// leaves out: a run fold blinds what that run measured and keeps what its sibling
    /// measured; a bound from both runs is blinded by either.
    #[test]
    fn a_fold_blinds_what_it_leaves_out_only() {
        let file = paper();
        let param = |key: &str| file.fit.iter().find(|p| p.key == key).unwrap().clone();
        let launch = param("calibration.host_launch_us_per_kernel");
        assert_eq!(launch.without(&Holdout::whole("A mbs2")), launch);
        let coll = param("calibration.host_launch_us_per_collective");
        let blind = coll.without(&Holdout::whole("B"));
        assert_eq!((blind.min, blind.max), (1.0, 1000.0));
        assert_eq!(coll.without(&Holdout::whole("A mbs2")), coll);
        let hp = Holdout::run("B", "HyperParallel-FSDP");
        let fsdp2 = Holdout::run("B", "PyTorch FSDP2");
        let (tier, gemm) = (
            param("tiers.intra_machine.efficiency"),
            param("calibration.gemm_ceiling"),
        );
        assert_eq!(tier.without(&hp), tier);
        assert_ne!(tier.without(&fsdp2), tier);
        assert_ne!(gemm.without(&hp), gemm);
        assert_eq!(gemm.without(&fsdp2), gemm);
        assert_ne!(coll.without(&hp), coll);
        assert_ne!(coll.without(&fsdp2), coll);
        let host = param("calibration.host_unmodelled_us_per_kernel");
        assert_ne!(
            host.without(&Holdout::run("A mbs2", "production mode")),
            host
        );
        assert_eq!(
            host.without(&Holdout::run("A mbs2", "validation mode")),
            host
        );
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let key = "calibration.unaligned_bandwidth_factor";
        let constants = &file.measured_constants;
        let (without_hp, replaced) = blind_profile(&profile, constants, &hp).unwrap();
        assert_eq!(get(&without_hp, key), get(&profile, key));
        assert!(replaced.is_empty());
        let (without_fsdp2, replaced) = blind_profile(&profile, constants, &fsdp2).unwrap();
        assert_eq!(get(&without_fsdp2, key), Some(1.0));
        assert!(replaced[0].blind_source.contains("ASSUMPTION"));
        let mut other = profile.clone();
        assert!(set(&mut other, key, 0.3));
        let (without_a, _) = blind_profile(&other, constants, &Holdout::whole("A mbs2")).unwrap();
        assert_eq!(get(&without_a, key), Some(0.3));
    }
}

mod h200 {
    //! The H200 runs file: three held-in runs, each its own experiment, with the figures a
    //! one-GPU user measures.

    use super::*;

    fn h200() -> RunsFile {
        RunsFile::load(&root().join("scenarios/runs/h200-fsdp2.toml")).unwrap()
    }

    #[test]
    fn three_runs_each_its_own_experiment_with_their_tolerances_and_priors() {
        let file = h200();
        assert_eq!(file.hardware, "nvidia-h200-hgx");
        assert_eq!(file.runs.len(), 3);
        for r in &file.runs {
            assert_eq!(r.experiment, r.label);
            let figures: Vec<Figure> = r.figures.iter().map(|m| m.figure).collect();
            assert_eq!(
                figures,
                [
                    Figure::StepTimeS,
                    Figure::ForwardDeviceS,
                    Figure::BackwardDeviceS,
                    Figure::OptimizerDeviceS,
                    Figure::PeakAllocatedBytes,
                    Figure::PeakReservedBytes,
                    Figure::DeviceKernels,
                ]
            );
            for m in &r.figures {
                assert!(m.source.contains("runs.jsonl") && m.source.contains("machine"));
                let five = matches!(
                    m.figure,
                    Figure::StepTimeS | Figure::PeakAllocatedBytes | Figure::DeviceKernels
                );
                assert_eq!(
                    m.rule.tolerance == Tolerance::Relative(0.05),
                    five,
                    "{:?}",
                    m.figure
                );
            }
            let alloc = r
                .figures
                .iter()
                .find(|m| m.figure == Figure::PeakAllocatedBytes);
            assert!(alloc.unwrap().rule.gating);
            let reserved = r
                .figures
                .iter()
                .find(|m| m.figure == Figure::PeakReservedBytes);
            assert!(!reserved.unwrap().rule.gating);
        }
        let dense = &file.runs[0];
        assert_eq!(dense.value(Figure::StepTimeS), Some(0.305618193000015));
        // The issue's leave-one-out tolerance on step time: 10%.
        for r in &file.runs {
            let step = r
                .figures
                .iter()
                .find(|m| m.figure == Figure::StepTimeS)
                .unwrap();
            assert_eq!(step.rule.loo_tolerance, Some(Tolerance::Relative(0.10)));
        }
        // Kernels from the kernel table, without the profiler's GPU annotation rows that
        // runs.jsonl's `kernels` (3,219) counts.
        assert_eq!(dense.value(Figure::DeviceKernels), Some(3181.0));
        let keys: Vec<&str> = file.fit.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "calibration.hbm_efficiency",
                "compute.attention_relative_efficiency"
            ]
        );
        // The copy efficiency is measured directly (micro.json), not fitted; the device time
        // per launched op and the host costs per CPU operator event (Python-dispatched, and
        // the autograd engine's relative to it) are measured on the 14B run's trace, so
        // leave-one-out replaces each with its blind value when that run is left out.
        let measured: Vec<(&str, &str, f64)> = file
            .measured_constants
            .iter()
            .map(|m| (m.key.as_str(), m.experiment.as_str(), m.blind_value))
            .collect();
        assert_eq!(
            measured,
            [
                (
                    "calibration.device_launch_us_per_kernel",
                    "dense14b-8l-mbs1",
                    0.92
                ),
                (
                    "calibration.host_backward_event_cost_ratio",
                    "dense14b-8l-mbs1",
                    1.0
                ),
                (
                    "calibration.host_us_per_cpu_event",
                    "dense14b-8l-mbs1",
                    8.15
                ),
            ]
        );
        for p in &file.fit {
            assert!(p.prior.source.contains("micro.json"), "{}", p.key);
        }
    }

    /// The harness leaves the previous run's fp32 parameters allocated through a run's timed
    /// steps: the 1.7B run carries a 14B run's, the MoE run a 1.7B run's, the first (14B) run
    /// none. Each resident figure is 4 bytes times the parameter count the plan model gives
    /// the predecessor's scenario, which is also runs.jsonl's `params`.
    #[test]
    fn resident_memory_is_the_previous_runs_fp32_parameters() {
        let file = h200();
        let params = |scenario: &str| {
            let s = hpfsdp_plan::scenario::Scenario::load(&root().join(scenario)).unwrap();
            s.model.total_params() as f64
        };
        let resident: Vec<Option<f64>> = file
            .runs
            .iter()
            .map(|r| r.resident.as_ref().map(|m| m.bytes))
            .collect();
        let dense14b = params("scenarios/gpu/dense14b-8l-mbs1.toml");
        let dense1p7b = params("scenarios/gpu/dense1p7b-28l-mbs1.toml");
        assert_eq!(dense14b, 4_198_325_248.0);
        assert_eq!(dense1p7b, 2_031_739_904.0);
        assert_eq!(
            resident,
            [None, Some(4.0 * dense14b), Some(4.0 * dense1p7b)]
        );
        for r in file.runs.iter().filter_map(|r| r.resident.as_ref()) {
            assert!(
                r.source.contains("previous run's fp32 parameters"),
                "{}",
                r.source
            );
        }
    }

    /// The comparison adds a run's resident memory to its predicted peak allocated memory and
    /// says so in the row's source; nothing else moves.
    #[test]
    fn resident_memory_is_added_to_the_predicted_peak_only() {
        let with = h200();
        let mut without = with.clone();
        for r in &mut without.runs {
            r.resident = None;
        }
        let profile = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        let a = CalibrationSet::new(vec![with.clone()])
            .unwrap()
            .compare(&profile)
            .unwrap();
        let b = CalibrationSet::new(vec![without])
            .unwrap()
            .compare(&profile)
            .unwrap();
        for (x, y) in a.rows.iter().zip(&b.rows) {
            let run = with.runs.iter().find(|r| r.label == x.run).unwrap();
            let added = match (&run.resident, x.figure) {
                (Some(m), Figure::PeakAllocatedBytes) => m.bytes,
                _ => 0.0,
            };
            if x.predicted.is_finite() {
                assert_eq!(x.predicted, y.predicted + added, "{} {:?}", x.run, x.figure);
            }
            assert_eq!(
                x.source.contains("GiB resident"),
                added > 0.0,
                "{}",
                x.source
            );
        }
    }

    /// The runs simulate with the profile they were measured on: every figure but the
    /// reserved memory is predicted, and the reserved memory is not modelled.
    #[test]
    fn every_figure_but_reserved_memory_is_predicted() {
        let set = CalibrationSet::new(vec![h200()]).unwrap();
        assert_eq!(set.experiments().len(), 3);
        let profile = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        let c = set.compare(&profile).unwrap();
        assert_eq!(c.rows.len(), 21);
        for r in &c.rows {
            let predicted = r.predicted.is_finite() && r.predicted > 0.0;
            assert_eq!(predicted, r.figure.modelled(), "{} {:?}", r.run, r.figure);
        }
    }
}

mod bad_files {
    //! A runs file with a mistake is refused with its file, line and key named.

    use super::*;

    const GOOD: &str = r#"hardware = "ascend-910c-a3"
[[run]]
experiment = "E"
label = "one"
scenario = "SCENARIO"
strategy = "fsdp2"
[run.figures]
step_time_s = { value = "1.5 s", source = "my log" }
"#;

    fn dir() -> PathBuf {
        root().join("scenarios/runs")
    }

    fn scenario() -> String {
        root()
            .join("scenarios/verify/dense-fsdp4.toml")
            .display()
            .to_string()
    }

    /// The error of `text` (GOOD with edits) as a runs file in scenarios/runs/.
    fn error(text: &str) -> String {
        let text = text.replace("SCENARIO", &scenario());
        RunsFile::parse(&text, &dir().join("bad.toml"))
            .unwrap_err()
            .to_string()
    }

    fn line_of(text: &str, needle: &str) -> usize {
        text.lines().position(|l| l.contains(needle)).unwrap() + 1
    }

    #[test]
    fn the_good_file_loads() {
        let text = GOOD.replace("SCENARIO", &scenario());
        let f = RunsFile::parse(&text, &dir().join("good.toml")).unwrap();
        assert_eq!(f.runs[0].value(Figure::StepTimeS), Some(1.5));
    }

    #[test]
    fn an_unknown_figure_names_line_key_and_the_known_figures() {
        let text = GOOD.to_string() + "step_tme_s = { value = 1, source = \"x\" }\n";
        let e = error(&text);
        let line = line_of(&text, "step_tme_s");
        assert!(
            e.contains(&format!("bad.toml:{line}: run.figures.step_tme_s")),
            "{e}"
        );
        assert!(
            e.contains("known figures: step_time_s, forward_device_s"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_resident_entry_is_named() {
        let with = |entry: &str| {
            GOOD.replace(
                "strategy = \"fsdp2\"\n",
                &format!("strategy = \"fsdp2\"\nresident = {entry}\n"),
            )
        };
        let ok = with("{ bytes = \"2 GiB\", source = \"a reference model\" }")
            .replace("SCENARIO", &scenario());
        let f = RunsFile::parse(&ok, &dir().join("good.toml")).unwrap();
        assert_eq!(
            f.runs[0].resident.as_ref().unwrap().bytes,
            2.0 * 1024.0 * 1024.0 * 1024.0
        );
        let text = with("{ bytes = -1, source = \"x\" }");
        let line = line_of(&text, "resident");
        let e = error(&text);
        assert!(
            e.contains(&format!("bad.toml:{line}: run.resident.bytes")),
            "{e}"
        );
        assert!(e.contains("must be a finite number >= 0"), "{e}");
        let e = error(&with("{ bytes = \"2 parsecs\", source = \"x\" }"));
        assert!(
            e.contains("run.resident.bytes") && e.contains("unknown unit"),
            "{e}"
        );
        let e = error(&with("{ bytes = 5 }"));
        assert!(e.contains("run.resident.source: no source"), "{e}");
        let e = error(&with("{ bytes = 5, source = \"x\", when = 1 }"));
        assert!(e.contains("unknown field") && e.contains("when"), "{e}");
    }

    #[test]
    fn a_leave_one_out_tolerance_is_read_and_a_bad_one_named() {
        let with = |t: &str| {
            GOOD.replace(
                "source = \"my log\" }",
                &format!("source = \"my log\", loo_tolerance = \"{t}\" }}"),
            )
        };
        let ok = with("10%").replace("SCENARIO", &scenario());
        let f = RunsFile::parse(&ok, &dir().join("good.toml")).unwrap();
        let rule = f.runs[0].figures[0].rule;
        assert_eq!(rule.loo_tolerance, Some(Tolerance::Relative(0.10)));
        let text = with("ten percent");
        let e = error(&text);
        let line = line_of(&text, "loo_tolerance");
        assert!(
            e.contains(&format!(
                "bad.toml:{line}: run.figures.step_time_s.loo_tolerance"
            )),
            "{e}"
        );
    }

    #[test]
    fn a_figure_without_source_or_with_a_bad_value_or_tolerance_is_named() {
        let no_source = GOOD.replace(", source = \"my log\"", "");
        assert!(error(&no_source).contains("run.figures.step_time_s.source: no source"));
        let unit = GOOD.replace("1.5 s", "1.5 parsecs");
        let e = error(&unit);
        assert!(
            e.contains(":8: run.figures.step_time_s.value: unknown unit 'parsecs'"),
            "{e}"
        );
        let tol = GOOD.replace(
            "source = \"my log\"",
            "source = \"my log\", tolerance = \"0.1\"",
        );
        let e = error(&tol);
        assert!(
            e.contains("step_time_s.tolerance: tolerance '0.1' needs a unit"),
            "{e}"
        );
        let derived = GOOD.to_string() + "validation_overhead_s = { value = 1, source = \"x\" }\n";
        assert!(error(&derived).contains("is derived"));
    }

    #[test]
    fn a_bad_scenario_strategy_mode_or_unknown_field_is_named() {
        let e = error(&GOOD.replace("SCENARIO", "no/such.toml"));
        assert!(
            e.contains("bad.toml:5: run.scenario: scenario 'no/such.toml' not found"),
            "{e}"
        );
        let e = error(&GOOD.replace("\"fsdp2\"", "\"fsdp9\""));
        assert!(e.contains("bad.toml:6: run.strategy"), "{e}");
        let e = error(&GOOD.replace(
            "strategy = \"fsdp2\"",
            "strategy = \"fsdp2\"\nmode = \"fast\"",
        ));
        assert!(e.contains("bad.toml:7: run.mode: mode 'fast'"), "{e}");
        let e = error(&GOOD.replace("label = \"one\"", "label = \"one\"\nlabell = \"x\""));
        assert!(e.contains("bad.toml:5:") && e.contains("labell"), "{e}");
        let e = error(&GOOD.replace("= \"E\"", "= E"));
        assert!(e.contains("bad.toml:3:"), "{e}");
    }

    #[test]
    fn a_bad_fit_entry_or_reference_is_named() {
        let fit = |key: &str| {
            format!(
                "{GOOD}\n[[fit]]\nkey = \"{key}\"\nmin = 0.1\nmax = 1.0\nbound_source = \"b\"\n\
                 prior = {{ centre = 0.5, log_width = 0.4, source = \"p\" }}\n"
            )
        };
        let e = error(&fit("calibration.copy_eficiency"));
        assert!(
            e.contains(":11: fit.key: unknown profile key 'calibration.copy_eficiency'")
                && e.contains("calibration.copy_efficiency"),
            "{e}"
        );
        let text = fit("calibration.copy_efficiency").replace("min = 0.1", "min = 2.0");
        assert!(error(&text).contains("min 2 and max 1 must be positive with min < max"));
        let text = fit("calibration.copy_efficiency")
            + "blind = { experiments = [\"F\"], min = 0.1, max = 1.0, source = \"s\" }\n";
        let text = text.replace(
            "prior = { centre = 0.5, log_width = 0.4, source = \"p\" }\nblind",
            "prior = { centre = 0.5, log_width = 0.4, source = \"p\" }\nblind",
        );
        assert!(error(&text).contains("no experiment 'F' in this file"));
        let diff = format!(
            "{GOOD}\n[[difference]]\nname = \"d\"\nlabel = \"l\"\nexperiment = \"E\"\n\
             run = \"one\"\nbaseline = \"two\"\ntolerance_pp = 3.0\nsource = \"s\"\n"
        );
        let e = error(&diff);
        assert!(
            e.contains(":15: difference.baseline: no run 'two' in experiment 'E'"),
            "{e}"
        );
        let dup = GOOD.to_string()
            + &GOOD["hardware = \"ascend-910c-a3\"\n".len()..].replace("\"E\"", "\"F\"");
        assert!(error(&dup).contains("run label 'one' is used twice"));
    }

    #[test]
    fn two_files_with_the_same_run_label_are_refused_naming_both() {
        let text = GOOD.replace("SCENARIO", &scenario());
        let a = RunsFile::parse(&text, &dir().join("a.toml")).unwrap();
        let b = RunsFile::parse(&text, &dir().join("b.toml")).unwrap();
        let e = CalibrationSet::new(vec![a, b]).unwrap_err().to_string();
        assert!(
            e.contains("b.toml") && e.contains("a.toml") && e.contains("'one'"),
            "{e}"
        );
    }
}

mod phases {
    //! Forward, backward and optimizer device time of a one-GPU step: the phases follow the
    //! issue order (one forward and one backward per micro-batch, then the optimizer), and
    //! their spans on the compute stream fit inside the step.

    use super::*;
    use hpfsdp_plan::scenario::Scenario;
    use hpfsdp_program::step::Category;
    use hpfsdp_sim::calibration::phases::{Phase, phase_device_s, phase_of_ops};
    use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, simulate_strategy};

    /// A one-rank FSDP2 step of the tiny dense model with `micro_batches` micro-batches.
    fn one_gpu(micro_batches: usize) -> ScenarioPlans {
        let model = root().join("scenarios/verify/models/tiny-dense.toml");
        let text = format!(
            "name = \"one-gpu\"\nhardware = \"nvidia-h200-hgx\"\n\
             [model]\ncompact = \"{}\"\ndtype = \"f32\"\n\
             [mesh]\ndp_replicate = 1\ndp_shard = 1\ntp = 1\nep = 1\n\
             [topology]\ndies_per_machine = 1\nmachines_per_supernode = 1\nsupernodes = 1\n\
             [train]\nseq_len = 32\nglobal_batch = {micro_batches}\nmicro_batch = 1\n\
             recompute = \"off\"\n\
             [fsdp]\nstrategy = \"fsdp2\"\nparam_dtype = \"bf16\"\nreduce_dtype = \"f32\"\n\
             [optimizer]\nkind = \"adamw\"\npreset = \"hyperparallel\"\n",
            model.display()
        );
        let dir = std::env::temp_dir().join(format!("hpfsdp-phases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("one-gpu-{micro_batches}.toml"));
        std::fs::write(&path, text).unwrap();
        ScenarioPlans::new(Scenario::load(&path).unwrap())
    }

    #[test]
    fn phases_follow_the_issue_order_per_micro_batch() {
        for micro_batches in [1, 2] {
            let plans = one_gpu(micro_batches);
            let profile = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
            let run = simulate_strategy(&plans, "fsdp2", &profile, &RunOptions::default()).unwrap();
            let program = &run.rank0_program;
            let phases = phase_of_ops(program);
            let mut sequence: Vec<Phase> = Vec::new();
            for (op, (phase, _)) in program.ops.iter().zip(&phases) {
                let name = op.name.as_deref().unwrap_or("");
                if name.ends_with(".fwd") {
                    assert_eq!(*phase, Phase::Forward, "{name}");
                } else if name.ends_with(".bwd") {
                    assert_eq!(*phase, Phase::Backward, "{name}");
                } else if op.category == Category::Optimizer {
                    assert_eq!(*phase, Phase::Optimizer, "{name}");
                }
                if sequence.last() != Some(phase) {
                    sequence.push(*phase);
                }
            }
            let mut want = Vec::new();
            for _ in 0..micro_batches {
                want.extend([Phase::Forward, Phase::Backward]);
            }
            want.push(Phase::Optimizer);
            assert_eq!(sequence, want);
            let [forward, backward, optimizer] = phase_device_s(&run.result, program).unwrap();
            assert!(forward > 0.0 && backward > forward && optimizer > 0.0);
            assert!(forward + backward + optimizer <= run.result.step_time_s());
        }
    }
}
