//! The `addmm_cpublas` and `addmm_onednn` Newton-Schulz orders against torch 2.15.0 on both of
//! torch's x86 CPU bf16 GEMM paths (`tools/torch_cpu_paths_golden.py`; the golden files name
//! the torch version, CPU capability and whether oneDNN ran):
//!
//! - `cpublas-avx2` (ATen's native kernels, AVX2 build: what a CPU without AVX-512 runs) and
//!   `cpublas-avx512` (the AVX-512 build with oneDNN off) equal `addmm_cpublas` bitwise;
//! - `onednn` (torch's default on an AVX-512 CPU with oneDNN bf16: GEMMs above 4096
//!   multiply-adds in oneDNN) equals `addmm_onednn` bitwise;
//!
//! on `_zeropower_via_newtonschulz` alone (wide, tall, square, vector and the shapes 64x96,
//! 128x40, 257x33, 33x257) and on 3 chained `torch.optim.Muon` steps with non-default
//! hyper-parameters. The older `addmm` order (ascending sums) and the other path's order are
//! shown to differ, so the goldens do tell the orders apart.

use std::path::PathBuf;

use hpfsdp_reference::Tensor;
use hpfsdp_reference::muon::update::{LrScale, apply_update, momentum_step};
use hpfsdp_reference::muon::{
    MomentumForm, MuonConfig, MuonPreset, NsOpOrder, UpdateScale, newton_schulz,
};
use toml::Value;

fn load(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with tools/torch_cpu_paths_golden.py)",
            path.display()
        )
    });
    toml::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A packed hex string of `digits`-digit bit patterns.
fn unpack(v: &Value, digits: usize) -> Vec<u64> {
    let s = v.as_str().expect("packed hex string");
    assert_eq!(s.len() % digits, 0, "packed length");
    (0..s.len() / digits)
        .map(|i| u64::from_str_radix(&s[i * digits..(i + 1) * digits], 16).expect("hex digits"))
        .collect()
}

fn bf16s(v: &Value) -> Vec<f32> {
    unpack(v, 4)
        .into_iter()
        .map(|b| f32::from_bits((b as u32) << 16))
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    unpack(v, 8)
        .into_iter()
        .map(|b| f32::from_bits(b as u32))
        .collect()
}

/// The golden paths with the order that must reproduce each.
const PATHS: [(&str, NsOpOrder); 3] = [
    ("cpublas_avx2", NsOpOrder::AddmmCpublas),
    ("cpublas_avx512", NsOpOrder::AddmmCpublas),
    ("onednn", NsOpOrder::AddmmOnednn),
];

fn shape(case: &Value) -> (usize, usize) {
    let s = case["shape"].as_array().unwrap();
    (
        s[0].as_integer().unwrap() as usize,
        s[1].as_integer().unwrap() as usize,
    )
}

fn ns_out(order: NsOpOrder, steps: usize, (rows, cols): (usize, usize), input: &[f32]) -> Vec<f32> {
    let mut ns = MuonConfig::preset(MuonPreset::Torch).ns;
    ns.order = order;
    ns.coefficients.truncate(steps);
    let x = Tensor::from_vec(&[rows, cols], input.to_vec()).unwrap();
    newton_schulz(&x, &ns).unwrap().as_slice().to_vec()
}

fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

#[test]
fn torch_preset_uses_the_native_cpu_order() {
    let torch = MuonConfig::preset(MuonPreset::Torch);
    assert_eq!(torch.ns.order, NsOpOrder::AddmmCpublas);
}

#[test]
fn newton_schulz_matches_each_torch_cpu_path_bitwise() {
    let g = load("ns_cpu_paths.toml");
    for (path, _) in PATHS {
        let meta = &g["path"][path.replace('_', "-").as_str()];
        eprintln!("{path}: {meta}");
    }
    let (mut other_differs, mut addmm_differs) = (0usize, 0usize);
    for case in g["case"].as_array().unwrap() {
        let sh = shape(case);
        let input = bf16s(&case["input"]);
        for (path, order) in PATHS {
            for (key, steps) in [("out5", 5), ("out1", 1)] {
                let Some(want) = case.get(key).and_then(|t| t.get(path)) else {
                    continue;
                };
                let want = bf16s(want);
                let got = ns_out(order, steps, sh, &input);
                let bad = differing(&got, &want);
                assert_eq!(
                    bad,
                    0,
                    "{path} {}x{} {steps} steps: {bad}/{} elements differ from torch",
                    sh.0,
                    sh.1,
                    want.len()
                );
                if steps == 5 {
                    let other = if order == NsOpOrder::AddmmCpublas {
                        NsOpOrder::AddmmOnednn
                    } else {
                        NsOpOrder::AddmmCpublas
                    };
                    other_differs += differing(&ns_out(other, 5, sh, &input), &want);
                    addmm_differs += differing(&ns_out(NsOpOrder::Addmm, 5, sh, &input), &want);
                }
            }
        }
        eprintln!("{}x{}: bitwise on every path", sh.0, sh.1);
    }
    eprintln!(
        "elements differing from torch in the wrong order: other path's order {other_differs}, \
         ascending `addmm` {addmm_differs}"
    );
    assert!(
        other_differs > 0,
        "the paths' goldens do not tell the orders apart"
    );
    assert!(
        addmm_differs > 0,
        "the goldens do not tell `addmm` from torch's orders"
    );
}

fn muon_config(g: &Value, case: &Value, order: NsOpOrder) -> MuonConfig {
    let mut cfg = MuonConfig::preset(MuonPreset::Torch);
    cfg.lr = g["lr"].as_float().unwrap();
    cfg.weight_decay = g["weight_decay"].as_float().unwrap();
    cfg.momentum = MomentumForm::Ema {
        beta: g["momentum"].as_float().unwrap(),
    };
    cfg.nesterov = g["nesterov"].as_bool().unwrap();
    cfg.ns.epsilon = g["eps"].as_float().unwrap() as f32;
    let steps = g["ns_steps"].as_integer().unwrap() as usize;
    cfg.ns.coefficients = vec![cfg.ns.coefficients[0]; steps];
    cfg.ns.order = order;
    if case["adjust_lr_fn"].as_str() == Some("match_rms_adamw") {
        cfg.scale = UpdateScale::MatchedRmsInLr { rms: 0.2 };
    }
    cfg
}

#[test]
fn chained_muon_steps_match_each_torch_cpu_path_bitwise() {
    let g = load("muon_cpu_paths.toml");
    for case in g["case"].as_array().unwrap() {
        let (rows, cols) = shape(case);
        for (path, order) in PATHS {
            let Some(params) = case["param_after"].get(path) else {
                continue;
            };
            let cfg = muon_config(&g, case, order);
            let lr_scale = LrScale::Uniform(cfg.scale.factor(rows, cols));
            let mut p = f32s(&case["param"]);
            let mut buf = vec![0.0f32; p.len()];
            let steps = case["grads"].as_array().unwrap().iter().enumerate();
            for (k, grad) in steps {
                let u = momentum_step(&cfg, &f32s(grad), &mut buf);
                let want_buf = f32s(&case["momentum_buffer"][k]);
                assert_eq!(differing(&buf, &want_buf), 0, "{path} step {k}: buffer");
                let x = Tensor::from_vec(&[rows, cols], u).unwrap();
                let o = newton_schulz(&x, &cfg.ns).unwrap();
                let want_ns = bf16s(&case["ns_out"][path][k]);
                let bad = differing(o.as_slice(), &want_ns);
                assert_eq!(bad, 0, "{path} {rows}x{cols} step {k}: NS output");
                apply_update(&cfg, &mut p, o.as_slice(), &lr_scale);
                let bad = differing(&p, &f32s(&params[k]));
                assert_eq!(bad, 0, "{path} {rows}x{cols} step {k}: parameter");
            }
            eprintln!("{path} {rows}x{cols}: 3 chained steps bitwise");
        }
    }
}
