//! The reference optimizers against golden vectors produced by real PyTorch (torch 2.15.0 on
//! an AVX-512 x86 CPU, `tools/torch_golden.py` and, for `adamw_cancel.toml`,
//! `tools/torch_cpu_paths_golden.py`; the files record the version and CPU):
//!
//! - AdamW `torch_cpu_fma` equals `torch.optim.AdamW` (`_single_tensor_adam`; its foreach path
//!   gives the same bits) bitwise in both moments (f32 and f64), and in the parameter wherever
//!   torch's `sqrt` was correctly rounded; where it was not, the same operation order fed
//!   torch's root reproduces torch's parameter bitwise, so the square root is the only
//!   difference left, and one step then differs by at most `2^(4−P)·|update| + 1 ulp` of the
//!   parameter ([`param_bound`]), also where weight decay and the update nearly cancel. The
//!   default `unfused` form is shown to differ (it is platform-independent, not torch's CPU
//!   kernels).
//! - The `torch` preset's Newton-Schulz (`addmm_cpublas`, torch's native CPU GEMM orders)
//!   equals `torch.optim.Muon`'s `_zeropower_via_newtonschulz` bitwise on every golden (all
//!   GEMMs here are at most 4096 multiply-adds: torch's native kernels even on AVX-512; the
//!   larger shapes and the oneDNN path are in `torch_cpu_paths.rs`); the `addmm` operations
//!   are closer to exact Newton-Schulz than the eager Keller-Jordan order (goldens and 20
//!   seeded Gaussian matrices).
//! - The `torch` Muon preset (EMA momentum and update as torch's fused CPU kernels,
//!   `addmm_cpublas` Newton-Schulz) equals `torch.optim.Muon` bitwise, stage by stage and over
//!   3 chained steps; the unfused element-wise form is shown to differ.
//!
//! Every stage is fed torch's inputs, so one stage's difference does not hide another's.

use std::path::PathBuf;

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::bf16::quantize_bf16 as q;
use hpfsdp_reference::muon::update::{LrScale, apply_update, momentum_step};
use hpfsdp_reference::muon::{MuonConfig, MuonPreset, NsOpOrder, UpdateScale, newton_schulz};
use hpfsdp_reference::optim::{AdamW, ElementwiseNumerics};
use hpfsdp_reference::{KeyedRng, Real, Tensor};
use toml::Value;

fn load(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with tools/torch_golden.py)",
            path.display()
        )
    });
    toml::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
fn cases(v: &Value) -> &[Value] {
    v["case"].as_array().expect("[[case]] entries")
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("hex string"), 16).expect("hex digits")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| f32::from_bits(hex(x) as u32))
        .collect()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| f64::from_bits(hex(x)))
        .collect()
}

/// bf16 bit patterns widened to f32 (exact).
fn bf16s(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| f32::from_bits((hex(x) as u32) << 16))
        .collect()
}

fn float(v: &Value) -> f64 {
    v.as_float().expect("float")
}

/// Distance in units in the last place between two same-sign-or-zero floats of one type,
/// through the ordered integer mapping of their bit patterns.
fn ulps<T: Real>(a: T, b: T) -> u64 {
    fn ordered(bits: u64, sign: u64) -> i128 {
        if bits & sign != 0 {
            -((bits & !sign) as i128)
        } else {
            bits as i128
        }
    }
    let sign = if T::NAME == "f32" { 1 << 31 } else { 1 << 63 };
    (ordered(a.to_bits_u64(), sign) - ordered(b.to_bits_u64(), sign)).unsigned_abs() as u64
}

/// bf16 ulps between two bf16 values held in f32.
fn bf16_ulps(a: f32, b: f32) -> u64 {
    ulps(a, b) >> 16
}

fn adamw_of(case: &Value, numerics: ElementwiseNumerics) -> AdamW {
    let betas = case["betas"].as_array().unwrap();
    AdamW {
        lr: float(&case["lr"]),
        beta1: float(&betas[0]),
        beta2: float(&betas[1]),
        eps: float(&case["eps"]),
        weight_decay: float(&case["weight_decay"]),
        numerics,
    }
}

/// Per-step comparison of one AdamW form against torch.
#[derive(Debug, Default)]
struct AdamwTally {
    moments_bitwise: bool,
    sqrt_not_correctly_rounded: usize,
    param_bitwise_where_sqrt_agrees: bool,
    /// Our own chain from the initial parameter, where torch's root ever differed (reported).
    param_max_ulps_where_sqrt_differs: u64,
    torch_order_with_torch_sqrt_bitwise: bool,
    /// One step from torch's previous parameter, where torch's root differs: within
    /// [`param_bound`] everywhere.
    step_within_bound: bool,
    /// Largest `|p − p_torch| / |update|` of those steps.
    step_max_diff_over_update: f64,
    /// Largest `|p − p_torch|` of those steps in ulps of the parameter.
    step_max_ulps: u64,
}

/// The unit in the last place of `x` (a value of `T`, held in f64).
fn ulp_of<T: Real>(x: f64) -> f64 {
    let (digits, min_exp) = if T::NAME == "f32" {
        (24, -126)
    } else {
        (53, -1022)
    };
    let e = if x == 0.0 {
        min_exp
    } else {
        (libm::floor(libm::log2(x.abs())) as i32).max(min_exp)
    };
    libm::pow(2.0, f64::from(e - (digits - 1)))
}

/// What one step may change where torch's square root is 1 ulp off the correctly rounded one
/// (everything else equal and bitwise, as the moments and the order check show). With `P` the
/// precision (24, 53): the root differs by at most `2^(1−P)` relatively; `sqrt(v)/bc2` and
/// `+ eps` each add at most one rounding on either side (`eps > 0` only shrinks a relative
/// difference), so the denominators differ by at most `6·2^−P`, and the update
/// `(−step_size·m)/denom` by at most `8·2^−P` of itself; the final `p·(1 − lr·wd) + u` adds
/// one rounding on either side. Hence `|p − p_torch| ≤ 2^(4−P)·|u| + ulp(p)` (twice the
/// first-order term, for the second-order ones). Relative to the update, not to the
/// parameter: where weight decay and the update nearly cancel, `p` is tiny and the same
/// difference is hundreds of its ulps.
fn param_bound<T: Real>(update: f64, p: f64, p_torch: f64) -> f64 {
    let precision = if T::NAME == "f32" { 24 } else { 53 };
    libm::pow(2.0, f64::from(4 - precision)) * update.abs()
        + ulp_of::<T>(p.abs().max(p_torch.abs()))
}

/// torch's step inputs and outputs at one step of one case.
struct TorchStep<T> {
    param_in: Vec<T>,
    param: Vec<T>,
    exp_avg: Vec<T>,
    exp_avg_sq: Vec<T>,
    sqrt: Vec<T>,
}

fn torch_step<T>(step: &Value, param_in: Vec<T>, read: fn(&Value) -> Vec<T>) -> TorchStep<T> {
    TorchStep {
        param_in,
        param: read(&step["param"]),
        exp_avg: read(&step["exp_avg"]),
        exp_avg_sq: read(&step["exp_avg_sq"]),
        sqrt: read(&step["sqrt_exp_avg_sq"]),
    }
}

/// One step `k` (1-based) of `opt` from torch's input parameter and our own previous moments
/// `m`, `v` (updated in place), tallied against torch.
fn adamw_step_vs_torch<T: Real>(
    opt: &AdamW,
    k: u64,
    grad: &[T],
    m: &mut [T],
    v: &mut [T],
    torch: &TorchStep<T>,
    sqrt_ever_differed: &mut [bool],
    t: &mut AdamwTally,
) {
    let mut p = torch.param_in.clone();
    opt.update(k, &mut p, grad, m, v);
    let n = p.len();
    t.moments_bitwise &= (0..n).all(|i| {
        m[i].to_bits_u64() == torch.exp_avg[i].to_bits_u64()
            && v[i].to_bits_u64() == torch.exp_avg_sq[i].to_bits_u64()
    });
    // The same scalars and order as AdamW::update, with torch's root in the denominator.
    let s = |x: f64| T::from_f64(x);
    let (lr, wd, b1, b2, eps) = (opt.lr, opt.weight_decay, opt.beta1, opt.beta2, opt.eps);
    let step_size = s(lr / (1.0 - libm::pow(b1, k as f64)));
    let bc2_sqrt = s(libm::sqrt(1.0 - libm::pow(b2, k as f64)));
    for i in 0..n {
        let denom = torch.sqrt[i] / bc2_sqrt + s(eps);
        let want = torch.param_in[i] * s(1.0 - lr * wd) + -step_size * torch.exp_avg[i] / denom;
        t.torch_order_with_torch_sqrt_bitwise &= want.to_bits_u64() == torch.param[i].to_bits_u64();
        if torch.exp_avg_sq[i].sqrt().to_bits_u64() == torch.sqrt[i].to_bits_u64() {
            t.param_bitwise_where_sqrt_agrees &= p[i].to_bits_u64() == torch.param[i].to_bits_u64();
            continue;
        }
        sqrt_ever_differed[i] = true;
        t.sqrt_not_correctly_rounded += 1;
        let update = (-step_size * m[i] / (v[i].sqrt() / bc2_sqrt + s(eps))).to_f64();
        let (ours, theirs) = (p[i].to_f64(), torch.param[i].to_f64());
        let diff = (ours - theirs).abs();
        t.step_within_bound &= diff <= param_bound::<T>(update, ours, theirs);
        if update != 0.0 {
            t.step_max_diff_over_update = t.step_max_diff_over_update.max(diff / update.abs());
        }
        t.step_max_ulps = t.step_max_ulps.max(ulps(p[i], torch.param[i]));
    }
}

fn fresh_tally() -> AdamwTally {
    AdamwTally {
        moments_bitwise: true,
        param_bitwise_where_sqrt_agrees: true,
        torch_order_with_torch_sqrt_bitwise: true,
        step_within_bound: true,
        ..AdamwTally::default()
    }
}

/// Runs `numerics` over a case's steps in type `T`: each step from torch's previous parameter
/// (tallied), and our own chain from the initial parameter (reported in ulps).
fn run_adamw<T: Real>(
    case: &Value,
    numerics: ElementwiseNumerics,
    read: fn(&Value) -> Vec<T>,
) -> AdamwTally {
    let opt = adamw_of(case, numerics);
    let mut own_p = read(&case["param"]);
    let n = own_p.len();
    let (mut m, mut v) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    let (mut own_m, mut own_v) = (m.clone(), v.clone());
    let mut torch_prev_p = own_p.clone();
    let mut sqrt_ever_differed = vec![false; n];
    let mut t = fresh_tally();
    let grads = case["grads"].as_array().unwrap();
    for (k, (g, step)) in grads
        .iter()
        .zip(case["step"].as_array().unwrap())
        .enumerate()
    {
        let g = read(g);
        let torch = torch_step(step, torch_prev_p, read);
        adamw_step_vs_torch(
            &opt,
            (k + 1) as u64,
            &g,
            &mut m,
            &mut v,
            &torch,
            &mut sqrt_ever_differed,
            &mut t,
        );
        opt.update((k + 1) as u64, &mut own_p, &g, &mut own_m, &mut own_v);
        for i in 0..n {
            if sqrt_ever_differed[i] {
                t.param_max_ulps_where_sqrt_differs = t
                    .param_max_ulps_where_sqrt_differs
                    .max(ulps(own_p[i], torch.param[i]));
            } else {
                t.param_bitwise_where_sqrt_agrees &=
                    own_p[i].to_bits_u64() == torch.param[i].to_bits_u64();
            }
        }
        torch_prev_p = torch.param;
    }
    t
}

fn run_adamw_case(case: &Value, numerics: ElementwiseNumerics) -> AdamwTally {
    match case["dtype"].as_str() {
        Some("f32") => run_adamw::<f32>(case, numerics, f32s),
        Some("f64") => run_adamw::<f64>(case, numerics, f64s),
        other => panic!("dtype {other:?}"),
    }
}

fn assert_adamw_tally(name: &str, t: &AdamwTally) {
    assert!(
        t.moments_bitwise,
        "{name}: exp_avg/exp_avg_sq not bitwise: {t:?}"
    );
    assert!(
        t.torch_order_with_torch_sqrt_bitwise,
        "{name}: torch's order with torch's root does not reproduce torch: {t:?}"
    );
    assert!(t.param_bitwise_where_sqrt_agrees, "{name}: {t:?}");
    assert!(
        t.step_within_bound,
        "{name}: a step beyond the update-relative bound: {t:?}"
    );
}

#[test]
fn adamw_torch_cpu_fma_matches_torch_bitwise_up_to_its_sqrt() {
    let g = load("adamw.toml");
    let mut sqrt_off = 0;
    for case in cases(&g) {
        let name = case["name"].as_str().unwrap();
        let t = run_adamw_case(case, ElementwiseNumerics::TorchCpuFma);
        eprintln!("{name}: torch_cpu_fma {t:?}");
        assert_adamw_tally(name, &t);
        sqrt_off += t.sqrt_not_correctly_rounded;
    }
    eprintln!("torch sqrt results not correctly rounded over all AdamW goldens: {sqrt_off}");
}

/// Packed hex bit patterns (`adamw_cancel.toml`) of either float type.
fn packed<T: Real>(v: &Value) -> Vec<T> {
    let s = v.as_str().expect("packed hex string");
    let digits = if T::NAME == "f32" { 8 } else { 16 };
    (0..s.len() / digits)
        .map(|i| {
            let bits = u64::from_str_radix(&s[i * digits..(i + 1) * digits], 16).expect("hex");
            if T::NAME == "f32" {
                T::from_f32(f32::from_bits(bits as u32))
            } else {
                T::from_f64(f64::from_bits(bits))
            }
        })
        .collect()
}

fn run_adamw_cancel<T: Real>(g: &Value, case: &Value) -> AdamwTally {
    let opt = adamw_of(g, ElementwiseNumerics::TorchCpuFma);
    let grads: Vec<Vec<T>> = case["grads"]
        .as_array()
        .unwrap()
        .iter()
        .map(packed)
        .collect();
    let n = grads[0].len();
    let (mut m, mut v) = (vec![T::ZERO; n], vec![T::ZERO; n]);
    let mut ever = vec![false; n];
    let mut t = fresh_tally();
    for (k, (grad, step)) in grads
        .iter()
        .zip(case["step"].as_array().unwrap())
        .enumerate()
    {
        let torch = torch_step(step, packed(&step["param_in"]), packed);
        adamw_step_vs_torch(
            &opt,
            (k + 1) as u64,
            grad,
            &mut m,
            &mut v,
            &torch,
            &mut ever,
            &mut t,
        );
    }
    t
}

/// Parameters set before every step so that weight decay and the update nearly cancel (the
/// regime where the difference torch's root makes is hundreds of the parameter's ulps): the
/// moments are bitwise, the parameter is bitwise wherever torch's root is correctly rounded,
/// and within the update-relative [`param_bound`] everywhere else.
#[test]
fn adamw_bound_holds_where_decay_and_update_cancel() {
    let g = load("adamw_cancel.toml");
    let mut ulps_seen = Vec::new();
    for case in cases(&g) {
        let dtype = case["dtype"].as_str().unwrap();
        assert!(
            case["foreach_bitwise_equal"].as_bool().unwrap(),
            "{dtype}: torch's foreach AdamW differed from its single-tensor path"
        );
        let t = match dtype {
            "f32" => run_adamw_cancel::<f32>(&g, case),
            "f64" => run_adamw_cancel::<f64>(&g, case),
            other => panic!("dtype {other:?}"),
        };
        eprintln!("cancel-{dtype}: {t:?}");
        assert_adamw_tally(dtype, &t);
        assert!(
            t.sqrt_not_correctly_rounded > 0,
            "{dtype}: torch's root never differed"
        );
        ulps_seen.push(t.step_max_ulps);
    }
    assert!(
        ulps_seen.iter().any(|&u| u > 2),
        "the inputs do not reach the cancelling regime (max ulps {ulps_seen:?})"
    );
}

#[test]
fn adamw_unfused_is_not_torchs_cpu_kernels() {
    let g = load("adamw.toml");
    let differing: Vec<&str> = cases(&g)
        .iter()
        .filter(|c| !run_adamw_case(c, ElementwiseNumerics::Unfused).moments_bitwise)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    eprintln!("unfused moments differ from torch in: {differing:?}");
    assert!(
        !differing.is_empty(),
        "the unfused form matched torch's fused kernels on every golden: the goldens do not \
         exercise the fusion"
    );
}

#[test]
fn sqrt_measurement_is_recorded() {
    let g = load("sqrt.toml");
    let m = g["measurement"].as_array().unwrap();
    let big = m
        .iter()
        .max_by_key(|r| r["elements"].as_integer().unwrap())
        .unwrap();
    let off = big["f32_not_correctly_rounded"].as_integer().unwrap();
    eprintln!(
        "torch {} ({}): f32 sqrt not correctly rounded {off} of {}, max {} ulp; f64 {} of {}",
        g["torch_version"],
        g["cpu_capability"],
        big["elements"],
        big["f32_max_ulp"],
        big["f64_not_correctly_rounded"],
        big["f64_sampled"]
    );
    assert!(big["f32_max_ulp"].as_integer().unwrap() <= 1);
}

/// torch.optim.Muon's configuration of a case (the `torch` preset with the case's values).
fn torch_muon(case: &Value) -> MuonConfig {
    let mut cfg = MuonConfig::preset(MuonPreset::Torch);
    cfg.lr = float(&case["lr"]);
    cfg.weight_decay = float(&case["weight_decay"]);
    if case["adjust_lr_fn"].as_str() == Some("match_rms_adamw") {
        cfg.scale = UpdateScale::MatchedRmsInLr { rms: 0.2 };
    }
    cfg
}

/// Newton-Schulz of one torch input in `order`: the output and its largest bf16-ulp distance
/// to torch's output, with the count of bitwise-equal elements.
fn ns_against(
    cfg: &MuonConfig,
    order: NsOpOrder,
    shape: (usize, usize),
    input: &[f32],
    want: &[f32],
) -> (Vec<f32>, u64, usize) {
    let mut ns = cfg.ns.clone();
    ns.order = order;
    let x = Tensor::from_vec(&[shape.0, shape.1], input.to_vec()).unwrap();
    let out = newton_schulz(&x, &ns).unwrap().as_slice().to_vec();
    let max = out
        .iter()
        .zip(want)
        .map(|(&a, &b)| bf16_ulps(a, b))
        .max()
        .unwrap_or(0);
    let equal = out
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    (out, max, equal)
}

/// Exact (f64, unrounded) Newton-Schulz with the same coefficients and normalization.
fn exact_ns(
    input: &[f32],
    rows: usize,
    cols: usize,
    coefficients: &[[f32; 3]],
    eps: f64,
) -> Vec<f64> {
    let tall = rows > cols;
    let (r, c) = if tall { (cols, rows) } else { (rows, cols) };
    let mut x = vec![0.0f64; r * c];
    for i in 0..rows {
        for j in 0..cols {
            let v = f64::from(input[i * cols + j]);
            if tall {
                x[j * c + i] = v;
            } else {
                x[i * c + j] = v;
            }
        }
    }
    let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(eps);
    x.iter_mut().for_each(|v| *v /= norm);
    let mm = |a: &[f64], b: &[f64], n: usize, k: usize, m: usize, bt: bool| -> Vec<f64> {
        let mut o = vec![0.0; n * m];
        for i in 0..n {
            for j in 0..m {
                o[i * m + j] = (0..k)
                    .map(|l| a[i * k + l] * if bt { b[j * k + l] } else { b[l * m + j] })
                    .sum();
            }
        }
        o
    };
    for &[a, b, cc] in coefficients {
        let (a, b, cc) = (f64::from(a), f64::from(b), f64::from(cc));
        let gram = mm(&x, &x, r, c, r, true);
        let sq = mm(&gram, &gram, r, r, r, false);
        let poly: Vec<f64> = gram.iter().zip(&sq).map(|(g, s)| b * g + cc * s).collect();
        let bx = mm(&poly, &x, r, r, c, false);
        x = x.iter().zip(&bx).map(|(v, w)| a * v + w).collect();
    }
    if tall {
        let mut out = vec![0.0; rows * cols];
        for i in 0..r {
            for j in 0..c {
                out[j * r + i] = x[i * c + j];
            }
        }
        out
    } else {
        x
    }
}

fn distance(a: &[f32], exact: &[f64]) -> f64 {
    a.iter()
        .zip(exact)
        .map(|(&x, &e)| (f64::from(x) - e).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// The `torch` preset (`addmm_cpublas`) equals torch bitwise on every golden (these GEMMs are
/// all at most 4096 multiply-adds, so torch ran its native kernels on this AVX-512 CPU too);
/// the ascending `addmm` order is reported, and the `addmm` operations (one rounding per
/// `torch.addmm`) are closer to exact Newton-Schulz than the eager form.
#[test]
fn newton_schulz_torch_preset_matches_torch_muon() {
    let g = load("ns.toml");
    let base = MuonConfig::preset(MuonPreset::Torch);
    assert_eq!(
        base.ns.order,
        NsOpOrder::AddmmCpublas,
        "the torch preset's order"
    );
    let (mut dist_addmm, mut dist_eager) = (0.0, 0.0);
    for case in cases(&g) {
        let name = case["name"].as_str().unwrap();
        let shape = case["shape"].as_array().unwrap();
        let (rows, cols) = (
            shape[0].as_integer().unwrap() as usize,
            shape[1].as_integer().unwrap() as usize,
        );
        let steps = case["ns_steps"].as_integer().unwrap() as usize;
        let mut cfg = base.clone();
        cfg.ns.coefficients.truncate(steps);
        assert_eq!(cfg.ns.coefficients.len(), steps);
        let (input, want) = (bf16s(&case["input"]), bf16s(&case["output"]));
        let (_, max_t, eq_t) = ns_against(&cfg, base.ns.order, (rows, cols), &input, &want);
        assert_eq!(
            eq_t,
            want.len(),
            "{name}: torch preset {max_t} bf16 ulps from torch"
        );
        let (addmm, max_a, eq_a) = ns_against(&cfg, NsOpOrder::Addmm, (rows, cols), &input, &want);
        let (eager, max_e, eq_e) = ns_against(
            &cfg,
            NsOpOrder::ScaleThenMultiply,
            (rows, cols),
            &input,
            &want,
        );
        let exact = exact_ns(&input, rows, cols, &cfg.ns.coefficients, 1e-7);
        let (da, de) = (distance(&addmm, &exact), distance(&eager, &exact));
        eprintln!(
            "{name}: addmm {eq_a}/{} bitwise, max {max_a} bf16 ulp; eager {eq_e}/{} bitwise, \
             max {max_e} ulp; distance to exact NS: addmm {da:.3e}, eager {de:.3e}, torch {:.3e}",
            want.len(),
            want.len(),
            distance(&want, &exact)
        );
        dist_addmm += da;
        dist_eager += de;
    }
    eprintln!(
        "summed distance to exact Newton-Schulz: eager / addmm = {:.2}",
        dist_eager / dist_addmm
    );
    assert!(
        dist_addmm < dist_eager,
        "addmm is the closer order to exact NS"
    );
}

/// Stage-by-stage counts of one Muon case against torch (each stage fed torch's inputs).
#[derive(Debug, Default)]
struct MuonTally {
    elements: usize,
    buffer_bitwise: usize,
    ns_input_bitwise: usize,
    ns_output_bitwise: usize,
    ns_output_max_bf16_ulps: u64,
    param_bitwise: usize,
    param_max_ulps: u64,
    /// Our own three steps from the initial parameter, no torch value fed back.
    chained_param_bitwise: bool,
}

fn count_equal(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() == y.to_bits())
        .count()
}

fn run_muon_case(case: &Value, cfg: &MuonConfig) -> MuonTally {
    let shape = case["shape"].as_array().unwrap();
    let (rows, cols) = (
        shape[0].as_integer().unwrap() as usize,
        shape[1].as_integer().unwrap() as usize,
    );
    let lr_scale = LrScale::Uniform(cfg.scale.factor(rows, cols));
    let mut torch_p = f32s(&case["param"]);
    let mut torch_buf = vec![0.0f32; rows * cols];
    let (mut own_p, mut own_buf) = (torch_p.clone(), torch_buf.clone());
    let mut t = MuonTally::default();
    for (gv, step) in case["grads"]
        .as_array()
        .unwrap()
        .iter()
        .zip(case["step"].as_array().unwrap())
    {
        let grad = f32s(gv);
        let (t_buf, t_in, t_out, t_p) = (
            f32s(&step["momentum_buffer"]),
            bf16s(&step["ns_in"]),
            bf16s(&step["ns_out"]),
            f32s(&step["param"]),
        );
        // Momentum from torch's previous buffer.
        let mut buf = torch_buf.clone();
        let u = momentum_step(cfg, &grad, &mut buf);
        t.buffer_bitwise += count_equal(&buf, &t_buf);
        t.ns_input_bitwise += count_equal(&u, &t_in);
        // Newton-Schulz on torch's input.
        let (_, max, eq) = ns_against(cfg, cfg.ns.order, (rows, cols), &t_in, &t_out);
        t.ns_output_max_bf16_ulps = t.ns_output_max_bf16_ulps.max(max);
        t.ns_output_bitwise += eq;
        // torch's update applied to torch's previous parameter.
        let mut p = torch_p.clone();
        apply_update(cfg, &mut p, &t_out, &lr_scale);
        t.param_bitwise += count_equal(&p, &t_p);
        let worst = p.iter().zip(&t_p).map(|(&a, &b)| ulps(a, b)).max();
        t.param_max_ulps = t.param_max_ulps.max(worst.unwrap_or(0));
        t.elements += p.len();
        // Our own chain.
        let u = momentum_step(cfg, &grad, &mut own_buf);
        let x = Tensor::from_vec(&[rows, cols], u).unwrap();
        let o = newton_schulz(&x, &cfg.ns).unwrap();
        apply_update(cfg, &mut own_p, o.as_slice(), &lr_scale);
        t.chained_param_bitwise = count_equal(&own_p, &t_p) == own_p.len();
        torch_p = t_p;
        torch_buf = t_buf;
    }
    t
}

#[test]
fn muon_torch_preset_matches_torch_muon_bitwise() {
    let g = load("muon.toml");
    for case in cases(&g) {
        let name = case["name"].as_str().unwrap();
        let cfg = torch_muon(case);
        let t = run_muon_case(case, &cfg);
        eprintln!("{name}: torch preset {t:?}");
        let n = t.elements;
        assert_eq!(t.buffer_bitwise, n, "{name}: momentum buffer");
        assert_eq!(t.ns_input_bitwise, n, "{name}: Newton-Schulz input");
        assert_eq!(
            t.ns_output_bitwise, n,
            "{name}: Newton-Schulz output: {t:?}"
        );
        assert_eq!(t.param_bitwise, n, "{name}: updated parameter");
        assert!(t.chained_param_bitwise, "{name}: own 3-step chain: {t:?}");
    }
}

#[test]
fn muon_unfused_elementwise_is_not_torchs_cpu_kernels() {
    let g = load("muon.toml");
    let (mut buffer, mut param, mut n) = (0, 0, 0);
    for case in cases(&g) {
        let mut cfg = torch_muon(case);
        cfg.elementwise = ElementwiseNumerics::Unfused;
        let t = run_muon_case(case, &cfg);
        buffer += t.buffer_bitwise;
        param += t.param_bitwise;
        n += t.elements;
    }
    eprintln!(
        "unfused element-wise stages: momentum buffer {buffer}/{n}, parameter {param}/{n} bitwise"
    );
    assert!(buffer < n, "the goldens do not exercise the fused lerp_");
}

/// The new keys reach the optimizers from a scenario file, and a bad name is refused with its
/// file, line and key.
#[test]
fn numerics_keys_are_read_from_the_scenario() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/verify");
    let base = std::fs::read_to_string(dir.join("dense-fsdp4-muon.toml")).unwrap();
    let with = |extra_muon: &str, extra_adamw: &str| {
        let mut text = base.clone();
        if !text.contains("[optimizer.muon]") {
            text.push_str("\n[optimizer.muon]\n");
        }
        text = text.replacen(
            "[optimizer.muon]",
            &format!("[optimizer.muon]\n{extra_muon}"),
            1,
        );
        if !text.contains("[optimizer.adamw]") {
            text.push_str("\n[optimizer.adamw]\n");
        }
        text.replacen(
            "[optimizer.adamw]",
            &format!("[optimizer.adamw]\n{extra_adamw}"),
            1,
        )
    };
    let text = with(
        "ns_order = \"eager\"\nnumerics = \"unfused\"",
        "numerics = \"torch_cpu_fma\"",
    );
    let sc =
        Scenario::from_str_at(&text, &dir.join("numerics.toml")).unwrap_or_else(|e| panic!("{e}"));
    let muon = MuonConfig::from_section(&sc.file.optimizer).unwrap();
    assert_eq!(muon.ns.order, NsOpOrder::ScaleThenMultiply);
    assert_eq!(muon.elementwise, ElementwiseNumerics::Unfused);
    let adamw = AdamW::from_options(&sc.file.optimizer.adamw).unwrap();
    assert_eq!(adamw.numerics, ElementwiseNumerics::TorchCpuFma);
    let default = Scenario::from_str_at(&base, &dir.join("numerics.toml")).unwrap();
    assert_eq!(
        AdamW::from_options(&default.file.optimizer.adamw)
            .unwrap()
            .numerics,
        ElementwiseNumerics::Unfused,
        "the default stays unfused (the verify goldens)"
    );
    for (muon_key, adamw_key, want) in [
        ("ns_order = \"fused\"", "", "ns_order"),
        ("", "numerics = \"fma\"", "numerics"),
    ] {
        let err = Scenario::from_str_at(&with(muon_key, adamw_key), &dir.join("numerics.toml"))
            .err()
            .unwrap_or_else(|| panic!("{muon_key}{adamw_key} accepted"))
            .to_string();
        assert!(
            err.contains("numerics.toml:") && err.contains(want),
            "{err}"
        );
    }
}

/// Beyond the goldens: on seeded Gaussian matrices of several shapes, the `addmm` order's
/// output is closer to exact (f64, unrounded) Newton-Schulz than the eager order's, summed
/// over the matrices (the figure the README quotes).
#[test]
fn addmm_order_is_closer_to_exact_newton_schulz_than_eager() {
    let cfg = MuonConfig::preset(MuonPreset::Torch);
    let (mut addmm_total, mut eager_total, mut gram_total) = (0.0, 0.0, 0.0);
    for (i, &(rows, cols)) in [(32, 64), (64, 32), (48, 48), (16, 128), (96, 40)]
        .iter()
        .enumerate()
    {
        for seed in 0..4u64 {
            let g: Vec<f32> = KeyedRng::new(0x6e73 + seed, i as u64)
                .normal_range(0, (rows * cols) as u64)
                .into_iter()
                .map(|x: f32| q(x))
                .collect();
            let exact = exact_ns(&g, rows, cols, &cfg.ns.coefficients, 1e-7);
            let (addmm, _, _) = ns_against(&cfg, NsOpOrder::Addmm, (rows, cols), &g, &g);
            let (eager, _, _) =
                ns_against(&cfg, NsOpOrder::ScaleThenMultiply, (rows, cols), &g, &g);
            let (gram, _, _) = ns_against(&cfg, NsOpOrder::GramSquaredFirst, (rows, cols), &g, &g);
            gram_total += distance(&gram, &exact);
            addmm_total += distance(&addmm, &exact);
            eager_total += distance(&eager, &exact);
        }
    }
    let ratio = eager_total / addmm_total;
    eprintln!(
        "20 Gaussian matrices: summed Frobenius distance to exact NS: eager {eager_total:.4}, \
         gram_squared_first {gram_total:.4}, addmm {addmm_total:.4}, eager/addmm = {ratio:.2}"
    );
    assert!(ratio > 1.0, "addmm must be the closer order: {ratio}");
}

/// `[optimizer.muon] ns_order` and `numerics` override a preset; `torch_cpu_fma` needs the
/// EMA (lerp) momentum it describes; bad names are refused with the key.
#[test]
fn muon_numerics_overrides_resolve_per_preset() {
    use hpfsdp_plan::scenario::MuonOptions;
    let torch = MuonConfig::preset(MuonPreset::Torch);
    assert_eq!(torch.ns.order, NsOpOrder::AddmmCpublas);
    assert_eq!(torch.elementwise, ElementwiseNumerics::TorchCpuFma);
    let kj = MuonConfig::preset(MuonPreset::KellerJordan);
    assert_eq!(kj.ns.order, NsOpOrder::ScaleThenMultiply, "eager form kept");
    assert_eq!(kj.elementwise, ElementwiseNumerics::Unfused);
    let resolve = |preset, ns_order: Option<&str>, numerics: Option<&str>| {
        MuonConfig::resolve(
            preset,
            &MuonOptions {
                ns_order: ns_order.map(str::to_string),
                numerics: numerics.map(str::to_string),
                ..MuonOptions::default()
            },
        )
    };
    let c = resolve(MuonPreset::HyperParallel, Some("addmm"), None).unwrap();
    assert_eq!(c.ns.order, NsOpOrder::Addmm);
    let c = resolve(MuonPreset::Torch, Some("addmm_onednn"), None).unwrap();
    assert_eq!(c.ns.order, NsOpOrder::AddmmOnednn);
    let c = resolve(MuonPreset::Torch, Some("eager"), Some("unfused")).unwrap();
    assert_eq!(
        (c.ns.order, c.elementwise),
        (NsOpOrder::ScaleThenMultiply, ElementwiseNumerics::Unfused)
    );
    let c = resolve(MuonPreset::KellerJordan, None, Some("torch_cpu_fma")).unwrap();
    assert_eq!(c.elementwise, ElementwiseNumerics::TorchCpuFma);
    for (preset, order, form, key) in [
        (
            MuonPreset::HyperParallel,
            None,
            Some("torch_cpu_fma"),
            "numerics",
        ),
        (
            MuonPreset::Moonlight,
            None,
            Some("torch_cpu_fma"),
            "numerics",
        ),
        (MuonPreset::Torch, Some("fused"), None, "ns_order"),
        (MuonPreset::Torch, None, Some("fma"), "numerics"),
    ] {
        let e = resolve(preset, order, form).unwrap_err().to_string();
        assert!(e.contains(key), "{preset:?}: {e}");
    }
}
