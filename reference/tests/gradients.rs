//! Every hand-written backward pass against central finite differences in f64.
//!
//! Each check turns the operator's output `y` into a scalar `L = Σ y·r` with a fixed random `r`,
//! perturbs every element of every input and weight by `±h` (`h = 1e-5`), and requires
//! `|analytic − numeric| ≤ 1e-6 · max(|numeric|, 1e-2)` for every element: a relative error of
//! at most 1e-6, or an absolute error of at most 1e-8 for gradients smaller than 1e-2.

use hpfsdp_reference::gradcheck::{max_relative_error, numeric_gradient, probe, project};
use hpfsdp_reference::ops::{
    CausalAttention, CrossEntropy, Embedding, Linear, Mla, MlaParams, Moe, MoeParams, RmsNorm,
    Rope, SelfAttention, SelfAttentionParams, SwiGlu, SwiGluParams,
};
use hpfsdp_reference::{MlaConfig, ModelConfig, MoeConfig, RefResult, Tensor, TinyModel};

const H: f64 = 1e-5;
const TOL: f64 = 1e-6;
const FLOOR: f64 = 1e-2;

fn rand(shape: &[usize], seed: u64, scale: f64) -> Tensor<f64> {
    probe(shape, seed).map(|x| x * scale)
}

fn check(
    what: &str,
    analytic: &Tensor<f64>,
    at: &Tensor<f64>,
    f: impl FnMut(&Tensor<f64>) -> RefResult<f64>,
) {
    let numeric = numeric_gradient(at, H, f).unwrap();
    let err = max_relative_error(analytic, &numeric, FLOOR);
    assert!(err <= TOL, "{what}: relative error {err:e} > {TOL:e}");
    assert!(
        numeric.as_slice().iter().any(|v| v.abs() > 1e-6),
        "{what}: gradient is trivially zero"
    );
}

#[test]
fn linear() {
    let x = rand(&[5, 6], 1, 1.0);
    let w = rand(&[4, 6], 2, 0.5);
    let r = probe(&[5, 4], 3);
    let (y, cache) = Linear.forward(&w, &x).unwrap();
    let _ = y;
    let g = Linear.backward(&w, &cache, &r).unwrap();
    check("linear dx", &g.dx, &x, |x| {
        Ok(project(&Linear.forward(&w, x)?.0, &r))
    });
    check("linear dW", &g.dweight, &w, |w| {
        Ok(project(&Linear.forward(w, &x)?.0, &r))
    });
}

#[test]
fn embedding() {
    let w = rand(&[7, 3], 4, 1.0);
    let ids = [3, 1, 3, 6, 0];
    let r = probe(&[5, 3], 5);
    let (_, cache) = Embedding.forward(&w, &ids).unwrap();
    let dw = Embedding.backward(&cache, &r).unwrap();
    check("embedding dW", &dw, &w, |w| {
        Ok(project(&Embedding.forward(w, &ids)?.0, &r))
    });
    assert!(Embedding.forward(&w, &[7]).is_err());
}

#[test]
fn rmsnorm() {
    let norm = RmsNorm { eps: 1e-6 };
    let x = rand(&[4, 6], 6, 1.0);
    let w = rand(&[6], 7, 0.3).map(|v| 1.0 + v);
    let r = probe(&[4, 6], 8);
    let (_, cache) = norm.forward(&w, &x).unwrap();
    let g = norm.backward(&w, &cache, &r).unwrap();
    check("rmsnorm dx", &g.dx, &x, |x| {
        Ok(project(&norm.forward(&w, x)?.0, &r))
    });
    check("rmsnorm dw", &g.dweight, &w, |w| {
        Ok(project(&norm.forward(w, &x)?.0, &r))
    });
}

#[test]
fn rope() {
    let rope = Rope {
        theta: 10_000.0,
        dim: 4,
    };
    let pos = [0, 1, 2, 0, 1, 5];
    let x = rand(&[6, 8], 9, 1.0);
    let r = probe(&[6, 8], 10);
    let dx = rope.backward(&r, 2, &pos).unwrap();
    check("rope dx", &dx, &x, |x| {
        Ok(project(&rope.forward(x, 2, &pos)?, &r))
    });
    // Position 0 is the identity.
    let y = rope.forward(&x, 2, &pos).unwrap();
    assert_eq!(y.row(0), x.row(0));
}

#[test]
fn causal_attention_gqa() {
    let att = CausalAttention::new(4, 2, 3, 5);
    let (tokens, seq) = (8, 4);
    let q = rand(&[tokens, 12], 11, 1.0);
    let k = rand(&[tokens, 6], 12, 1.0);
    let v = rand(&[tokens, 10], 13, 1.0);
    let r = probe(&[tokens, 20], 14);
    let (_, cache) = att.forward(&q, &k, &v, seq).unwrap();
    let g = att.backward(&cache, &r).unwrap();
    check("attention dq", &g.dq, &q, |q| {
        Ok(project(&att.forward(q, &k, &v, seq)?.0, &r))
    });
    check("attention dk", &g.dk, &k, |k| {
        Ok(project(&att.forward(&q, k, &v, seq)?.0, &r))
    });
    check("attention dv", &g.dv, &v, |v| {
        Ok(project(&att.forward(&q, &k, v, seq)?.0, &r))
    });
}

#[test]
fn causal_attention_is_causal() {
    let att = CausalAttention::new(2, 1, 4, 4);
    let q = rand(&[6, 8], 15, 1.0);
    let k = rand(&[6, 4], 16, 1.0);
    let v = rand(&[6, 4], 17, 1.0);
    let (y, _) = att.forward(&q, &k, &v, 3).unwrap();
    // Changing the last token of the first sequence must not change its earlier outputs,
    // nor anything in the second sequence.
    let mut k2 = k.clone();
    k2.row_mut(2).iter_mut().for_each(|x| *x += 1.0);
    let (y2, _) = att.forward(&q, &k2, &v, 3).unwrap();
    for t in [0, 1, 3, 4, 5] {
        assert_eq!(y.row(t), y2.row(t), "token {t}");
    }
    assert_ne!(y.row(2), y2.row(2));
    assert!(
        att.forward(&q, &k, &v, 4).is_err(),
        "6 tokens do not split into 4"
    );
}

#[test]
fn self_attention_with_qk_norm() {
    let sa = SelfAttention {
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        rope_theta: 10_000.0,
        qk_norm_eps: Some(1e-6),
    };
    let (tokens, hid, seq) = (6, 8, 3);
    let x = rand(&[tokens, hid], 20, 1.0);
    let wq = rand(&[16, hid], 21, 0.4);
    let wk = rand(&[8, hid], 22, 0.4);
    let wv = rand(&[8, hid], 23, 0.4);
    let wo = rand(&[hid, 16], 24, 0.4);
    let qn = rand(&[4], 25, 0.2).map(|v| 1.0 + v);
    let kn = rand(&[4], 26, 0.2).map(|v| 1.0 + v);
    let r = probe(&[tokens, hid], 27);
    let p = SelfAttentionParams {
        q: &wq,
        k: &wk,
        v: &wv,
        o: &wo,
        q_norm: Some(&qn),
        k_norm: Some(&kn),
    };
    let (_, cache) = sa.forward(p, &x, seq).unwrap();
    let g = sa.backward(p, &cache, &r).unwrap();
    let l = |p: SelfAttentionParams<'_, f64>, x: &Tensor<f64>| {
        Ok(project(&sa.forward(p, x, seq)?.0, &r))
    };
    check("self_attn dx", &g.dx, &x, |x| l(p, x));
    check("q_proj", &g.dq, &wq, |w| {
        l(SelfAttentionParams { q: w, ..p }, &x)
    });
    check("k_proj", &g.dk, &wk, |w| {
        l(SelfAttentionParams { k: w, ..p }, &x)
    });
    check("v_proj", &g.dv, &wv, |w| {
        l(SelfAttentionParams { v: w, ..p }, &x)
    });
    check("o_proj", &g.do_, &wo, |w| {
        l(SelfAttentionParams { o: w, ..p }, &x)
    });
    let (dqn, dkn) = (g.dq_norm.unwrap(), g.dk_norm.unwrap());
    check("q_norm", &dqn, &qn, |w| {
        l(
            SelfAttentionParams {
                q_norm: Some(w),
                ..p
            },
            &x,
        )
    });
    check("k_norm", &dkn, &kn, |w| {
        l(
            SelfAttentionParams {
                k_norm: Some(w),
                ..p
            },
            &x,
        )
    });
}

#[test]
fn swiglu() {
    let (tokens, hid, inter) = (5, 6, 7);
    let x = rand(&[tokens, hid], 30, 1.0);
    let wg = rand(&[inter, hid], 31, 0.5);
    let wu = rand(&[inter, hid], 32, 0.5);
    let wd = rand(&[hid, inter], 33, 0.5);
    let r = probe(&[tokens, hid], 34);
    let p = SwiGluParams {
        gate: &wg,
        up: &wu,
        down: &wd,
    };
    let (_, cache) = SwiGlu.forward(p, &x).unwrap();
    let g = SwiGlu.backward(p, &cache, &r).unwrap();
    let l = |p: SwiGluParams<'_, f64>, x: &Tensor<f64>| Ok(project(&SwiGlu.forward(p, x)?.0, &r));
    check("swiglu dx", &g.dx, &x, |x| l(p, x));
    check("gate_proj", &g.dgate, &wg, |w| {
        l(
            SwiGluParams {
                gate: w,
                up: &wu,
                down: &wd,
            },
            &x,
        )
    });
    check("up_proj", &g.dup, &wu, |w| {
        l(
            SwiGluParams {
                gate: &wg,
                up: w,
                down: &wd,
            },
            &x,
        )
    });
    check("down_proj", &g.ddown, &wd, |w| {
        l(
            SwiGluParams {
                gate: &wg,
                up: &wu,
                down: w,
            },
            &x,
        )
    });
}

fn moe_case(norm_topk_prob: bool) {
    let moe = Moe {
        experts: 4,
        top_k: 2,
        intermediate: 3,
        norm_topk_prob,
    };
    let (tokens, hid) = (7, 5);
    let x = rand(&[tokens, hid], 40, 1.0);
    let wr = rand(&[4, hid], 41, 0.8);
    let wgu = rand(&[4, 6, hid], 42, 0.5);
    let wd = rand(&[4, hid, 3], 43, 0.5);
    let r = probe(&[tokens, hid], 44);
    let p = MoeParams {
        router: &wr,
        gate_up: &wgu,
        down: &wd,
    };
    let (_, cache) = moe.forward(p, &x).unwrap();
    // Every expert should see at least one token for the check to be meaningful.
    for e in 0..4 {
        assert!(
            cache.routing().iter().any(|s| s.contains(&e)),
            "expert {e} unused"
        );
    }
    let g = moe.backward(p, &cache, &r).unwrap();
    let l = |p: MoeParams<'_, f64>, x: &Tensor<f64>| Ok(project(&moe.forward(p, x)?.0, &r));
    check("moe dx", &g.dx, &x, |x| l(p, x));
    check("moe router", &g.drouter, &wr, |w| {
        l(
            MoeParams {
                router: w,
                gate_up: &wgu,
                down: &wd,
            },
            &x,
        )
    });
    check("moe gate_up", &g.dgate_up, &wgu, |w| {
        l(
            MoeParams {
                router: &wr,
                gate_up: w,
                down: &wd,
            },
            &x,
        )
    });
    check("moe down", &g.ddown, &wd, |w| {
        l(
            MoeParams {
                router: &wr,
                gate_up: &wgu,
                down: w,
            },
            &x,
        )
    });
}

#[test]
fn moe_with_renormalised_top_k() {
    moe_case(true);
}

#[test]
fn moe_without_renormalisation() {
    moe_case(false);
}

fn mla_case(q_lora: bool) {
    let mla = Mla {
        heads: 2,
        q_lora_rank: q_lora.then_some(5),
        kv_lora_rank: 4,
        qk_nope_dim: 3,
        qk_rope_dim: 2,
        v_head_dim: 3,
        rope_theta: 10_000.0,
        eps: 1e-6,
    };
    let (tokens, hid, seq) = (6, 7, 3);
    let x = rand(&[tokens, hid], 50, 1.0);
    let qa = rand(&[5, hid], 51, 0.5);
    let qan = rand(&[5], 52, 0.2).map(|v| 1.0 + v);
    let qb = rand(&[10, 5], 53, 0.5);
    let q = rand(&[10, hid], 54, 0.5);
    let kva = rand(&[6, hid], 55, 0.5);
    let kvan = rand(&[4], 56, 0.2).map(|v| 1.0 + v);
    let kvb = rand(&[12, 4], 57, 0.5);
    let o = rand(&[hid, 6], 58, 0.5);
    let r = probe(&[tokens, hid], 59);
    let base = MlaParams {
        q_a: q_lora.then_some(&qa),
        q_a_norm: q_lora.then_some(&qan),
        q_b: q_lora.then_some(&qb),
        q: (!q_lora).then_some(&q),
        kv_a: &kva,
        kv_a_norm: &kvan,
        kv_b: &kvb,
        o: &o,
    };
    let (_, cache) = mla.forward(base, &x, seq).unwrap();
    let g = mla.backward(base, &cache, &r).unwrap();
    let l = |p: MlaParams<'_, f64>, x: &Tensor<f64>| Ok(project(&mla.forward(p, x, seq)?.0, &r));
    check("mla dx", &g.dx, &x, |x| l(base, x));
    if q_lora {
        check("q_a_proj", g.dq_a.as_ref().unwrap(), &qa, |w| {
            l(
                MlaParams {
                    q_a: Some(w),
                    ..base
                },
                &x,
            )
        });
        check("q_a_layernorm", g.dq_a_norm.as_ref().unwrap(), &qan, |w| {
            l(
                MlaParams {
                    q_a_norm: Some(w),
                    ..base
                },
                &x,
            )
        });
        check("q_b_proj", g.dq_b.as_ref().unwrap(), &qb, |w| {
            l(
                MlaParams {
                    q_b: Some(w),
                    ..base
                },
                &x,
            )
        });
        assert!(g.dq.is_none());
    } else {
        check("q_proj", g.dq.as_ref().unwrap(), &q, |w| {
            l(MlaParams { q: Some(w), ..base }, &x)
        });
        assert!(g.dq_a.is_none());
    }
    check("kv_a_proj_with_mqa", &g.dkv_a, &kva, |w| {
        l(MlaParams { kv_a: w, ..base }, &x)
    });
    check("kv_a_layernorm", &g.dkv_a_norm, &kvan, |w| {
        l(
            MlaParams {
                kv_a_norm: w,
                ..base
            },
            &x,
        )
    });
    check("kv_b_proj", &g.dkv_b, &kvb, |w| {
        l(MlaParams { kv_b: w, ..base }, &x)
    });
    check("mla o_proj", &g.do_, &o, |w| {
        l(MlaParams { o: w, ..base }, &x)
    });
}

#[test]
fn mla_with_q_lora() {
    mla_case(true);
}

#[test]
fn mla_without_q_lora() {
    mla_case(false);
}

#[test]
fn cross_entropy() {
    let logits = rand(&[5, 9], 60, 2.0);
    let targets = [0, 8, 3, 3, 5];
    let (loss, cache) = CrossEntropy.forward(&logits, &targets).unwrap();
    assert!(loss > 0.0);
    let dz = CrossEntropy.backward(&cache, 1.0).unwrap();
    check("cross_entropy dlogits", &dz, &logits, |z| {
        Ok(CrossEntropy.forward(z, &targets)?.0)
    });
    assert!(CrossEntropy.forward(&logits, &[0, 1]).is_err());
    assert!(CrossEntropy.forward(&logits, &[0, 1, 2, 3, 9]).is_err());
}

/// Whole-model gradient check: every element of every parameter.
fn model_case(config: ModelConfig) {
    let model = TinyModel::new(config).unwrap();
    let params = config.init_params::<f64>(3).unwrap();
    let (seq, batch) = (4, 2);
    let ids: Vec<usize> = (0..seq * batch)
        .map(|i| (i * 7 + 3) % config.vocab)
        .collect();
    let targets: Vec<usize> = (0..seq * batch)
        .map(|i| (i * 5 + 1) % config.vocab)
        .collect();
    let (loss, grads) = model.loss_and_grads(&params, &ids, &targets, seq).unwrap();
    assert!(loss.is_finite());
    assert_eq!(grads.names(), params.names());
    for (name, p) in params.iter() {
        let analytic = grads.get(name).unwrap();
        let numeric = numeric_gradient(p, H, |perturbed| {
            let mut ps = params.clone();
            *ps.get_mut(name)? = perturbed.clone();
            model.loss(&ps, &ids, &targets, seq)
        })
        .unwrap();
        let err = max_relative_error(analytic, &numeric, FLOOR);
        assert!(err <= TOL, "{name}: relative error {err:e}");
    }
}

fn small() -> ModelConfig {
    ModelConfig {
        vocab: 11,
        hidden: 8,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
        intermediate: 6,
        qk_norm: true,
        moe: None,
        mla: None,
        rope_theta: 10_000.0,
        rms_eps: 1e-6,
        init_std: 0.5,
    }
}

#[test]
fn whole_model_dense_gqa() {
    model_case(small());
}

#[test]
fn whole_model_moe() {
    model_case(ModelConfig {
        moe: Some(MoeConfig {
            experts: 3,
            top_k: 2,
            intermediate: 4,
            norm_topk_prob: true,
            first_dense_layers: 1,
        }),
        qk_norm: false,
        ..small()
    });
}

#[test]
fn whole_model_mla_moe() {
    model_case(ModelConfig {
        mla: Some(MlaConfig {
            q_lora_rank: Some(4),
            kv_lora_rank: 4,
            qk_nope_head_dim: 2,
            qk_rope_head_dim: 2,
            v_head_dim: 3,
        }),
        moe: Some(MoeConfig {
            experts: 3,
            top_k: 1,
            intermediate: 4,
            norm_topk_prob: false,
            first_dense_layers: 0,
        }),
        ..small()
    });
}
