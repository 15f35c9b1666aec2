//! Expert parallelism: the MoE layer with experts split on dim 0 over the `ep` group and a
//! token all-to-all (a "local map" region, the same local kernels in both modes).
//!
//! Forward: route locally (softmax router, top-k with lowest-index ties, optional
//! renormalisation — exactly [`crate::ops::Moe`]); exchange the routed rows per destination
//! rank (all-to-all); send each routed token's row to the rank owning the expert (all-to-all-v,
//! ordered by expert, then token) and its global expert id (a second all-to-all-v, forward
//! only: HyperParallel `ep_routed_forward`, step 3); run the fused SwiGLU experts per (expert, source) block;
//! send the outputs back (all-to-all-v) and combine in ascending expert order with one fused
//! multiply-add per step. Backward mirrors it. Each expert's weight gradient is the sum over
//! source ranks, **in ascending EP rank order**, of that source's per-token-block gradient —
//! exactly the per-micro-batch gradient a single device computes, summed in the canonical
//! order the verification harness uses. The routed rows travel in the activation wire dtype
//! ([`super::wire`]); a single device matches with [`crate::ops::ExpertWire`].

use hpfsdp_backends::{Collective, CollectiveExt};

use super::error::{RtResult, RuntimeError};
use super::topo::MyGroup;
use super::wire::{self, ActDType};
use crate::matmul::{MatRef, gemm, matmul, matmul_nt, matmul_tn};
use crate::ops::activation::{silu, silu_grad, softmax_backward_row, softmax_in_place};
use crate::ops::moe::top_k_lowest_index_ties;
use crate::reduce::dot;
use crate::tensor::Tensor;

/// The expert-parallel MoE layer (global expert count; local experts are `experts / ep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpMoe {
    /// Routed experts (global).
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Expert intermediate size.
    pub intermediate: usize,
    /// Renormalise the selected probabilities.
    pub norm_topk_prob: bool,
    /// Element type of the routed rows in the all-to-all-v exchanges (the token counts
    /// always travel as exact f32).
    pub wire: ActDType,
}

/// The weights an expert-parallel MoE layer reads on one rank.
#[derive(Debug, Clone, Copy)]
pub struct EpWeights<'a> {
    /// Replicated router `[E, H]`.
    pub router: &'a Tensor<f32>,
    /// Local experts' fused gate/up `[E/ep, 2I, H]`.
    pub gate_up: &'a Tensor<f32>,
    /// Local experts' down projections `[E/ep, H, I]`.
    pub down: &'a Tensor<f32>,
}

/// One (local expert, source rank) block on the expert side.
#[derive(Debug, Clone, Default)]
struct Block {
    n: usize,
    x: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

/// What [`EpMoe::backward`] needs.
#[derive(Debug, Clone)]
pub struct EpMoeCache {
    x: Tensor<f32>,
    probs: Tensor<f32>,
    selected: Vec<Vec<usize>>,
    /// Per global expert: routed tokens (ascending), weights and returned output rows.
    routed: Vec<Vec<usize>>,
    route_w: Vec<Vec<f32>>,
    outs: Vec<Vec<f32>>,
    /// Per local expert, per source member.
    blocks: Vec<Vec<Block>>,
    /// Rows sent to / received from each member.
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
}

/// Gradients of the expert-parallel MoE layer on one rank.
#[derive(Debug, Clone)]
pub struct EpMoeGrads {
    /// `dL/dx` `[tokens, H]`.
    pub dx: Tensor<f32>,
    /// Router `[E, H]` (this rank's tokens).
    pub drouter: Tensor<f32>,
    /// Local experts `[E/ep, 2I, H]`.
    pub dgate_up: Tensor<f32>,
    /// Local experts `[E/ep, H, I]`.
    pub ddown: Tensor<f32>,
}

fn expert_matrix(t: &Tensor<f32>, e: usize) -> RtResult<MatRef<'_, f32>> {
    let (rows, cols) = (t.shape()[1], t.shape()[2]);
    Ok(MatRef::row_major(
        &t.as_slice()[e * rows * cols..],
        rows,
        cols,
    )?)
}

fn add_into(acc: &mut Option<Vec<f32>>, v: Vec<f32>) {
    match acc {
        None => *acc = Some(v),
        Some(a) => a.iter_mut().zip(v).for_each(|(x, y)| *x += y),
    }
}

impl EpMoe {
    fn local_experts(&self, ep: &MyGroup) -> RtResult<usize> {
        if !self.experts.is_multiple_of(ep.size()) {
            return Err(RuntimeError::plan(format!(
                "{} experts do not split over an ep group of {}",
                self.experts,
                ep.size()
            )));
        }
        Ok(self.experts / ep.size())
    }

    /// Forward on this rank's tokens `x` `[T, H]`: route, dispatch, expert compute, combine.
    pub fn forward(
        &self,
        comm: &dyn Collective,
        ep: &MyGroup,
        w: EpWeights<'_>,
        x: &Tensor<f32>,
    ) -> RtResult<(Tensor<f32>, EpMoeCache)> {
        let (tokens, hidden) = x.dims2("moe_ep")?;
        let (inter, el) = (self.intermediate, self.local_experts(ep)?);
        w.gate_up
            .expect_shape("moe_ep gate_up_proj", &[el, 2 * inter, hidden])?;
        w.down
            .expect_shape("moe_ep down_proj", &[el, hidden, inter])?;
        let route = self.route(x, w.router)?;
        let Dispatched {
            mut blocks,
            send_rows,
            recv_rows,
        } = self.dispatch(comm, ep, x, &route.routed)?;
        let back = self.expert_forward(w, &mut blocks, ep.size())?;
        let rows = Rows {
            send: send_rows,
            recv: recv_rows,
            hidden,
        };
        let ret = wire::all_to_all_v(
            comm,
            &ep.group,
            back,
            &rows.recv_elems(),
            &rows.send_elems(),
            self.wire,
        )?;
        let mut outs = vec![Vec::new(); self.experts];
        let mut at = 0;
        for (e, tokens_e) in route.routed.iter().enumerate() {
            let n = tokens_e.len() * hidden;
            outs[e] = ret[at..at + n].to_vec();
            at += n;
        }
        let mut y = Tensor::zeros(&[tokens, hidden]);
        for (e, out_e) in outs.iter().enumerate() {
            for (row, (&t, &w)) in route.routed[e].iter().zip(&route.route_w[e]).enumerate() {
                let src = &out_e[row * hidden..(row + 1) * hidden];
                for (o, &h) in y.row_mut(t).iter_mut().zip(src) {
                    *o = w.mul_add(h, *o);
                }
            }
        }
        Ok((
            y,
            EpMoeCache {
                x: x.clone(),
                probs: route.probs,
                selected: route.selected,
                routed: route.routed,
                route_w: route.route_w,
                outs,
                blocks,
                send_rows: rows.send,
                recv_rows: rows.recv,
            },
        ))
    }

    /// Router softmax, top-k (lowest index wins ties) and optional renormalisation: the tokens
    /// and weights routed to each expert, in token order.
    fn route(&self, x: &Tensor<f32>, router: &Tensor<f32>) -> RtResult<Routing> {
        let (tokens, _) = x.dims2("moe_ep")?;
        let mut probs = matmul_nt(x, router)?;
        for t in 0..tokens {
            softmax_in_place(probs.row_mut(t));
        }
        let selected: Vec<Vec<usize>> = (0..tokens)
            .map(|t| top_k_lowest_index_ties(probs.row(t), self.top_k))
            .collect();
        let mut routed = vec![Vec::new(); self.experts];
        let mut route_w = vec![Vec::new(); self.experts];
        for (t, sel) in selected.iter().enumerate() {
            let pr = probs.row(t);
            let mut w: Vec<f32> = sel.iter().map(|&e| pr[e]).collect();
            if self.norm_topk_prob {
                let mut s = 0.0f32;
                for &v in &w {
                    s += v;
                }
                for v in &mut w {
                    *v /= s;
                }
            }
            for (slot, &e) in sel.iter().enumerate() {
                routed[e].push(t);
                route_w[e].push(w[slot]);
            }
        }
        Ok(Routing {
            probs,
            selected,
            routed,
            route_w,
        })
    }

    /// Token exchange as HyperParallel's `ep_routed_forward` issues it: the routed rows per
    /// destination member (f32, exact) with an all-to-all, then the routed rows (ordered by
    /// global expert, then token, i.e. by destination member, then expert) with an
    /// all-to-all-v, then every row's global expert id (f32, exact) with a second all-to-all-v
    /// over the same counts. The received rows split into (local expert, source) blocks by
    /// their ids. Returns the blocks and the rows sent to / received from each member.
    fn dispatch(
        &self,
        comm: &dyn Collective,
        ep: &MyGroup,
        x: &Tensor<f32>,
        routed: &[Vec<usize>],
    ) -> RtResult<Dispatched> {
        let (_, hidden) = x.dims2("moe_ep")?;
        let (el, p) = (self.local_experts(ep)?, ep.size());
        let send_rows: Vec<usize> = (0..p)
            .map(|j| (0..el).map(|l| routed[j * el + l].len()).sum())
            .collect();
        let counts: Vec<f32> = send_rows.iter().map(|&r| r as f32).collect();
        let recv_rows: Vec<usize> = comm
            .all_to_all_vec(&ep.group, counts)?
            .into_iter()
            .map(|c| c as usize)
            .collect();
        let mut send = Vec::with_capacity(send_rows.iter().sum::<usize>() * hidden);
        let mut ids = Vec::with_capacity(send_rows.iter().sum::<usize>());
        for (e, tokens_e) in routed.iter().enumerate() {
            for &t in tokens_e {
                send.extend_from_slice(x.row(t));
                ids.push(e as f32);
            }
        }
        let scale = |v: &[usize]| v.iter().map(|r| r * hidden).collect::<Vec<_>>();
        let recv = wire::all_to_all_v(
            comm,
            &ep.group,
            send,
            &scale(&send_rows),
            &scale(&recv_rows),
            self.wire,
        )?;
        let recv_ids = comm.all_to_all_v_vec(&ep.group, ids, &send_rows, &recv_rows)?;
        let recv_n = self.rows_per_local_expert(ep, &recv_ids, &recv_rows)?;
        let mut blocks: Vec<Vec<Block>> = vec![vec![Block::default(); p]; el];
        let mut at = 0;
        for (s, row) in recv_n.iter().enumerate() {
            for (l, &n) in row.iter().enumerate() {
                blocks[l][s] = Block {
                    n,
                    x: recv[at..at + n * hidden].to_vec(),
                    ..Block::default()
                };
                at += n * hidden;
            }
        }
        Ok(Dispatched {
            blocks,
            send_rows,
            recv_rows,
        })
    }

    /// Rows per (source member, local expert) from the received global expert ids: each
    /// source's rows arrive ordered by expert, all of them owned by this member.
    fn rows_per_local_expert(
        &self,
        ep: &MyGroup,
        ids: &[f32],
        recv_rows: &[usize],
    ) -> RtResult<Vec<Vec<usize>>> {
        let el = self.local_experts(ep)?;
        let offset = ep.index * el;
        let mut out = vec![vec![0usize; el]; recv_rows.len()];
        let mut at = 0;
        for (s, &rows) in recv_rows.iter().enumerate() {
            let mut last = 0;
            for &id in &ids[at..at + rows] {
                let local = (id as usize).checked_sub(offset).filter(|&l| l < el);
                match local {
                    Some(l) if l >= last => {
                        out[s][l] += 1;
                        last = l;
                    }
                    _ => {
                        return Err(RuntimeError::plan(format!(
                            "EP member {} received expert id {id} from member {s} out of its \
                             experts {offset}..{} or out of expert order",
                            ep.index,
                            offset + el
                        )));
                    }
                }
            }
            at += rows;
        }
        Ok(out)
    }

    /// Expert SwiGLU on every (local expert, source) block, keeping the activations in the
    /// blocks; the outputs packed by source, then local expert (the combine's send order).
    fn expert_forward(
        &self,
        w: EpWeights<'_>,
        blocks: &mut [Vec<Block>],
        p: usize,
    ) -> RtResult<Vec<f32>> {
        let inter = self.intermediate;
        let mut outs_local: Vec<Vec<Vec<f32>>> = vec![vec![Vec::new(); p]; blocks.len()];
        for (l, per_src) in blocks.iter_mut().enumerate() {
            let gu_w = expert_matrix(w.gate_up, l)?;
            let down_w = expert_matrix(w.down, l)?;
            let hidden = w.down.shape()[1];
            for (s, b) in per_src.iter_mut().enumerate() {
                if b.n == 0 {
                    continue;
                }
                b.gate_up = vec![0.0; b.n * 2 * inter];
                gemm(
                    MatRef::row_major(&b.x, b.n, hidden)?,
                    gu_w.t(),
                    &mut b.gate_up,
                )?;
                b.act = b
                    .gate_up
                    .chunks_exact(2 * inter)
                    .flat_map(|r| (0..inter).map(move |j| silu(r[j]) * r[inter + j]))
                    .collect();
                let mut out = vec![0.0; b.n * hidden];
                gemm(MatRef::row_major(&b.act, b.n, inter)?, down_w.t(), &mut out)?;
                outs_local[l][s] = out;
            }
        }
        let mut back = Vec::new();
        for s in 0..p {
            for outs in &outs_local {
                back.extend_from_slice(&outs[s]);
            }
        }
        Ok(back)
    }

    /// Backward from `dy` `[T, H]`: combine, token exchange, expert backward, token exchange
    /// back, router.
    pub fn backward(
        &self,
        comm: &dyn Collective,
        ep: &MyGroup,
        w: EpWeights<'_>,
        cache: &EpMoeCache,
        dy: &Tensor<f32>,
    ) -> RtResult<EpMoeGrads> {
        let (tokens, hidden) = cache.x.dims2("moe_ep backward")?;
        dy.expect_shape("moe_ep backward", &[tokens, hidden])?;
        let e_count = self.experts;
        let mut dw = Tensor::zeros(&[tokens, e_count]);
        let mut send = Vec::new();
        for e in 0..e_count {
            for (row, (&t, &w)) in cache.routed[e].iter().zip(&cache.route_w[e]).enumerate() {
                let dyt = dy.row(t);
                send.extend(dyt.iter().map(|&g| w * g));
                dw.row_mut(t)[e] = dot(dyt, &cache.outs[e][row * hidden..(row + 1) * hidden]);
            }
        }
        let scale = |v: &[usize]| v.iter().map(|r| r * hidden).collect::<Vec<_>>();
        let recv = wire::all_to_all_v(
            comm,
            &ep.group,
            send,
            &scale(&cache.send_rows),
            &scale(&cache.recv_rows),
            self.wire,
        )?;
        let (dgate_up, ddown, back) = self.expert_backward(ep, w, cache, &recv)?;
        let ret = wire::all_to_all_v(
            comm,
            &ep.group,
            back,
            &scale(&cache.recv_rows),
            &scale(&cache.send_rows),
            self.wire,
        )?;
        let mut dx = Tensor::zeros(&[tokens, hidden]);
        let mut at = 0;
        for e in 0..e_count {
            for &t in &cache.routed[e] {
                for (o, &v) in dx.row_mut(t).iter_mut().zip(&ret[at..at + hidden]) {
                    *o += v;
                }
                at += hidden;
            }
        }
        let dlogits = self.router_backward(cache, &dw)?;
        let drouter = matmul_tn(&dlogits, &cache.x)?;
        let dx = dx.add(&matmul(&dlogits, w.router)?)?;
        Ok(EpMoeGrads {
            dx,
            drouter,
            dgate_up,
            ddown,
        })
    }

    /// Expert backward on the received output gradients `recv` (ordered by source, then local
    /// expert): the expert weight gradients (summed over sources in source order) and the input
    /// gradients packed in the same order for the return exchange.
    fn expert_backward(
        &self,
        ep: &MyGroup,
        w: EpWeights<'_>,
        cache: &EpMoeCache,
        recv: &[f32],
    ) -> RtResult<(Tensor<f32>, Tensor<f32>, Vec<f32>)> {
        let (_, hidden) = cache.x.dims2("moe_ep backward")?;
        let (inter, el, p) = (self.intermediate, self.local_experts(ep)?, ep.size());
        let mut dgate_up = Tensor::zeros(&[el, 2 * inter, hidden]);
        let mut ddown = Tensor::zeros(&[el, hidden, inter]);
        let mut dx_local: Vec<Vec<Vec<f32>>> = vec![vec![Vec::new(); p]; el];
        let mut offsets = vec![vec![0usize; el]; p];
        let mut at = 0;
        for (s, off) in offsets.iter_mut().enumerate() {
            for (l, o) in off.iter_mut().enumerate() {
                *o = at;
                at += cache.blocks[l][s].n * hidden;
            }
        }
        for l in 0..el {
            let gu_w = expert_matrix(w.gate_up, l)?;
            let down_w = expert_matrix(w.down, l)?;
            let (mut acc_gu, mut acc_dd) = (None, None);
            for s in 0..p {
                let b = &cache.blocks[l][s];
                let n = b.n;
                let (mut c_dd, mut c_gu) =
                    (vec![0.0; hidden * inter], vec![0.0; 2 * inter * hidden]);
                if n > 0 {
                    let dh = &recv[offsets[s][l]..offsets[s][l] + n * hidden];
                    let dhm = MatRef::row_major(dh, n, hidden)?;
                    let actm = MatRef::row_major(&b.act, n, inter)?;
                    gemm(dhm.t(), actm, &mut c_dd)?;
                    let mut dact = vec![0.0; n * inter];
                    gemm(dhm, down_w, &mut dact)?;
                    let mut dgu = vec![0.0; n * 2 * inter];
                    for ((dr, gr), dar) in dgu
                        .chunks_exact_mut(2 * inter)
                        .zip(b.gate_up.chunks_exact(2 * inter))
                        .zip(dact.chunks_exact(inter))
                    {
                        for j in 0..inter {
                            let (g, u, d) = (gr[j], gr[inter + j], dar[j]);
                            dr[j] = d * u * silu_grad(g);
                            dr[inter + j] = d * silu(g);
                        }
                    }
                    let dgum = MatRef::row_major(&dgu, n, 2 * inter)?;
                    gemm(dgum.t(), MatRef::row_major(&b.x, n, hidden)?, &mut c_gu)?;
                    let mut dxe = vec![0.0; n * hidden];
                    gemm(dgum, gu_w, &mut dxe)?;
                    dx_local[l][s] = dxe;
                }
                add_into(&mut acc_dd, c_dd);
                add_into(&mut acc_gu, c_gu);
            }
            if let (Some(dd), Some(gu)) = (acc_dd, acc_gu) {
                ddown.as_mut_slice()[l * hidden * inter..(l + 1) * hidden * inter]
                    .copy_from_slice(&dd);
                dgate_up.as_mut_slice()[l * 2 * inter * hidden..(l + 1) * 2 * inter * hidden]
                    .copy_from_slice(&gu);
            }
        }
        let mut back = Vec::new();
        for s in 0..p {
            for per in &dx_local {
                back.extend_from_slice(&per[s]);
            }
        }
        Ok((dgate_up, ddown, back))
    }

    /// Router logits gradient through the top-k renormalisation and the softmax (as
    /// `Moe::backward`), from the gradient `dw` of each token's routing weights.
    fn router_backward(&self, cache: &EpMoeCache, dw: &Tensor<f32>) -> RtResult<Tensor<f32>> {
        let (tokens, _) = cache.x.dims2("moe_ep backward")?;
        let e_count = self.experts;
        let mut dlogits = Tensor::zeros(&[tokens, e_count]);
        let mut dp = vec![0.0f32; e_count];
        for t in 0..tokens {
            let (pr, sel, dwr) = (cache.probs.row(t), &cache.selected[t], dw.row(t));
            dp.fill(0.0);
            if self.norm_topk_prob {
                let mut s = 0.0f32;
                for &e in sel {
                    s += pr[e];
                }
                let mut c = 0.0f32;
                for &e in sel {
                    c = dwr[e].mul_add(pr[e] / s, c);
                }
                for &e in sel {
                    dp[e] = (dwr[e] - c) / s;
                }
            } else {
                for &e in sel {
                    dp[e] = dwr[e];
                }
            }
            softmax_backward_row(pr, &dp, dlogits.row_mut(t));
        }
        Ok(dlogits)
    }
}

/// The router's decisions for one micro-batch: probabilities, each token's selected experts,
/// and per expert the tokens routed to it with their weights.
struct Routing {
    probs: Tensor<f32>,
    selected: Vec<Vec<usize>>,
    routed: Vec<Vec<usize>>,
    route_w: Vec<Vec<f32>>,
}

/// The token exchange's result: the received rows in (local expert, source) blocks, and the
/// rows sent to and received from each EP member.
struct Dispatched {
    blocks: Vec<Vec<Block>>,
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
}

/// Rows sent to and received from each EP member, and the row width.
struct Rows {
    send: Vec<usize>,
    recv: Vec<usize>,
    hidden: usize,
}

impl Rows {
    fn send_elems(&self) -> Vec<usize> {
        self.send.iter().map(|r| r * self.hidden).collect()
    }
    fn recv_elems(&self) -> Vec<usize> {
        self.recv.iter().map(|r| r * self.hidden).collect()
    }
}
