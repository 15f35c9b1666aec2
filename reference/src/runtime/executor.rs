//! One rank's training step: the model's forward and backward unit by unit, with the FSDP
//! runtime gathering and reducing around each unit and the execution context dispatching
//! every op and every module boundary.
//!
//! The computation per module is the one [`crate::TinyModel`] performs (same kernels, same
//! order), so a data-parallel rank reproduces the single-device bits of its micro-batch.

use std::collections::HashMap;

use hpfsdp_plan::Layout;
use hpfsdp_plan::fsdp::FsdpPlan;

use super::ctx::Ctx;
use super::dtensor::{DTensor, Meta, replicated};
use super::ep::{EpMoe, EpMoeCache, EpWeights};
use super::error::{RtResult, RuntimeError};
use super::fsdp::FsdpRuntime;
use super::rules::OpKind;
use super::tp::{VocabParallelCache, embedding_backward, embedding_forward};
use crate::model::ModelConfig;
use crate::ops::{
    CrossEntropy, CrossEntropyCache, Linear, LinearCache, Mla, MlaCache, MlaParams, Moe, MoeCache,
    MoeParams, RmsNorm, RmsNormCache, SelfAttention, SelfAttentionCache, SelfAttentionParams,
    SwiGlu, SwiGluCache, SwiGluParams,
};
use crate::tensor::Tensor;

/// A unit's parameter gradients (plan-local, unreduced), by name.
pub type UnitGrads = Vec<(String, Tensor<f32>)>;

/// What an FSDP unit holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// `model.embed_tokens`.
    Embed,
    /// `model.layers.{i}`.
    Layer(usize),
    /// `model.norm` + `lm_head` (and the loss).
    Head,
}

/// The kinds of the plan's units, in plan order.
pub fn unit_kinds(plan: &FsdpPlan) -> RtResult<Vec<UnitKind>> {
    plan.units
        .iter()
        .map(|u| match (u.name.as_str(), u.layer) {
            ("model.embed_tokens", _) => Ok(UnitKind::Embed),
            ("model.norm+lm_head", _) => Ok(UnitKind::Head),
            (_, Some(l)) => Ok(UnitKind::Layer(l)),
            (other, None) => Err(RuntimeError::unsupported(format!(
                "FSDP unit '{other}' is not part of the reference decoder"
            ))),
        })
        .collect()
}

enum AttnC {
    Gqa(SelfAttentionCache<f32>),
    Mla(MlaCache<f32>),
}

enum MlpC {
    Dense(SwiGluCache<f32>),
    Moe(MoeCache<f32>),
    Ep(EpMoeCache),
}

struct BlockC {
    n1: RmsNormCache<f32>,
    n1_in: Meta,
    attn: AttnC,
    attn_in: Meta,
    n2: RmsNormCache<f32>,
    n2_in: Meta,
    mlp: MlpC,
    mlp_in: Meta,
    out: Meta,
}

struct HeadC {
    norm: RmsNormCache<f32>,
    norm_in: Meta,
    head: LinearCache<f32>,
    head_in: Meta,
    ce: CrossEntropyCache<f32>,
    logits: Meta,
}

/// Static facts about where this rank's parameters sit.
#[derive(Debug, Clone, Default)]
pub struct ParamFacts {
    /// Layout of each parameter on the plan mesh (global shape, plan placements).
    pub layouts: HashMap<String, Layout>,
    /// First vocabulary row of this rank's embedding shard (vocab-parallel TP).
    pub embed_first_row: usize,
    /// Whether routed experts are split over `ep`.
    pub expert_parallel: bool,
}

/// One rank's executor.
pub struct Executor<'c> {
    /// Execution context (mode flag, communicator, rules, boundaries).
    pub ctx: Ctx<'c>,
    /// FSDP/HSDP runtime.
    pub fsdp: FsdpRuntime,
    config: ModelConfig,
    seq_len: usize,
    units: Vec<UnitKind>,
    facts: ParamFacts,
    embed: Option<VocabParallelCache>,
    blocks: Vec<Option<BlockC>>,
    head: Option<HeadC>,
}

fn lay<'a>(facts: &'a ParamFacts, validate: bool, name: &str) -> Option<&'a Layout> {
    if validate {
        facts.layouts.get(name)
    } else {
        None
    }
}

impl<'c> Executor<'c> {
    /// An executor over a context and an FSDP runtime.
    pub fn new(
        ctx: Ctx<'c>,
        fsdp: FsdpRuntime,
        config: ModelConfig,
        seq_len: usize,
        units: Vec<UnitKind>,
        facts: ParamFacts,
    ) -> Executor<'c> {
        let layers = config.layers;
        Executor {
            ctx,
            fsdp,
            config,
            seq_len,
            units,
            facts,
            embed: None,
            blocks: (0..layers).map(|_| None).collect(),
            head: None,
        }
    }

    fn norm(&self) -> RmsNorm {
        RmsNorm {
            eps: self.config.rms_eps,
        }
    }

    /// One micro-batch: forward, backward and the FSDP post-backward pipeline; the fused
    /// all-reduces run only when `requires_all_reduce` (the last micro-step). Returns the loss.
    pub fn micro_step(
        &mut self,
        ids: &[usize],
        targets: &[usize],
        requires_all_reduce: bool,
    ) -> RtResult<f32> {
        let n = self.units.len();
        let comm = self.ctx.comm;
        let mut x: Option<DTensor> = None;
        let mut loss = None;
        // The root's pre-forward gathers the root units before any block.
        self.fsdp.issue_root_unshards(comm, &self.ctx.topo)?;
        for u in 0..n {
            self.fsdp.wait_unshard(comm, &self.ctx.topo, u)?;
            self.fsdp.prefetch(comm, &self.ctx.topo, u, false)?;
            match self.units[u] {
                UnitKind::Embed => x = Some(self.embed_fwd(ids)?),
                UnitKind::Layer(l) => {
                    let input = x
                        .take()
                        .ok_or_else(|| RuntimeError::plan("layer before embedding"))?;
                    x = Some(self.block_fwd(l, input)?);
                }
                UnitKind::Head => {
                    let input = x
                        .take()
                        .ok_or_else(|| RuntimeError::plan("head before embedding"))?;
                    loss = Some(self.head_fwd(input, targets)?);
                }
            }
            // The root is never resharded after forward.
            if self.fsdp.reshard_after_forward && !self.fsdp.is_root(u) {
                self.fsdp.reshard(u);
            }
        }
        let loss = loss.ok_or_else(|| RuntimeError::plan("the plan has no head unit"))?;
        let mut dx: Option<DTensor> = None;
        let mut root_grads: Vec<(usize, UnitGrads)> = Vec::new();
        for u in (0..n).rev() {
            self.fsdp.wait_unshard(comm, &self.ctx.topo, u)?;
            self.fsdp.prefetch(comm, &self.ctx.topo, u, true)?;
            let grads = match self.units[u] {
                UnitKind::Head => {
                    let (g, d) = self.head_bwd()?;
                    dx = Some(d);
                    g
                }
                UnitKind::Layer(l) => {
                    let dy = dx
                        .take()
                        .ok_or_else(|| RuntimeError::plan("layer backward before head"))?;
                    let (g, d) = self.block_bwd(l, dy)?;
                    dx = Some(d);
                    g
                }
                UnitKind::Embed => {
                    let dy = dx
                        .take()
                        .ok_or_else(|| RuntimeError::plan("embedding backward before head"))?;
                    self.embed_bwd(dy)?
                }
            };
            if self.fsdp.is_root(u) {
                root_grads.push((u, grads));
                continue;
            }
            self.fsdp.reshard(u);
            self.fsdp
                .post_backward(comm, &self.ctx.topo, u, grads, requires_all_reduce)?;
        }
        // The root's post-backward fires last: reshard, then its units in unit order.
        self.fsdp.reshard_root();
        root_grads.sort_by_key(|(u, _)| *u);
        for (u, grads) in root_grads {
            self.fsdp
                .post_backward(comm, &self.ctx.topo, u, grads, requires_all_reduce)?;
        }
        self.fsdp.finish_backward(comm, &self.ctx.topo)?;
        Ok(loss)
    }

    fn embed_fwd(&mut self, ids: &[usize]) -> RtResult<DTensor> {
        let v = self.ctx.mode.validates();
        let module = "model.embed_tokens";
        let ids_t = Tensor::from_vec(&[ids.len()], ids.iter().map(|&i| i as f32).collect())?;
        let ids_layout = v.then(|| replicated(&[ids.len()], &self.ctx.topo.plan_mesh));
        let ids_t = self
            .ctx
            .enter(module, DTensor::new(ids_t, vec![ids.len()], ids_layout))?;
        let w_name = "model.embed_tokens.weight";
        let (first, vocab) = (self.facts.embed_first_row, self.config.vocab);
        let ids_local: Vec<usize> = ids_t.local.as_slice().iter().map(|&x| x as usize).collect();
        let fsdp = &self.fsdp;
        let global = [ids.len(), self.config.hidden];
        let (y, cache) = self.ctx.op(
            OpKind::Embedding,
            &[ids_t.layout.as_ref(), lay(&self.facts, v, w_name)],
            &global,
            || {
                Ok(embedding_forward(
                    fsdp.full(w_name)?,
                    &ids_local,
                    first,
                    vocab,
                )?)
            },
        )?;
        self.embed = Some(cache);
        self.ctx.exit(module, y)
    }

    fn embed_bwd(&mut self, dy: DTensor) -> RtResult<UnitGrads> {
        let module = "model.embed_tokens";
        let cache = self
            .embed
            .take()
            .ok_or_else(|| RuntimeError::plan("embedding backward without forward"))?;
        let g = self.ctx.bwd_enter(module, dy)?;
        let dw = self.ctx.bwd(|| Ok(embedding_backward(&cache, &g.local)?))?;
        // The ids carry no gradient; leave the module without an input gradient.
        self.ctx.bwd_exit_no_grad(module);
        Ok(vec![("model.embed_tokens.weight".to_string(), dw)])
    }

    /// `module`: enter, run `op` on the body input with `params` (output of global shape
    /// `[tokens, features]`), exit. Returns the output, the op's cache and the body input's
    /// metadata.
    fn module_fwd<C>(
        &mut self,
        module: &str,
        x: DTensor,
        op: OpKind,
        params: &[String],
        features: usize,
        f: impl FnOnce(&Tensor<f32>, &FsdpRuntime) -> RtResult<(Tensor<f32>, C)>,
    ) -> RtResult<(DTensor, C, Meta)> {
        let v = self.ctx.mode.validates();
        let x = self.ctx.enter(module, x)?;
        let mut inputs = vec![x.layout.as_ref()];
        inputs.extend(params.iter().map(|p| lay(&self.facts, v, p)));
        let fsdp = &self.fsdp;
        let global = [x.global[0], features];
        let (y, c) = self.ctx.op(op, &inputs, &global, || f(&x.local, fsdp))?;
        let y = self.ctx.exit(module, y)?;
        Ok((y, c, x.meta()))
    }

    /// `module` backward: enter with the output gradient, run `f`, leave with the input
    /// gradient (adjoint transitions and checks in the context).
    fn module_bwd<G>(
        &mut self,
        module: &str,
        dy: DTensor,
        x: &Meta,
        f: impl FnOnce(&Tensor<f32>, &FsdpRuntime) -> RtResult<(Tensor<f32>, G)>,
    ) -> RtResult<(DTensor, G)> {
        let g = self.ctx.bwd_enter(module, dy)?;
        let fsdp = &self.fsdp;
        let (dx, grads) = self.ctx.bwd(|| f(&g.local, fsdp))?;
        let dx = self.ctx.bwd_exit(module, dx, x)?;
        Ok((dx, grads))
    }

    fn add(&mut self, a: &DTensor, b: &DTensor) -> RtResult<DTensor> {
        let (y, ()) = self.ctx.op(
            OpKind::Add,
            &[a.layout.as_ref(), b.layout.as_ref()],
            &a.global,
            || Ok((a.local.add(&b.local)?, ())),
        )?;
        Ok(y)
    }

    fn norm_fwd(
        &mut self,
        module: &str,
        x: DTensor,
    ) -> RtResult<(DTensor, RmsNormCache<f32>, Meta)> {
        let w = format!("{module}.weight");
        let norm = self.norm();
        let wn = w.clone();
        let features = x.global[1];
        self.module_fwd(module, x, OpKind::RmsNorm, &[w], features, move |x, f| {
            Ok(norm.forward(f.full(&wn)?, x)?)
        })
    }

    fn attn_names(&self, a: &str) -> Vec<String> {
        match self.config.mla {
            Some(m) => {
                let mut v = Vec::new();
                if m.q_lora_rank.is_some() {
                    v.extend(["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"]);
                } else {
                    v.push("q_proj.weight");
                }
                v.extend([
                    "kv_a_proj_with_mqa.weight",
                    "kv_a_layernorm.weight",
                    "kv_b_proj.weight",
                    "o_proj.weight",
                ]);
                v.into_iter().map(|n| format!("{a}.{n}")).collect()
            }
            None => {
                let mut v = vec![
                    "q_proj.weight",
                    "k_proj.weight",
                    "v_proj.weight",
                    "o_proj.weight",
                ];
                if self.config.qk_norm {
                    v.extend(["q_norm.weight", "k_norm.weight"]);
                }
                v.into_iter().map(|n| format!("{a}.{n}")).collect()
            }
        }
    }

    fn mla(&self) -> RtResult<Mla> {
        let c = &self.config;
        let m = c
            .mla
            .ok_or_else(|| RuntimeError::plan("MLA op without MLA config"))?;
        Ok(Mla {
            heads: c.heads,
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            qk_nope_dim: m.qk_nope_head_dim,
            qk_rope_dim: m.qk_rope_head_dim,
            v_head_dim: m.v_head_dim,
            rope_theta: c.rope_theta,
            eps: c.rms_eps,
        })
    }

    fn moe_cfg(&self) -> RtResult<crate::model::MoeConfig> {
        self.config
            .moe
            .ok_or_else(|| RuntimeError::plan("MoE layer without MoE config"))
    }

    fn block_fwd(&mut self, l: usize, x: DTensor) -> RtResult<DTensor> {
        let p = format!("model.layers.{l}");
        let hidden = self.config.hidden;
        let (hn, n1, n1_in) = self.norm_fwd(&format!("{p}.input_layernorm"), x.clone())?;
        let a = format!("{p}.self_attn");
        let names = self.attn_names(&a);
        let (ao, attn, attn_in) = match self.config.mla {
            Some(_) => {
                let mla = self.mla()?;
                let lora = self.config.mla.is_some_and(|m| m.q_lora_rank.is_some());
                let (seq, a2) = (self.seq_len, a.clone());
                let (y, c, l_in) =
                    self.module_fwd(&a, hn, OpKind::Mla, &names, hidden, move |x, f| {
                        Ok(mla.forward(mla_params_of(f, &a2, lora)?, x, seq)?)
                    })?;
                (y, AttnC::Mla(c), l_in)
            }
            None => {
                let op = OpKind::SelfAttention {
                    heads: self.config.heads,
                    kv_heads: self.config.kv_heads,
                };
                let (seq, cfg) = (self.seq_len, self.config);
                let a2 = a.clone();
                let (y, c, l_in) = self.module_fwd(&a, hn, op, &names, hidden, move |x, f| {
                    let me = GqaView { config: cfg };
                    let att = me.gqa(f, &a2)?;
                    Ok(att.forward(me.params(f, &a2)?, x, seq)?)
                })?;
                (y, AttnC::Gqa(c), l_in)
            }
        };
        let h = self.add(&x, &ao)?;
        let (hn2, n2, n2_in) =
            self.norm_fwd(&format!("{p}.post_attention_layernorm"), h.clone())?;
        let m = format!("{p}.mlp");
        let (mo, mlp, mlp_in) = if self.config.is_moe_layer(l) {
            let cfg = self.moe_cfg()?;
            let names: Vec<String> = ["gate.weight", "experts.gate_up_proj", "experts.down_proj"]
                .iter()
                .map(|n| format!("{m}.{n}"))
                .collect();
            let nm = names.clone();
            if self.facts.expert_parallel {
                let ep = self.ctx.topo.ep.clone();
                let comm = self.ctx.comm;
                let moe = EpMoe {
                    experts: cfg.experts,
                    top_k: cfg.top_k,
                    intermediate: cfg.intermediate,
                    norm_topk_prob: cfg.norm_topk_prob,
                    wire: self.ctx.act_dtype,
                };
                let (y, c, l_in) =
                    self.module_fwd(&m, hn2, OpKind::MoeEp, &names, hidden, move |x, f| {
                        moe.forward(
                            comm,
                            &ep,
                            EpWeights {
                                router: f.full(&nm[0])?,
                                gate_up: f.full(&nm[1])?,
                                down: f.full(&nm[2])?,
                            },
                            x,
                        )
                    })?;
                (y, MlpC::Ep(c), l_in)
            } else {
                let moe = Moe {
                    experts: cfg.experts,
                    top_k: cfg.top_k,
                    intermediate: cfg.intermediate,
                    norm_topk_prob: cfg.norm_topk_prob,
                };
                let (y, c, l_in) =
                    self.module_fwd(&m, hn2, OpKind::Moe, &names, hidden, move |x, f| {
                        let ps = MoeParams {
                            router: f.full(&nm[0])?,
                            gate_up: f.full(&nm[1])?,
                            down: f.full(&nm[2])?,
                        };
                        Ok(moe.forward(ps, x)?)
                    })?;
                (y, MlpC::Moe(c), l_in)
            }
        } else {
            let names: Vec<String> = ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
                .iter()
                .map(|n| format!("{m}.{n}"))
                .collect();
            let nm = names.clone();
            let (y, c, l_in) =
                self.module_fwd(&m, hn2, OpKind::SwiGlu, &names, hidden, move |x, f| {
                    let ps = SwiGluParams {
                        gate: f.full(&nm[0])?,
                        up: f.full(&nm[1])?,
                        down: f.full(&nm[2])?,
                    };
                    Ok(SwiGlu.forward(ps, x)?)
                })?;
            (y, MlpC::Dense(c), l_in)
        };
        let out = self.add(&h, &mo)?;
        self.blocks[l] = Some(BlockC {
            n1,
            n1_in,
            attn,
            attn_in,
            n2,
            n2_in,
            mlp,
            mlp_in,
            out: out.meta(),
        });
        Ok(out)
    }

    fn block_bwd(&mut self, l: usize, dx: DTensor) -> RtResult<(UnitGrads, DTensor)> {
        let bc = self.blocks[l]
            .take()
            .ok_or_else(|| RuntimeError::plan(format!("layer {l} backward without forward")))?;
        let _ = &bc.out;
        let p = format!("model.layers.{l}");
        let m = format!("{p}.mlp");
        let a = format!("{p}.self_attn");
        let mut grads: Vec<(String, Tensor<f32>)> = Vec::new();
        // out = h + mlp(norm2(h))
        let (dmlp_in, g) = self.mlp_bwd(&m, &bc.mlp, &bc.mlp_in, dx.clone())?;
        grads.extend(g);
        let n2 = format!("{p}.post_attention_layernorm");
        let (dn2, gw2) = self.norm_bwd(&n2, dmlp_in, &bc.n2, &bc.n2_in)?;
        let dh = self.bwd_add(&dx, &dn2)?;
        // h = x + attn(norm1(x))
        let names = self.attn_names(&a);
        let (dattn_in, g) = self.attn_bwd(&a, &bc.attn, &bc.attn_in, dh.clone())?;
        if g.len() != names.len() {
            return Err(RuntimeError::plan(format!(
                "{a}: {} gradients for {} parameters",
                g.len(),
                names.len()
            )));
        }
        grads.extend(names.into_iter().zip(g));
        let n1 = format!("{p}.input_layernorm");
        let (dn1, gw1) = self.norm_bwd(&n1, dattn_in, &bc.n1, &bc.n1_in)?;
        let dx = self.bwd_add(&dh, &dn1)?;
        grads.push((format!("{n1}.weight"), gw1));
        grads.push((format!("{n2}.weight"), gw2));
        Ok((grads, dx))
    }

    /// Backward of the MLP block `m` (dense SwiGLU, MoE, or MoE with expert parallelism) from
    /// `dx`: the input gradient and the named weight gradients.
    fn mlp_bwd(
        &mut self,
        m: &str,
        mlp: &MlpC,
        mlp_in: &Meta,
        dx: DTensor,
    ) -> RtResult<(DTensor, UnitGrads)> {
        Ok(match mlp {
            MlpC::Dense(c) => {
                let nm: Vec<String> = ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
                    .iter()
                    .map(|n| format!("{m}.{n}"))
                    .collect();
                let n2 = nm.clone();
                let (d, g) = self.module_bwd(m, dx, mlp_in, move |dy, f| {
                    let ps = SwiGluParams {
                        gate: f.full(&n2[0])?,
                        up: f.full(&n2[1])?,
                        down: f.full(&n2[2])?,
                    };
                    let g = SwiGlu.backward(ps, c, dy)?;
                    Ok((g.dx, vec![g.dgate, g.dup, g.ddown]))
                })?;
                (d, nm.into_iter().zip(g).collect::<Vec<_>>())
            }
            MlpC::Moe(c) => {
                let cfg = self.moe_cfg()?;
                let nm: Vec<String> = ["gate.weight", "experts.gate_up_proj", "experts.down_proj"]
                    .iter()
                    .map(|n| format!("{m}.{n}"))
                    .collect();
                let n2 = nm.clone();
                let moe = Moe {
                    experts: cfg.experts,
                    top_k: cfg.top_k,
                    intermediate: cfg.intermediate,
                    norm_topk_prob: cfg.norm_topk_prob,
                };
                let (d, g) = self.module_bwd(m, dx, mlp_in, move |dy, f| {
                    let ps = MoeParams {
                        router: f.full(&n2[0])?,
                        gate_up: f.full(&n2[1])?,
                        down: f.full(&n2[2])?,
                    };
                    let g = moe.backward(ps, c, dy)?;
                    Ok((g.dx, vec![g.drouter, g.dgate_up, g.ddown]))
                })?;
                (d, nm.into_iter().zip(g).collect())
            }
            MlpC::Ep(c) => {
                let cfg = self.moe_cfg()?;
                let nm: Vec<String> = ["gate.weight", "experts.gate_up_proj", "experts.down_proj"]
                    .iter()
                    .map(|n| format!("{m}.{n}"))
                    .collect();
                let n2 = nm.clone();
                let ep = self.ctx.topo.ep.clone();
                let comm = self.ctx.comm;
                let moe = EpMoe {
                    experts: cfg.experts,
                    top_k: cfg.top_k,
                    intermediate: cfg.intermediate,
                    norm_topk_prob: cfg.norm_topk_prob,
                    wire: self.ctx.act_dtype,
                };
                let (d, g) = self.module_bwd(m, dx, mlp_in, move |dy, f| {
                    let g = moe.backward(
                        comm,
                        &ep,
                        EpWeights {
                            router: f.full(&n2[0])?,
                            gate_up: f.full(&n2[1])?,
                            down: f.full(&n2[2])?,
                        },
                        c,
                        dy,
                    )?;
                    Ok((g.dx, vec![g.drouter, g.dgate_up, g.ddown]))
                })?;
                (d, nm.into_iter().zip(g).collect())
            }
        })
    }

    /// Backward of the attention block `a` (GQA or MLA) from `dh`: the input gradient and the
    /// weight gradients in [`Self::attn_names`] order.
    fn attn_bwd(
        &mut self,
        a: &str,
        attn: &AttnC,
        attn_in: &Meta,
        dh: DTensor,
    ) -> RtResult<(DTensor, Vec<Tensor<f32>>)> {
        Ok(match attn {
            AttnC::Gqa(c) => {
                let (cfg, a2) = (self.config, a.to_owned());
                self.module_bwd(a, dh, attn_in, move |dy, f| {
                    let me = GqaView { config: cfg };
                    let att = me.gqa(f, &a2)?;
                    let g = att.backward(me.params(f, &a2)?, c, dy)?;
                    let mut v = vec![g.dq, g.dk, g.dv, g.do_];
                    if let (Some(q), Some(k)) = (g.dq_norm, g.dk_norm) {
                        v.extend([q, k]);
                    }
                    Ok((g.dx, v))
                })?
            }
            AttnC::Mla(c) => {
                let mla = self.mla()?;
                let lora = self.config.mla.is_some_and(|m| m.q_lora_rank.is_some());
                let a2 = a.to_owned();
                self.module_bwd(a, dh, attn_in, move |dy, f| {
                    let g = mla.backward(mla_params_of(f, &a2, lora)?, c, dy)?;
                    let mut v = Vec::new();
                    if lora {
                        v.extend([
                            g.dq_a
                                .ok_or_else(|| RuntimeError::plan("MLA q_a gradient missing"))?,
                            g.dq_a_norm.ok_or_else(|| {
                                RuntimeError::plan("MLA q_a norm gradient missing")
                            })?,
                            g.dq_b
                                .ok_or_else(|| RuntimeError::plan("MLA q_b gradient missing"))?,
                        ]);
                    } else {
                        v.push(g.dq.ok_or_else(|| RuntimeError::plan("MLA q gradient missing"))?);
                    }
                    v.extend([g.dkv_a, g.dkv_a_norm, g.dkv_b, g.do_]);
                    Ok((g.dx, v))
                })?
            }
        })
    }

    fn norm_bwd(
        &mut self,
        module: &str,
        dy: DTensor,
        cache: &RmsNormCache<f32>,
        x: &Meta,
    ) -> RtResult<(DTensor, Tensor<f32>)> {
        let w = format!("{module}.weight");
        let norm = self.norm();
        self.module_bwd(module, dy, x, move |dy, f| {
            let g = norm.backward(f.full(&w)?, cache, dy)?;
            Ok((g.dx, g.dweight))
        })
    }

    fn bwd_add(&mut self, a: &DTensor, b: &DTensor) -> RtResult<DTensor> {
        let t = self.ctx.bwd(|| Ok(a.local.add(&b.local)?))?;
        Ok(DTensor::new(t, a.global.clone(), a.layout.clone()))
    }

    fn head_fwd(&mut self, x: DTensor, targets: &[usize]) -> RtResult<f32> {
        let (xn, norm, norm_in) = self.norm_fwd("model.norm", x)?;
        let w = "lm_head.weight".to_string();
        let (logits, head, head_in) = self.module_fwd(
            "lm_head",
            xn,
            OpKind::Linear,
            std::slice::from_ref(&w),
            self.config.vocab,
            |x, f| Ok(Linear.forward(f.full("lm_head.weight")?, x)?),
        )?;
        let (loss_t, ce) =
            self.ctx
                .op(OpKind::CrossEntropy, &[logits.layout.as_ref()], &[], || {
                    let (loss, ce) = CrossEntropy.forward(&logits.local, targets)?;
                    Ok((Tensor::from_vec(&[], vec![loss])?, ce))
                })?;
        self.head = Some(HeadC {
            norm,
            norm_in,
            head,
            head_in,
            ce,
            logits: logits.meta(),
        });
        Ok(loss_t.local.as_slice()[0])
    }

    fn head_bwd(&mut self) -> RtResult<(UnitGrads, DTensor)> {
        let hc = self
            .head
            .take()
            .ok_or_else(|| RuntimeError::plan("head backward without forward"))?;
        let dlogits = self
            .ctx
            .bwd(|| Ok(CrossEntropy.backward(&hc.ce, 1.0f32)?))?;
        let dlogits = DTensor::new(dlogits, hc.logits.global.clone(), hc.logits.layout.clone());
        let w = "lm_head.weight".to_string();
        let head = &hc.head;
        let (dxn, dw) = self.module_bwd("lm_head", dlogits, &hc.head_in, move |dy, f| {
            let g = Linear.backward(f.full(&w)?, head, dy)?;
            Ok((g.dx, g.dweight))
        })?;
        let (dx, dnorm) = self.norm_bwd("model.norm", dxn, &hc.norm, &hc.norm_in)?;
        Ok((
            vec![
                ("model.norm.weight".to_string(), dnorm),
                ("lm_head.weight".to_string(), dw),
            ],
            dx,
        ))
    }
}

/// The GQA operator and weights of one attention module, borrowed from the FSDP runtime.
struct GqaView {
    config: ModelConfig,
}

impl GqaView {
    fn gqa(&self, f: &FsdpRuntime, a: &str) -> RtResult<SelfAttention> {
        let c = &self.config;
        let q = f.full(&format!("{a}.q_proj.weight"))?;
        let k = f.full(&format!("{a}.k_proj.weight"))?;
        let d = c.head_dim;
        if !q.shape()[0].is_multiple_of(d) || !k.shape()[0].is_multiple_of(d) {
            return Err(RuntimeError::plan(format!(
                "{a}: local q/k rows {}/{} are not whole heads of {d}",
                q.shape()[0],
                k.shape()[0]
            )));
        }
        Ok(SelfAttention {
            heads: q.shape()[0] / d,
            kv_heads: k.shape()[0] / d,
            head_dim: d,
            rope_theta: c.rope_theta,
            qk_norm_eps: c.qk_norm.then_some(c.rms_eps),
        })
    }

    fn params<'a>(&self, f: &'a FsdpRuntime, a: &str) -> RtResult<SelfAttentionParams<'a, f32>> {
        let opt = |n: &str| -> RtResult<Option<&'a Tensor<f32>>> {
            if self.config.qk_norm {
                Ok(Some(f.full(&format!("{a}.{n}"))?))
            } else {
                Ok(None)
            }
        };
        Ok(SelfAttentionParams {
            q: f.full(&format!("{a}.q_proj.weight"))?,
            k: f.full(&format!("{a}.k_proj.weight"))?,
            v: f.full(&format!("{a}.v_proj.weight"))?,
            o: f.full(&format!("{a}.o_proj.weight"))?,
            q_norm: opt("q_norm.weight")?,
            k_norm: opt("k_norm.weight")?,
        })
    }
}

fn mla_params_of<'a>(f: &'a FsdpRuntime, a: &str, lora: bool) -> RtResult<MlaParams<'a, f32>> {
    let opt = |n: &str, want: bool| -> RtResult<Option<&'a Tensor<f32>>> {
        if want {
            Ok(Some(f.full(&format!("{a}.{n}"))?))
        } else {
            Ok(None)
        }
    };
    Ok(MlaParams {
        q_a: opt("q_a_proj.weight", lora)?,
        q_a_norm: opt("q_a_layernorm.weight", lora)?,
        q_b: opt("q_b_proj.weight", lora)?,
        q: opt("q_proj.weight", !lora)?,
        kv_a: f.full(&format!("{a}.kv_a_proj_with_mqa.weight"))?,
        kv_a_norm: f.full(&format!("{a}.kv_a_layernorm.weight"))?,
        kv_b: f.full(&format!("{a}.kv_b_proj.weight"))?,
        o: f.full(&format!("{a}.o_proj.weight"))?,
    })
}
