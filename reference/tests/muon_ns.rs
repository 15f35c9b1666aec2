//! Muon presets and Newton-Schulz: scenario mapping with key-naming errors, shape-fused
//! batched NS bitwise equal to per-matrix NS (wide, tall, square; every preset), per-matrix
//! (not per-stack) normalization, and adapters that split fused matrices.

use hpfsdp_plan::scenario::{Momentum, MuonOptions, OptimizerSection};
use hpfsdp_reference::muon::presets::{ASYM5_COEFFICIENTS, LEGACY_COEFFICIENTS};
use hpfsdp_reference::muon::{
    MatrixSplit, MomentumForm, MuonConfig, MuonError, MuonPreset, NormMode, NsKernel, OrthoJob,
    UpdateScale, newton_schulz, newton_schulz_batched, orthogonalize,
};
use hpfsdp_reference::{KeyedRng, Tensor};

fn randn(seed: u64, n: usize, std: f32) -> Vec<f32> {
    KeyedRng::new(seed, 7)
        .normal_range(0, n as u64)
        .into_iter()
        .map(|z| z * std)
        .collect()
}

fn section(preset: &str, muon: MuonOptions) -> OptimizerSection {
    OptimizerSection {
        preset: preset.into(),
        muon,
        ..OptimizerSection::default()
    }
}

#[test]
fn presets_carry_the_exact_constants() {
    let hp = MuonConfig::from_section(&section("hyperparallel", MuonOptions::default())).unwrap();
    assert_eq!(hp.ns.coefficients.len(), 5);
    assert_eq!(hp.ns.coefficients[0], [4.0848f32, -6.8946, 2.9270]);
    assert_eq!(hp.ns.coefficients[4], [2.8366f32, -3.0525, 1.2012]);
    assert_eq!(hp.ns.epsilon, 1e-10f32);
    assert_eq!(hp.ns.norm, NormMode::AddEps);
    assert_eq!(
        hp.momentum,
        MomentumForm::TwoCoefficient { m1: 0.95, m2: 0.95 }
    );
    assert!(hp.nesterov);
    assert_eq!((hp.lr, hp.weight_decay), (2e-2, 0.1));
    assert_eq!(hp.scale, UpdateScale::MatchedRmsInUpdate { rms: 0.2 });
    assert_eq!(hp.scale.factor(64, 256), 0.2 * 16.0);

    let kj = MuonConfig::preset(MuonPreset::KellerJordan);
    assert_eq!(kj.ns.coefficients, vec![[3.4445f32, -4.7750, 2.0315]; 5]);
    assert_eq!((kj.ns.epsilon, kj.lr, kj.weight_decay), (1e-7, 0.02, 0.0));
    assert_eq!(kj.scale.factor(256, 64), 2.0);
    assert_eq!(kj.scale.factor(64, 256), 1.0);

    let torch = MuonConfig::preset(MuonPreset::Torch);
    assert_eq!(torch.ns.norm, NormMode::ClampEps);
    assert_eq!((torch.lr, torch.weight_decay), (1e-3, 0.1));
    assert_eq!(torch.scale, UpdateScale::ShapeInLr);
    assert_eq!(
        MuonConfig::torch_match_rms_adamw().scale,
        UpdateScale::MatchedRmsInLr { rms: 0.2 }
    );
    let torch_rms = MuonConfig::from_section(&section(
        "torch",
        MuonOptions {
            matched_adamw_rms: Some(0.2),
            ..MuonOptions::default()
        },
    ))
    .unwrap();
    assert_eq!(torch_rms, MuonConfig::torch_match_rms_adamw());

    let ml = MuonConfig::preset(MuonPreset::Moonlight);
    assert_eq!(ml.momentum, MomentumForm::HeavyBall { mu: 0.95 });
    assert_eq!(ml.scale, UpdateScale::MatchedRmsInLr { rms: 0.2 });
    assert_eq!(LEGACY_COEFFICIENTS, [3.4445, -4.7750, 2.0315]);
    assert_eq!(ASYM5_COEFFICIENTS.len(), 5);
}

#[test]
fn overrides_apply() {
    let o = MuonOptions {
        lr: Some(0.5),
        momentum: Some(Momentum::Two([0.9, 0.8])),
        nesterov: Some(false),
        ns_steps: Some(7),
        ns_epsilon: Some(1e-6),
        ..MuonOptions::default()
    };
    let c = MuonConfig::from_section(&section("hyperparallel", o)).unwrap();
    assert_eq!(c.lr, 0.5);
    assert_eq!(
        c.momentum,
        MomentumForm::TwoCoefficient { m1: 0.9, m2: 0.8 }
    );
    assert!(!c.nesterov);
    assert_eq!(
        c.ns.coefficients.len(),
        5,
        "asym5 is sliced: 7 steps still run 5"
    );
    assert_eq!(c.ns.epsilon, 1e-6f32);
    let kj7 = MuonConfig::from_section(&section(
        "keller-jordan",
        MuonOptions {
            ns_steps: Some(7),
            ..MuonOptions::default()
        },
    ))
    .unwrap();
    assert_eq!(kj7.ns.coefficients.len(), 7);
    let custom = MuonConfig::from_section(&section(
        "custom",
        MuonOptions {
            coefficients: Some(vec![[2.0, -1.5, 0.5], [1.875, -1.25, 0.375]]),
            ..MuonOptions::default()
        },
    ))
    .unwrap();
    assert_eq!(
        custom.ns.coefficients,
        vec![[2.0f32, -1.5, 0.5], [1.875, -1.25, 0.375]]
    );
}

#[test]
fn bad_values_name_their_key() {
    let key = |preset: &str, o: MuonOptions| match MuonConfig::from_section(&section(preset, o)) {
        Err(MuonError::Config { key, .. }) => key,
        other => panic!("expected a config error, got {other:?}"),
    };
    let bad = MuonOptions::default;
    let cases: Vec<(&str, MuonOptions, &str)> = vec![
        ("nope", bad(), "preset"),
        (
            "hyperparallel",
            MuonOptions {
                lr: Some(f64::NAN),
                ..bad()
            },
            "lr",
        ),
        (
            "hyperparallel",
            MuonOptions {
                weight_decay: Some(-1.0),
                ..bad()
            },
            "weight_decay",
        ),
        (
            "hyperparallel",
            MuonOptions {
                momentum: Some(Momentum::One(1.5)),
                ..bad()
            },
            "momentum",
        ),
        (
            "torch",
            MuonOptions {
                momentum: Some(Momentum::Two([0.9, 0.9])),
                ..bad()
            },
            "momentum",
        ),
        (
            "hyperparallel",
            MuonOptions {
                ns_steps: Some(0),
                ..bad()
            },
            "ns_steps",
        ),
        (
            "hyperparallel",
            MuonOptions {
                ns_steps: Some(100),
                ..bad()
            },
            "ns_steps",
        ),
        (
            "hyperparallel",
            MuonOptions {
                ns_epsilon: Some(0.0),
                ..bad()
            },
            "ns_epsilon",
        ),
        (
            "keller-jordan",
            MuonOptions {
                matched_adamw_rms: Some(0.2),
                ..bad()
            },
            "matched_adamw_rms",
        ),
        ("custom", bad(), "coefficients"),
        (
            "custom",
            MuonOptions {
                coefficients: Some(vec![[1.0, 0.0, 0.0]]),
                ns_steps: Some(2),
                ..bad()
            },
            "coefficients",
        ),
        (
            "custom",
            MuonOptions {
                coefficients: Some(vec![[f64::INFINITY, 0.0, 0.0]]),
                ..bad()
            },
            "coefficients",
        ),
        (
            "moonlight",
            MuonOptions {
                coefficients: Some(vec![[1.0, 0.0, 0.0]]),
                ..bad()
            },
            "coefficients",
        ),
    ];
    for (preset, options, want) in cases {
        assert_eq!(key(preset, options.clone()), want, "{preset} {options:?}");
    }
}

#[test]
fn batched_newton_schulz_equals_per_matrix_bitwise() {
    for preset in [
        MuonPreset::HyperParallel,
        MuonPreset::KellerJordan,
        MuonPreset::Torch,
        MuonPreset::Moonlight,
    ] {
        let ns = MuonConfig::preset(preset).ns;
        for (rows, cols) in [(8, 24), (24, 8), (16, 16), (1, 5), (7, 1)] {
            let count = 5;
            // Matrices of very different norms: a per-stack norm would change every bit.
            let mut data = Vec::new();
            for k in 0..count {
                data.extend(randn(
                    k as u64 * 31 + rows as u64,
                    rows * cols,
                    10f32.powi(k as i32 - 2),
                ));
            }
            let batched = newton_schulz_batched(&data, count, rows, cols, &ns).unwrap();
            for k in 0..count {
                let m = Tensor::from_vec(
                    &[rows, cols],
                    data[k * rows * cols..(k + 1) * rows * cols].to_vec(),
                )
                .unwrap();
                let one = newton_schulz(&m, &ns).unwrap();
                let b = &batched[k * rows * cols..(k + 1) * rows * cols];
                assert!(
                    one.as_slice()
                        .iter()
                        .zip(b)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{preset:?} {rows}x{cols} matrix {k}"
                );
                assert!(one.as_slice().iter().all(|x| x.is_finite()));
            }
        }
    }
}

#[test]
fn newton_schulz_is_scale_invariant_and_orthogonalizes() {
    let ns = MuonConfig::preset(MuonPreset::HyperParallel).ns;
    let g = randn(3, 16 * 48, 1.0);
    let a = newton_schulz(&Tensor::from_vec(&[16, 48], g.clone()).unwrap(), &ns).unwrap();
    // Powers of two scale the bf16 norm exactly, so the output bits do not change.
    let g8: Vec<f32> = g.iter().map(|x| x * 8.0).collect();
    let b = newton_schulz(&Tensor::from_vec(&[16, 48], g8).unwrap(), &ns).unwrap();
    assert!(a.bit_eq(&b));
    // Rows of the output are nearly orthonormal: diag(X Xᵀ) near 1.
    let x = a.as_slice();
    for i in 0..16 {
        let d: f32 = x[i * 48..(i + 1) * 48].iter().map(|v| v * v).sum();
        assert!((0.8..1.2).contains(&d), "row {i}: {d}");
    }
    // Different presets give different bits.
    let kj = MuonConfig::preset(MuonPreset::KellerJordan).ns;
    let c = newton_schulz(&Tensor::from_vec(&[16, 48], g).unwrap(), &kj).unwrap();
    assert!(!a.bit_eq(&c));
}

#[test]
fn split_matrices_are_orthogonalized_part_by_part() {
    let cfg = MuonConfig::preset(MuonPreset::HyperParallel);
    // A fused [2, 12, 8] gate_up expert stack: each expert's gate and up halves separately.
    let data = randn(9, 2 * 12 * 8, 1.0);
    let split = MatrixSplit::GateUp;
    let out = orthogonalize(
        &cfg,
        &[OrthoJob {
            input: &data,
            count: 2,
            rows: 12,
            cols: 8,
            split: &split,
        }],
        NsKernel::Batched,
    )
    .unwrap();
    assert_eq!(out.ns_matrices, 4);
    let whole = MatrixSplit::Whole;
    for e in 0..2 {
        for half in 0..2 {
            // Gate/up half, transposed to [8, 6], orthogonalized and scaled by 0.2·sqrt(8).
            let mut t = vec![0.0f32; 6 * 8];
            for i in 0..6 {
                for j in 0..8 {
                    t[j * 6 + i] = data[e * 96 + (half * 6 + i) * 8 + j];
                }
            }
            let part = orthogonalize(
                &cfg,
                &[OrthoJob {
                    input: &t,
                    count: 1,
                    rows: 8,
                    cols: 6,
                    split: &whole,
                }],
                NsKernel::PerMatrix,
            )
            .unwrap();
            for i in 0..6 {
                for j in 0..8 {
                    assert_eq!(
                        out.updates[0][e * 96 + (half * 6 + i) * 8 + j].to_bits(),
                        part.updates[0][j * 6 + i].to_bits()
                    );
                }
            }
        }
    }
    // Flattening the experts into one matrix would differ.
    let flat = orthogonalize(
        &cfg,
        &[OrthoJob {
            input: &data,
            count: 1,
            rows: 24,
            cols: 8,
            split: &whole,
        }],
        NsKernel::Batched,
    )
    .unwrap();
    assert_ne!(flat.updates[0], out.updates[0]);
}
