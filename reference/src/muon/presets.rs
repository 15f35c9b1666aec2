//! Muon presets with the exact constants of the reference implementations, and the mapping of
//! a scenario's `[optimizer] preset` plus `[optimizer.muon]` overrides into one resolved
//! [`MuonConfig`].
//!
//! | preset | momentum | NS coefficients | normalization | update scale |
//! |---|---|---|---|---|
//! | `hyperparallel` | two-coefficient heavy ball `(0.95, 0.95)`, Nesterov | asym5 (5 per-step triples, `[:steps]`) | `X/(‖X‖+1e-10)` | `0.2·sqrt(max(m,n))` into the bf16 update |
//! | `keller-jordan` | EMA (lerp) 0.95, Nesterov | `(3.4445, -4.7750, 2.0315)` × steps | `X/(‖X‖+1e-7)` | `max(1, m/n)^0.5` into the bf16 update |
//! | `torch` | EMA (lerp) 0.95, Nesterov, torch's fused CPU kernels | legacy triple, `addmm_cpublas` order | `X/max(‖X‖, 1e-7)` | lr × `sqrt(max(1, m/n))` (`original`) or lr × `rms·sqrt(max(m,n))` (`match_rms_adamw`) |
//! | `moonlight` | heavy ball 0.95, Nesterov | legacy triple | `X/(‖X‖+1e-7)` | lr × `0.2·sqrt(max(m,n))` |
//! | `custom` | as `hyperparallel` | the given triples | as `hyperparallel` | as `hyperparallel` |
//!
//! The Gram polynomial's rounding ([`NsOpOrder`]): `hyperparallel`/`custom` round
//! `b·A + c·(A·A)` per operation, `keller-jordan` and `moonlight` the eager `b·A + (c·A)·A`,
//! `torch` rounds once per `torch.addmm` and sums every GEMM in the order of torch's native
//! CPU kernels (`addmm_cpublas`: bitwise `torch.optim.Muon` on x86-64 CPUs without AVX-512,
//! with `torch.backends.mkldnn.enabled = False`, and for matrices whose GEMMs stay at or
//! below 4096 multiply-adds; `addmm_onednn` is torch's dispatch on AVX-512 CPUs, see
//! [`super::torch_cpu`]); `[optimizer.muon] ns_order` overrides it.
//!
//! Decoupled weight decay `p ← p·(1 − lr·λ)` uses the unadjusted learning rate everywhere.

use hpfsdp_plan::optimizer_numerics::ElementwiseNumerics;
use hpfsdp_plan::scenario::{Momentum, MuonOptions, OptimizerSection};

use super::error::{MuonError, MuonResult};

/// HyperParallel's asym5 table (`_NS_ASYM5_COEFFS`, "5-step asymmetric NS (dion)").
pub const ASYM5_COEFFICIENTS: [[f64; 3]; 5] = [
    [4.0848, -6.8946, 2.9270],
    [3.9505, -6.3029, 2.6377],
    [3.7418, -5.5913, 2.3037],
    [2.8769, -3.1427, 1.2046],
    [2.8366, -3.0525, 1.2012],
];

/// The legacy constant quintic of Keller Jordan's Muon, torch.optim.Muon and Moonlight.
pub const LEGACY_COEFFICIENTS: [f64; 3] = [3.4445, -4.7750, 2.0315];

/// Largest accepted `ns_steps` (torch.optim.Muon rejects 100 and more).
pub const MAX_NS_STEPS: usize = 99;

/// The named presets of `[optimizer] preset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MuonPreset {
    /// HyperParallel's Muon (the default).
    HyperParallel,
    /// KellerJordan/Muon `SingleDeviceMuon`.
    KellerJordan,
    /// `torch.optim.Muon` (PyTorch >= 2.9).
    Torch,
    /// Moonlight's Muon (`toy_train.py`).
    Moonlight,
    /// HyperParallel's Muon with a user coefficient list.
    Custom,
}

impl MuonPreset {
    /// Parses a scenario preset name.
    pub fn parse(name: &str) -> MuonResult<MuonPreset> {
        match name {
            "hyperparallel" => Ok(MuonPreset::HyperParallel),
            "keller-jordan" => Ok(MuonPreset::KellerJordan),
            "torch" => Ok(MuonPreset::Torch),
            "moonlight" => Ok(MuonPreset::Moonlight),
            "custom" => Ok(MuonPreset::Custom),
            other => Err(MuonError::config(
                "optimizer",
                "preset",
                format!(
                    "unknown preset \"{other}\"; use hyperparallel, keller-jordan, torch, \
                     moonlight or custom"
                ),
            )),
        }
    }

    /// The scenario name.
    pub fn name(self) -> &'static str {
        match self {
            MuonPreset::HyperParallel => "hyperparallel",
            MuonPreset::KellerJordan => "keller-jordan",
            MuonPreset::Torch => "torch",
            MuonPreset::Moonlight => "moonlight",
            MuonPreset::Custom => "custom",
        }
    }

    /// Every preset, in documentation order.
    pub const ALL: [MuonPreset; 5] = [
        MuonPreset::HyperParallel,
        MuonPreset::KellerJordan,
        MuonPreset::Torch,
        MuonPreset::Moonlight,
        MuonPreset::Custom,
    ];
}

/// The momentum rule; every form keeps an f32 buffer of the gradient's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MomentumForm {
    /// HyperParallel: `u = g + m1·buf_old`, `buf = buf_old·m2 + g`, Nesterov `u = u·m1 + g`.
    TwoCoefficient {
        /// Coefficient of the update.
        m1: f64,
        /// Coefficient of the buffer.
        m2: f64,
    },
    /// Keller Jordan / torch: `buf.lerp_(g, 1-β)`, Nesterov `u = g.lerp(buf, β)`, else `u = buf`
    /// (ATen's two-branch lerp).
    Ema {
        /// β.
        beta: f64,
    },
    /// Moonlight: `buf = buf·μ + g`, Nesterov `u = g + μ·buf`, else `u = buf`.
    HeavyBall {
        /// μ.
        mu: f64,
    },
}

/// How the Newton-Schulz input is normalized by its Frobenius norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormMode {
    /// `X / (‖X‖ + ε)` (HyperParallel, Keller Jordan, Moonlight).
    AddEps,
    /// `X / max(‖X‖, ε)` (torch.optim.Muon's `clamp`).
    ClampEps,
}

/// How one Newton-Schulz iteration's polynomial is rounded (defined beside the scenario
/// loader, which validates `[optimizer.muon] ns_order`).
pub use hpfsdp_plan::optimizer_numerics::NsOpOrder;

/// The Newton-Schulz settings: one `(a, b, c)` triple per iteration, already expanded.
#[derive(Debug, Clone, PartialEq)]
pub struct NsConfig {
    /// Per-iteration coefficients, rounded to f32 (the kernels' scalar type).
    pub coefficients: Vec<[f32; 3]>,
    /// Normalization epsilon (f32).
    pub epsilon: f32,
    /// `+ε` or `max(·, ε)`.
    pub norm: NormMode,
    /// Rounding order of the Gram polynomial.
    pub order: NsOpOrder,
}

impl NsConfig {
    /// Iterations run.
    pub fn steps(&self) -> usize {
        self.coefficients.len()
    }
}

/// How the orthogonalized update is scaled by the matrix shape `(m, n)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UpdateScale {
    /// `rms·sqrt(max(m,n))` multiplied into the bf16 update (HyperParallel).
    MatchedRmsInUpdate {
        /// The AdamW update RMS to match (0.2).
        rms: f64,
    },
    /// `max(1, m/n)^0.5` multiplied into the bf16 update (Keller Jordan).
    ShapeInUpdate,
    /// Learning rate × `sqrt(max(1, m/n))` (torch `adjust_lr_fn="original"`, the default).
    ShapeInLr,
    /// Learning rate × `rms·sqrt(max(m,n))` (torch `"match_rms_adamw"`, Moonlight).
    MatchedRmsInLr {
        /// The AdamW update RMS to match (0.2).
        rms: f64,
    },
}

impl UpdateScale {
    /// The shape factor of an `m x n` matrix (in f64, as Python computes it).
    pub fn factor(&self, rows: usize, cols: usize) -> f64 {
        let (m, n) = (rows as f64, cols as f64);
        match *self {
            UpdateScale::MatchedRmsInUpdate { rms } | UpdateScale::MatchedRmsInLr { rms } => {
                libm::sqrt(m.max(n)) * rms
            }
            UpdateScale::ShapeInUpdate | UpdateScale::ShapeInLr => {
                libm::sqrt(if cols == 0 { 1.0 } else { (m / n).max(1.0) })
            }
        }
    }

    /// Whether the factor multiplies the bf16 update (true) or the learning rate (false).
    pub fn in_update(&self) -> bool {
        matches!(
            self,
            UpdateScale::MatchedRmsInUpdate { .. } | UpdateScale::ShapeInUpdate
        )
    }
}

/// A fully resolved Muon configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonConfig {
    /// The preset it started from.
    pub preset: MuonPreset,
    /// Learning rate.
    pub lr: f64,
    /// Decoupled weight decay λ (`p ← p·(1 − lr·λ)`).
    pub weight_decay: f64,
    /// Momentum rule.
    pub momentum: MomentumForm,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Newton-Schulz settings.
    pub ns: NsConfig,
    /// Shape scaling of the update.
    pub scale: UpdateScale,
    /// Element-wise arithmetic of the momentum and the parameter update: `torch_cpu_fma`
    /// (torch's fused `lerp_` and `add_(alpha)`) for the `torch` preset, `unfused` otherwise.
    pub elementwise: ElementwiseNumerics,
}

fn to_f32_triples(t: &[[f64; 3]]) -> Vec<[f32; 3]> {
    t.iter()
        .map(|&[a, b, c]| [a as f32, b as f32, c as f32])
        .collect()
}

impl MuonConfig {
    /// The preset's defaults (`custom` uses the asym5 table until coefficients are given).
    pub fn preset(preset: MuonPreset) -> MuonConfig {
        let legacy = to_f32_triples(&[LEGACY_COEFFICIENTS; 5]);
        match preset {
            MuonPreset::HyperParallel | MuonPreset::Custom => MuonConfig {
                preset,
                lr: 2e-2,
                weight_decay: 0.1,
                momentum: MomentumForm::TwoCoefficient { m1: 0.95, m2: 0.95 },
                nesterov: true,
                ns: NsConfig {
                    coefficients: to_f32_triples(&ASYM5_COEFFICIENTS),
                    epsilon: 1e-10,
                    norm: NormMode::AddEps,
                    order: NsOpOrder::GramSquaredFirst,
                },
                scale: UpdateScale::MatchedRmsInUpdate { rms: 0.2 },
                elementwise: ElementwiseNumerics::Unfused,
            },
            MuonPreset::KellerJordan => MuonConfig {
                preset,
                lr: 0.02,
                weight_decay: 0.0,
                momentum: MomentumForm::Ema { beta: 0.95 },
                nesterov: true,
                ns: NsConfig {
                    coefficients: legacy,
                    epsilon: 1e-7,
                    norm: NormMode::AddEps,
                    order: NsOpOrder::ScaleThenMultiply,
                },
                scale: UpdateScale::ShapeInUpdate,
                elementwise: ElementwiseNumerics::Unfused,
            },
            MuonPreset::Torch => MuonConfig {
                preset,
                lr: 1e-3,
                weight_decay: 0.1,
                momentum: MomentumForm::Ema { beta: 0.95 },
                nesterov: true,
                ns: NsConfig {
                    coefficients: legacy,
                    epsilon: 1e-7,
                    norm: NormMode::ClampEps,
                    order: NsOpOrder::AddmmCpublas,
                },
                scale: UpdateScale::ShapeInLr,
                elementwise: ElementwiseNumerics::TorchCpuFma,
            },
            MuonPreset::Moonlight => MuonConfig {
                preset,
                lr: 1e-3,
                weight_decay: 0.1,
                momentum: MomentumForm::HeavyBall { mu: 0.95 },
                nesterov: true,
                ns: NsConfig {
                    coefficients: legacy,
                    epsilon: 1e-7,
                    norm: NormMode::AddEps,
                    order: NsOpOrder::ScaleThenMultiply,
                },
                scale: UpdateScale::MatchedRmsInLr { rms: 0.2 },
                elementwise: ElementwiseNumerics::Unfused,
            },
        }
    }

    /// `torch` preset with `adjust_lr_fn = "match_rms_adamw"` (rms 0.2).
    pub fn torch_match_rms_adamw() -> MuonConfig {
        MuonConfig {
            scale: UpdateScale::MatchedRmsInLr { rms: 0.2 },
            ..MuonConfig::preset(MuonPreset::Torch)
        }
    }

    /// Resolves a scenario's `[optimizer]` section (preset plus `[optimizer.muon]` overrides).
    pub fn from_section(section: &OptimizerSection) -> MuonResult<MuonConfig> {
        let preset = MuonPreset::parse(&section.preset)?;
        MuonConfig::resolve(preset, &section.muon)
    }

    /// Applies `[optimizer.muon]` overrides to a preset. Every bad value is reported with its
    /// key. For `torch`, giving `matched_adamw_rms` selects `adjust_lr_fn="match_rms_adamw"`.
    pub fn resolve(preset: MuonPreset, o: &MuonOptions) -> MuonResult<MuonConfig> {
        let mut cfg = MuonConfig::preset(preset);
        if let Some(lr) = o.lr {
            cfg.lr = finite_nonneg("lr", lr)?;
        }
        if let Some(wd) = o.weight_decay {
            cfg.weight_decay = finite_nonneg("weight_decay", wd)?;
        }
        resolve_momentum(&mut cfg, preset, o)?;
        if let Some(n) = o.nesterov {
            cfg.nesterov = n;
        }
        resolve_numerics(&mut cfg, preset, o)?;
        if let Some(eps) = o.ns_epsilon {
            if !(eps.is_finite() && eps > 0.0 && (eps as f32) > 0.0) {
                return Err(MuonError::config(
                    S,
                    "ns_epsilon",
                    format!("{eps} is not a finite value > 0 representable in f32"),
                ));
            }
            cfg.ns.epsilon = eps as f32;
        }
        resolve_scale(&mut cfg, o)?;
        resolve_coefficients(&mut cfg, preset, o)?;
        Ok(cfg)
    }
}

/// The scenario section every Muon key error names.
const S: &str = "optimizer.muon";

/// `v` when finite and >= 0, else an error naming `[optimizer.muon] key`.
fn finite_nonneg(key: &'static str, v: f64) -> MuonResult<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(MuonError::config(
            S,
            key,
            format!("{v} is not a finite value >= 0"),
        ))
    }
}

/// A momentum coefficient in [0, 1), else an error naming `[optimizer.muon] key`.
fn coef(key: &'static str, m: f64) -> MuonResult<f64> {
    if m.is_finite() && (0.0..1.0).contains(&m) {
        Ok(m)
    } else {
        Err(MuonError::config(
            S,
            key,
            format!("momentum coefficient {m} is outside [0, 1)"),
        ))
    }
}

/// `momentum`: one or two coefficients, in the preset's momentum form.
fn resolve_momentum(cfg: &mut MuonConfig, preset: MuonPreset, o: &MuonOptions) -> MuonResult<()> {
    if let Some(m) = &o.momentum {
        cfg.momentum = match (m, cfg.momentum) {
            (Momentum::One(m), MomentumForm::TwoCoefficient { .. }) => {
                let m = coef("momentum", *m)?;
                MomentumForm::TwoCoefficient { m1: m, m2: m }
            }
            (Momentum::Two([m1, m2]), MomentumForm::TwoCoefficient { .. }) => {
                MomentumForm::TwoCoefficient {
                    m1: coef("momentum", *m1)?,
                    m2: coef("momentum", *m2)?,
                }
            }
            (Momentum::One(m), MomentumForm::Ema { .. }) => MomentumForm::Ema {
                beta: coef("momentum", *m)?,
            },
            (Momentum::One(m), MomentumForm::HeavyBall { .. }) => MomentumForm::HeavyBall {
                mu: coef("momentum", *m)?,
            },
            (Momentum::Two(_), _) => {
                return Err(MuonError::config(
                    S,
                    "momentum",
                    format!(
                        "the two-coefficient form [m1, m2] exists only for the hyperparallel \
                         and custom presets; preset {} takes one coefficient",
                        preset.name()
                    ),
                ));
            }
        };
    }
    Ok(())
}

/// `numerics` (element-wise rounding form) and `ns_order` (Newton-Schulz rounding order).
fn resolve_numerics(cfg: &mut MuonConfig, preset: MuonPreset, o: &MuonOptions) -> MuonResult<()> {
    if let Some(name) = &o.numerics {
        let form = ElementwiseNumerics::parse(name).ok_or_else(|| {
            let names: Vec<&str> = ElementwiseNumerics::ALL.iter().map(|v| v.name()).collect();
            MuonError::config(
                S,
                "numerics",
                format!("unknown form \"{name}\"; use one of {}", names.join(", ")),
            )
        })?;
        if form == ElementwiseNumerics::TorchCpuFma
            && !matches!(cfg.momentum, MomentumForm::Ema { .. })
        {
            return Err(MuonError::config(
                S,
                "numerics",
                format!(
                    "torch_cpu_fma describes torch's lerp_ momentum (presets torch and \
                     keller-jordan); preset {} uses another momentum form: remove the key",
                    preset.name()
                ),
            ));
        }
        cfg.elementwise = form;
    }
    if let Some(name) = &o.ns_order {
        cfg.ns.order = NsOpOrder::parse(name).ok_or_else(|| {
            let names: Vec<&str> = NsOpOrder::ALL.iter().map(|v| v.name()).collect();
            MuonError::config(
                S,
                "ns_order",
                format!("unknown order \"{name}\"; use one of {}", names.join(", ")),
            )
        })?;
    }
    Ok(())
}

/// `matched_adamw_rms`: the update-scale mode that matches AdamW's RMS.
fn resolve_scale(cfg: &mut MuonConfig, o: &MuonOptions) -> MuonResult<()> {
    if let Some(rms) = o.matched_adamw_rms {
        let rms = finite_nonneg("matched_adamw_rms", rms)?;
        cfg.scale = match cfg.scale {
            UpdateScale::MatchedRmsInUpdate { .. } => UpdateScale::MatchedRmsInUpdate { rms },
            UpdateScale::MatchedRmsInLr { .. } | UpdateScale::ShapeInLr => {
                UpdateScale::MatchedRmsInLr { rms }
            }
            UpdateScale::ShapeInUpdate => {
                return Err(MuonError::config(
                    S,
                    "matched_adamw_rms",
                    "the keller-jordan preset scales by max(1, m/n)^0.5 and has no RMS \
                     matching; remove the key or use the hyperparallel or moonlight preset",
                ));
            }
        };
    }
    Ok(())
}

/// `ns_steps` and `coefficients`: the Newton-Schulz coefficient table (the custom list, or the preset's table sliced or repeated).
fn resolve_coefficients(
    cfg: &mut MuonConfig,
    preset: MuonPreset,
    o: &MuonOptions,
) -> MuonResult<()> {
    let steps = match o.ns_steps {
        Some(0) => {
            return Err(MuonError::config(S, "ns_steps", "0 steps; use 1 or more"));
        }
        Some(s) if s > MAX_NS_STEPS => {
            return Err(MuonError::config(
                S,
                "ns_steps",
                format!("{s} steps; use at most {MAX_NS_STEPS}"),
            ));
        }
        s => s,
    };
    match preset {
        MuonPreset::Custom => {
            let Some(list) = &o.coefficients else {
                return Err(MuonError::config(
                    S,
                    "coefficients",
                    "preset custom needs coefficients = [[a, b, c], ...]",
                ));
            };
            if let Some((i, t)) = list
                .iter()
                .enumerate()
                .find(|(_, t)| t.iter().any(|x| !x.is_finite()))
            {
                return Err(MuonError::config(
                    S,
                    "coefficients",
                    format!("triple {i} {t:?} is not finite"),
                ));
            }
            let steps = steps.unwrap_or(list.len());
            if steps > list.len() || list.is_empty() {
                return Err(MuonError::config(
                    S,
                    "coefficients",
                    format!(
                        "ns_steps={steps} exceeds the {} provided coefficient groups",
                        list.len()
                    ),
                ));
            }
            cfg.ns.coefficients = to_f32_triples(&list[..steps]);
        }
        _ => {
            if o.coefficients.is_some() {
                return Err(MuonError::config(
                    S,
                    "coefficients",
                    format!(
                        "coefficients are only read with preset = \"custom\" (preset is {})",
                        preset.name()
                    ),
                ));
            }
            if let Some(steps) = steps {
                cfg.ns.coefficients = if preset == MuonPreset::HyperParallel {
                    // HyperParallel slices the asym5 table: more than 5 steps still runs 5.
                    to_f32_triples(&ASYM5_COEFFICIENTS[..steps.min(5)])
                } else {
                    to_f32_triples(&vec![LEGACY_COEFFICIENTS; steps])
                };
            }
        }
    }
    Ok(())
}
