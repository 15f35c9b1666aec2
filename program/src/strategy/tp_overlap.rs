//! TP communication overlap (`[train] tp_comm_overlap`): a tensor-parallel collective fused
//! with the GEMM next to it and pipelined under it in chunks.
//!
//! Without overlap (`none`) a TP boundary collective is strictly serialized with compute: the
//! GEMM consuming a sequence-parallel all-gather waits for the whole gather, and the
//! reduce-scatter (or all-reduce) of a row-parallel output waits for the whole GEMM. Ascend
//! training stacks fuse the pair into one operator (torch_npu `npu_all_gather_base_mm`,
//! `npu_mm_reduce_scatter_base`, `npu_mm_all_reduce_base`, the CANN "MC2" kernels) that cuts
//! the collective and the matmul into pieces and pipelines them. `fused` models that as
//! chunked pipelining with `c` chunks along the token dimension (`m`):
//!
//! - **all-gather -> GEMM**: all-gather chunk `i` runs on the parallel stream while GEMM chunk
//!   `i - 1` runs on the compute stream; GEMM chunk `i` depends on all-gather chunk `i`;
//! - **GEMM -> reduce-scatter / all-reduce**: reduce chunk `i` depends on GEMM chunk `i`, so
//!   it runs under GEMM chunk `i + 1`.
//!
//! Which pairs fuse, per pass in emission order (the forward walks a stage's items in order,
//! the backward in reverse, with each collective's backward form):
//!
//! - a TP all-gather fuses with the next compute segment when only collectives lie between
//!   them and that segment's kernel list **starts** with a GEMM (the column-parallel
//!   projection consuming the gathered input); the nearest such gather is taken;
//! - a TP reduce-scatter or all-reduce fuses with the compute segment right before it (no
//!   other collective between) when that segment's kernel list **ends** with a GEMM (the
//!   row-parallel projection producing the partial output);
//! - only collectives moving data into a boundary's body (forward: its input side; backward:
//!   its output side, the gradient arriving) fuse as gathers, and only those moving data out
//!   of it as reduces: the forward gather of vocab-sharded logits (an output) is consumed by
//!   the loss, not by a GEMM, and stays serialized.
//!
//! A kernel list that starts (ends) with another kernel class consumes (produces) the tensor
//! with that kernel, which no fused operator covers: the pair stays serialized. That is also
//! why MoE expert blocks, whose output comes from the combine, do not fuse (MindSpeed-LLM
//! does not enable MC2 for MoE MLPs either).
//!
//! **Transitional lumps.** While segments carry a single memory-bound entry standing for all
//! their kernels (no GEMM entries), such a lump doing FLOPs is treated as the matmul as a
//! whole: all of it is chunked. This branch exists only for kernel lists without GEMMs; it
//! overstates the overlap (the whole segment pipelines, not one projection).
//!
//! Chunk shapes: a GEMM `[m, k] x [k, n]` becomes `c` GEMMs of `m / c` rows (the remainder
//! spread over the first chunks); every chunk re-reads the weight. A collective becomes `c`
//! collectives of the same kind on `1 / c` of the bytes (512-byte granules when the buffers
//! are 512-aligned). The chunk count is clamped to the rows of the GEMM and to the granules of
//! the collective. Every chunk is a separate op, so it pays its own launch and collective
//! latency: that is the cost side of the pipelining.
//!
//! The default chunk count is the TP degree: the fused kernels pipeline over the ranks of the
//! group (CANN's AllGatherMatmul tiles its work into a local tile and tiles of the other
//! ranks' data; torch_npu's `comm_turn = 0` means "the default split" and is the only value it
//! accepts). That it equals the TP degree is this model's assumption, not a measured fact.

use super::compute::{Item, Segment};
use super::parallel::{CollSpec, ParAxis, ParColl};
pub use super::tp_comm_overlap::TpCommOverlap;
use hpfsdp_plan::collective::CollectiveKind;
use hpfsdp_plan::kernel::{KernelClass, KernelWork};

/// The pass a stage is emitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Forward (or its recompute): items in order, forward kernels and collectives.
    Forward,
    /// Backward: items in reverse, backward kernels and collectives.
    Backward,
}

impl Pass {
    /// The kernels `segment` launches in this pass.
    pub fn kernels(self, segment: &Segment) -> &[KernelWork] {
        match self {
            Pass::Forward => &segment.fwd,
            Pass::Backward => &segment.bwd,
        }
    }

    /// The collective `coll` issues in this pass, if any.
    pub fn spec(self, coll: &ParColl) -> Option<CollSpec> {
        match self {
            Pass::Forward => coll.fwd,
            Pass::Backward => coll.bwd,
        }
    }

    /// Item indices of a stage of `n` items in emission order.
    pub fn order(self, n: usize) -> Vec<usize> {
        match self {
            Pass::Forward => (0..n).collect(),
            Pass::Backward => (0..n).rev().collect(),
        }
    }
}

/// How one compute segment is emitted when it takes part in fused pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSplit {
    /// Item index of the fused all-gather this segment consumes, if any.
    pub gather: Option<usize>,
    /// Item index of the fused reduce-scatter / all-reduce this segment feeds, if any.
    pub reduce: Option<usize>,
    /// Chunks of the leading GEMM (one kernel list per chunk) consuming the gather; when
    /// `shared`, also the chunks feeding the reduce. Empty without a fused gather.
    pub head: Vec<Vec<KernelWork>>,
    /// Kernels between the fused GEMMs, run as one op after the head chunks.
    pub body: Vec<KernelWork>,
    /// Chunks of the trailing GEMM feeding the reduce (empty when `shared` or without one).
    pub tail: Vec<Vec<KernelWork>>,
    /// The same chunks consume the gather and feed the reduce (a one-GEMM list or a lump).
    pub shared: bool,
}

/// How one fused collective is emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollSplit {
    /// Item index of the compute segment it is fused with.
    pub segment: usize,
    /// The chunk collectives, in issue order.
    pub chunks: Vec<CollSpec>,
}

/// The fused pairs of one stage in one pass, by item index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Per item: the split of a compute segment that is part of a fused pair.
    pub segments: Vec<Option<SegmentSplit>>,
    /// Per item: the chunks of a collective that is part of a fused pair.
    pub colls: Vec<Option<CollSplit>>,
}

impl StagePlan {
    /// True when nothing is fused.
    pub fn is_empty(&self) -> bool {
        self.segments.iter().all(Option::is_none) && self.colls.iter().all(Option::is_none)
    }
}

/// True for a transitional lump: one memory-bound entry that does FLOPs (a whole segment's
/// totals, see the module docs).
fn is_lump(kernels: &[KernelWork]) -> bool {
    matches!(kernels, [k] if k.class == KernelClass::MemoryBound && k.flops > 0)
}

fn is_gemm(k: &KernelWork) -> bool {
    matches!(k.class, KernelClass::Gemm { .. })
}

/// The side of its boundary a model-parallel collective sits on (`in` or `out`), from its
/// name `<module>.<side>.<tensor>.<axis>` ([`super::parallel`] names them so).
fn boundary_side(c: &ParColl) -> Option<&str> {
    c.name
        .rsplit('.')
        .nth(2)
        .filter(|s| *s == "in" || *s == "out")
}

/// The TP collective of `item` in `pass` when it is of one of `kinds` and sits on `side` of
/// its boundary.
fn tp_spec(item: &Item, pass: Pass, kinds: &[CollectiveKind], side: &str) -> Option<CollSpec> {
    match item {
        Item::Coll(c) if c.axis == ParAxis::Tp && boundary_side(c) == Some(side) => {
            pass.spec(c).filter(|s| kinds.contains(&s.kind))
        }
        _ => None,
    }
}

/// The boundary side whose collective flows into the body (`gather`) or out of it: in
/// forward the input is gathered and the output reduced; backward mirrors it.
fn side(pass: Pass, gather: bool) -> &'static str {
    match (pass, gather) {
        (Pass::Forward, true) | (Pass::Backward, false) => "in",
        (Pass::Forward, false) | (Pass::Backward, true) => "out",
    }
}

/// Emits an op in `pass`: a compute segment always, a collective when it has a form there.
fn emits(item: &Item, pass: Pass) -> bool {
    match item {
        Item::Compute(_) => true,
        Item::Coll(c) => pass.spec(c).is_some(),
    }
}

/// `total` split into `n` near-equal parts: part `i` (the remainder goes to the first parts).
pub fn part(total: u64, n: u64, i: u64) -> u64 {
    total / n + u64::from(i < total % n)
}

/// `x * num / den` without overflow (`den > 0`).
fn scale(x: u64, num: u64, den: u64) -> u64 {
    (x as u128 * num as u128 / den as u128) as u64
}

/// The largest chunk count `kernel` can be split into (rows of a GEMM; any for a lump).
fn kernel_chunk_limit(kernel: &KernelWork) -> u64 {
    match kernel.class {
        KernelClass::Gemm { m, .. } => m.max(1),
        _ => u64::MAX,
    }
}

/// The granule a collective's buffers split on: 512 bytes when both are 512-aligned.
fn granule(spec: &CollSpec) -> u64 {
    if spec.input_bytes.is_multiple_of(512) && spec.output_bytes.is_multiple_of(512) {
        512
    } else {
        1
    }
}

/// The per-rank shard of a collective (the smaller buffer) in granules.
fn shard_granules(spec: &CollSpec) -> u64 {
    (spec.input_bytes.min(spec.output_bytes) / granule(spec)).max(1)
}

/// Splits one kernel entry into `chunks` pieces along the token dimension.
///
/// A GEMM's `m` is split (at most `m` chunks are asked for): each chunk keeps `n`, `k` and
/// `batch`, gets its share of the FLOPs and of the activation bytes, and re-reads the whole
/// weight (`k * n * batch` elements, the element size inferred from the entry's bytes). Any
/// other class is split evenly: FLOPs, bytes and launches (at least one launch per chunk).
pub fn split_kernel(kernel: &KernelWork, chunks: u64) -> Vec<KernelWork> {
    let c = chunks.max(1);
    match kernel.class {
        KernelClass::Gemm { m, n, k, batch } if m > 0 => {
            let c = c.min(m);
            let launches = u64::from(kernel.count.max(1));
            let elems = m
                .saturating_mul(k)
                .saturating_add(k.saturating_mul(n))
                .saturating_add(m.saturating_mul(n))
                .saturating_mul(batch.max(1))
                .saturating_mul(launches);
            let elem_bytes = kernel.hbm_bytes.checked_div(elems).unwrap_or(0);
            let weight_bytes = k
                .saturating_mul(n)
                .saturating_mul(batch.max(1))
                .saturating_mul(launches)
                .saturating_mul(elem_bytes)
                .min(kernel.hbm_bytes);
            let act_bytes = kernel.hbm_bytes - weight_bytes;
            let mut done = (0u64, 0u64, 0u64);
            (0..c)
                .map(|i| {
                    let m_i = part(m, c, i);
                    let upto = done.0 + m_i;
                    // Cumulative shares keep the totals exact.
                    let flops = scale(kernel.flops, upto, m) - done.1;
                    let act = scale(act_bytes, upto, m) - done.2;
                    done = (upto, done.1 + flops, done.2 + act);
                    KernelWork {
                        class: KernelClass::Gemm {
                            m: m_i,
                            n,
                            k,
                            batch,
                        },
                        count: kernel.count,
                        flops,
                        hbm_bytes: weight_bytes + act,
                    }
                })
                .collect()
        }
        _ => (0..c)
            .map(|i| KernelWork {
                class: kernel.class,
                count: (part(u64::from(kernel.count), c, i) as u32).max(1),
                flops: part(kernel.flops, c, i),
                hbm_bytes: part(kernel.hbm_bytes, c, i),
            })
            .collect(),
    }
}

/// Splits a collective into `chunks` collectives of the same kind on `1 / chunks` of its
/// bytes: the shard (input of an all-gather, output of a reduce-scatter, either of an
/// all-reduce) is split on [`granule`]s and the other buffer keeps its ratio to it.
pub fn split_spec(spec: CollSpec, chunks: u64) -> Vec<CollSpec> {
    let g = granule(&spec);
    let c = chunks.max(1).min(shard_granules(&spec));
    let (shard, full) = match spec.kind {
        CollectiveKind::ReduceScatter => (spec.output_bytes, spec.input_bytes),
        _ => (spec.input_bytes, spec.output_bytes),
    };
    let units = shard / g;
    (0..c)
        .map(|i| {
            let piece = part(units, c, i) * g;
            let other = if shard > 0 && full.is_multiple_of(shard) {
                piece * (full / shard)
            } else {
                scale(full, piece, shard.max(1))
            };
            let (input_bytes, output_bytes) = match spec.kind {
                CollectiveKind::ReduceScatter => (other, piece),
                _ => (piece, other),
            };
            CollSpec {
                kind: spec.kind,
                input_bytes,
                output_bytes,
            }
        })
        .collect()
}

/// Splits a whole kernel list into `chunks` chunk lists (a lump: every entry split evenly).
fn split_list(kernels: &[KernelWork], chunks: u64) -> Vec<Vec<KernelWork>> {
    let pieces: Vec<Vec<KernelWork>> = kernels.iter().map(|k| split_kernel(k, chunks)).collect();
    (0..chunks as usize)
        .map(|i| pieces.iter().map(|p| p[i]).collect())
        .collect()
}

/// The fused all-gather a segment at emission position `pos` consumes: the nearest TP
/// all-gather among the collectives emitted right before it, when the segment's kernel list
/// starts with a GEMM (or is a lump).
fn fused_gather(items: &[Item], order: &[usize], pos: usize, pass: Pass) -> Option<usize> {
    let Item::Compute(s) = &items[order[pos]] else {
        return None;
    };
    let kernels = pass.kernels(s);
    if !(kernels.first().is_some_and(is_gemm) || is_lump(kernels)) {
        return None;
    }
    order[..pos]
        .iter()
        .rev()
        .take_while(|&&i| matches!(items[i], Item::Coll(_)))
        .find(|&&i| {
            tp_spec(
                &items[i],
                pass,
                &[CollectiveKind::AllGather],
                side(pass, true),
            )
            .is_some()
        })
        .copied()
}

/// The fused reduce a segment at emission position `pos` feeds: the first collective emitted
/// after it, when that is a TP reduce-scatter or all-reduce and the segment's kernel list
/// ends with a GEMM (or is a lump).
fn fused_reduce(items: &[Item], order: &[usize], pos: usize, pass: Pass) -> Option<usize> {
    let Item::Compute(s) = &items[order[pos]] else {
        return None;
    };
    let kernels = pass.kernels(s);
    if !(kernels.last().is_some_and(is_gemm) || is_lump(kernels)) {
        return None;
    }
    let next = order[pos + 1..]
        .iter()
        .copied()
        .find(|&i| emits(&items[i], pass))?;
    tp_spec(
        &items[next],
        pass,
        &[CollectiveKind::ReduceScatter, CollectiveKind::AllReduce],
        side(pass, false),
    )
    .map(|_| next)
}

/// The split of a segment fused with `gather` and/or `reduce`, in `chunks` chunks (already
/// clamped to what every party allows).
fn split_segment(
    kernels: &[KernelWork],
    gather: Option<usize>,
    reduce: Option<usize>,
    chunks: u64,
) -> SegmentSplit {
    let n = kernels.len();
    let lump = is_lump(kernels);
    let shared = gather.is_some() && reduce.is_some() && (lump || n == 1);
    let mut s = SegmentSplit {
        gather,
        reduce,
        head: Vec::new(),
        body: Vec::new(),
        tail: Vec::new(),
        shared,
    };
    if lump {
        let chunks = split_list(kernels, chunks);
        if gather.is_some() {
            s.head = chunks;
        } else {
            s.tail = chunks;
        }
        return s;
    }
    let lead = usize::from(gather.is_some());
    let trail = usize::from(reduce.is_some() && !shared);
    if gather.is_some() {
        s.head = split_list(&kernels[..1], chunks);
    }
    if trail == 1 {
        s.tail = split_list(&kernels[n - 1..], chunks);
    }
    s.body = kernels[lead..n - trail].to_vec();
    s
}

/// Finds the fused pairs of a stage's `items` in `pass` under `overlap` and splits their
/// GEMMs and collectives into chunks (see the module docs for the rules).
pub fn plan_stage(items: &[Item], pass: Pass, overlap: TpCommOverlap) -> StagePlan {
    let mut plan = StagePlan {
        segments: vec![None; items.len()],
        colls: vec![None; items.len()],
    };
    let Some(chunks) = overlap.chunks() else {
        return plan;
    };
    let order = pass.order(items.len());
    let spec_of = |i: usize| match &items[i] {
        Item::Coll(c) => pass.spec(c),
        Item::Compute(_) => None,
    };
    for pos in 0..order.len() {
        let si = order[pos];
        let Item::Compute(seg) = &items[si] else {
            continue;
        };
        let gather = fused_gather(items, &order, pos, pass).filter(|&g| plan.colls[g].is_none());
        let reduce = fused_reduce(items, &order, pos, pass);
        if gather.is_none() && reduce.is_none() {
            continue;
        }
        let kernels = pass.kernels(seg);
        // One chunk count for the whole segment: what the GEMMs and collectives allow.
        let mut c = chunks;
        if !is_lump(kernels) {
            if gather.is_some() {
                c = c.min(kernel_chunk_limit(&kernels[0]));
            }
            if reduce.is_some() {
                c = c.min(kernel_chunk_limit(&kernels[kernels.len() - 1]));
            }
        }
        for coll in [gather, reduce].into_iter().flatten() {
            if let Some(spec) = spec_of(coll) {
                c = c.min(shard_granules(&spec));
            }
        }
        let c = c.max(1);
        for coll in [gather, reduce].into_iter().flatten() {
            if let Some(spec) = spec_of(coll) {
                plan.colls[coll] = Some(CollSplit {
                    segment: si,
                    chunks: split_spec(spec, c),
                });
            }
        }
        plan.segments[si] = Some(split_segment(kernels, gather, reduce, c));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENS: u64 = 4096;
    const HIDDEN: u64 = 512;

    fn gemm(n: u64, k: u64) -> KernelWork {
        KernelWork::gemm(TOKENS, n, k, 1, 2)
    }

    fn mb(flops: u64) -> KernelWork {
        KernelWork::memory_bound(3, flops, 1 << 20)
    }

    fn seg(name: &str, fwd: Vec<KernelWork>, bwd: Vec<KernelWork>) -> Item {
        Item::Compute(Segment {
            name: name.into(),
            fwd,
            bwd,
            fwd_validation_events: 0,
            fwd_host_events: 0,
            bwd_host_events: 0,
            fwd_d2h_syncs: 0,
            pieces: 1,
        })
    }

    fn spec(kind: CollectiveKind, shard: u64, p: u64) -> CollSpec {
        let (input_bytes, output_bytes) = match kind {
            CollectiveKind::AllGather => (shard, shard * p),
            CollectiveKind::ReduceScatter => (shard * p, shard),
            _ => (shard, shard),
        };
        CollSpec {
            kind,
            input_bytes,
            output_bytes,
        }
    }

    fn coll(
        name: &str,
        axis: ParAxis,
        fwd: Option<CollectiveKind>,
        bwd: Option<CollectiveKind>,
    ) -> Item {
        let shard = TOKENS * HIDDEN * 2 / 4;
        Item::Coll(ParColl {
            name: name.into(),
            axis,
            fwd: fwd.map(|k| spec(k, shard, 4)),
            bwd: bwd.map(|k| spec(k, shard, 4)),
            wire_dtype: None,
            host_sync: false,
            call: Default::default(),
        })
    }

    use CollectiveKind::{AllGather as Ag, AllReduce as Ar, ReduceScatter as Rs};

    /// A sequence-parallel attention block with explicit GEMMs: gather in, column-parallel
    /// q/k/v, attention, row-parallel o, reduce-scatter out.
    fn sp_block() -> Vec<Item> {
        let fwd = vec![
            gemm(3 * HIDDEN / 4, HIDDEN),
            mb(10),
            gemm(HIDDEN, HIDDEN / 4),
        ];
        let bwd = vec![
            gemm(HIDDEN / 4, HIDDEN),
            gemm(HIDDEN, HIDDEN / 4),
            mb(20),
            gemm(HIDDEN, 3 * HIDDEN / 4),
        ];
        vec![
            seg("norm", vec![mb(5)], vec![mb(5)]),
            coll("attn.in.hidden_states.tp", ParAxis::Tp, Some(Ag), Some(Rs)),
            seg("attn", fwd, bwd),
            coll("attn.out.hidden_states.tp", ParAxis::Tp, Some(Rs), Some(Ag)),
            seg("residual", vec![mb(1)], vec![mb(1)]),
        ]
    }

    const FUSED4: TpCommOverlap = TpCommOverlap::Fused { chunks: 4 };

    #[test]
    fn modes_resolve_with_the_tp_degree_as_default_chunks() {
        for mode in hpfsdp_plan::scenario::TP_COMM_OVERLAP_MODES {
            assert!(TpCommOverlap::resolve(mode, None, 4).is_some(), "{mode}");
        }
        assert_eq!(
            TpCommOverlap::resolve("none", None, 4),
            Some(TpCommOverlap::None)
        );
        assert_eq!(TpCommOverlap::resolve("fused", None, 4), Some(FUSED4));
        assert_eq!(
            TpCommOverlap::resolve("fused", Some(2), 4),
            Some(TpCommOverlap::Fused { chunks: 2 })
        );
        assert_eq!(TpCommOverlap::resolve("fused", Some(0), 4), None);
        assert_eq!(TpCommOverlap::resolve("overlap", None, 4), None);
        assert_eq!(TpCommOverlap::default(), TpCommOverlap::None);
    }

    #[test]
    fn gemm_chunks_split_tokens_keep_flops_and_reread_the_weight() {
        let g = KernelWork::gemm(10, 64, 32, 1, 2);
        let parts = split_kernel(&g, 4);
        let ms: Vec<u64> = parts
            .iter()
            .map(|p| match p.class {
                KernelClass::Gemm { m, n, k, batch } => {
                    assert_eq!((n, k, batch), (64, 32, 1));
                    m
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ms, [3, 3, 2, 2]);
        for (p, &m) in parts.iter().zip(&ms) {
            // Exactly what a GEMM of that shape costs: the weight is read by every chunk.
            assert_eq!(*p, KernelWork::gemm(m, 64, 32, 1, 2));
        }
        assert_eq!(parts.iter().map(|p| p.flops).sum::<u64>(), g.flops);
        let weight = 64 * 32 * 2;
        assert_eq!(
            parts.iter().map(|p| p.hbm_bytes).sum::<u64>(),
            g.hbm_bytes + 3 * weight
        );
        // Never more chunks than rows.
        assert_eq!(split_kernel(&KernelWork::gemm(3, 8, 8, 1, 2), 8).len(), 3);
    }

    #[test]
    fn lump_chunks_keep_every_total() {
        let lump = KernelWork::memory_bound(19, 1_000_003, 777_777);
        let parts = split_kernel(&lump, 4);
        assert_eq!(parts.len(), 4);
        assert_eq!(
            hpfsdp_plan::kernel::totals(&parts),
            (1_000_003, 777_777, 19)
        );
        let few = split_kernel(&KernelWork::memory_bound(2, 9, 9), 4);
        assert!(few.iter().all(|p| p.count >= 1), "every chunk launches");
    }

    #[test]
    fn collective_chunks_keep_kind_ratio_and_bytes_on_512_byte_granules() {
        for kind in [Ag, Rs, Ar] {
            let s = spec(kind, 5 * 512, 4);
            let parts = split_spec(s, 2);
            assert_eq!(parts.len(), 2);
            assert!(parts.iter().all(|p| p.kind == kind));
            assert_eq!(
                parts.iter().map(|p| p.input_bytes).sum::<u64>(),
                s.input_bytes
            );
            assert_eq!(
                parts.iter().map(|p| p.output_bytes).sum::<u64>(),
                s.output_bytes
            );
            let shard = |p: &CollSpec| p.input_bytes.min(p.output_bytes);
            assert_eq!((shard(&parts[0]), shard(&parts[1])), (3 * 512, 2 * 512));
            assert!(parts.iter().all(|p| p.input_bytes.is_multiple_of(512)));
        }
        // Unaligned buffers split on bytes; never more chunks than granules.
        let odd = split_spec(spec(Ag, 7, 4), 3);
        assert_eq!(
            odd.iter().map(|p| p.input_bytes).collect::<Vec<_>>(),
            [3, 2, 2]
        );
        assert_eq!(odd[0].output_bytes, 12);
        assert_eq!(split_spec(spec(Ag, 512, 4), 4).len(), 1);
    }

    #[test]
    fn forward_fuses_the_gather_with_the_first_gemm_and_the_last_gemm_with_the_reduce() {
        let items = sp_block();
        let plan = plan_stage(&items, Pass::Forward, FUSED4);
        let s = plan.segments[2].as_ref().expect("attn is fused");
        assert_eq!((s.gather, s.reduce, s.shared), (Some(1), Some(3), false));
        let Item::Compute(attn) = &items[2] else {
            unreachable!()
        };
        assert_eq!(s.head.len(), 4);
        assert_eq!(s.tail.len(), 4);
        let rows = |chunks: &[Vec<KernelWork>]| -> u64 {
            chunks
                .iter()
                .map(|c| match c[..] {
                    [
                        KernelWork {
                            class: KernelClass::Gemm { m, .. },
                            ..
                        },
                    ] => m,
                    _ => panic!("a chunk is one GEMM: {c:?}"),
                })
                .sum()
        };
        assert_eq!((rows(&s.head), rows(&s.tail)), (TOKENS, TOKENS));
        assert_eq!(s.body, attn.fwd[1..2], "attention core runs as before");
        for (i, kind) in [(1, Ag), (3, Rs)] {
            let c = plan.colls[i].as_ref().unwrap();
            assert_eq!(c.segment, 2);
            assert_eq!(c.chunks.len(), 4);
            assert!(c.chunks.iter().all(|x| x.kind == kind));
        }
        // The norm and residual segments touch no fusible collective.
        for i in [0, 4] {
            assert!(plan.segments[i].is_none());
        }
        assert!(plan_stage(&items, Pass::Forward, TpCommOverlap::None).is_empty());
    }

    #[test]
    fn backward_fuses_the_mirrored_pairs() {
        // Backward walks items in reverse: the out boundary's gradient all-gather feeds the
        // first backward GEMM; the last backward GEMM feeds the in boundary's reduce-scatter.
        let items = sp_block();
        let plan = plan_stage(&items, Pass::Backward, FUSED4);
        let s = plan.segments[2].as_ref().expect("attn backward is fused");
        assert_eq!((s.gather, s.reduce), (Some(3), Some(1)));
        let Item::Compute(attn) = &items[2] else {
            unreachable!()
        };
        assert_eq!(s.body, attn.bwd[1..3]);
        assert_eq!(plan.colls[3].as_ref().unwrap().chunks[0].kind, Ag);
        assert_eq!(plan.colls[1].as_ref().unwrap().chunks[0].kind, Rs);
    }

    #[test]
    fn without_sequence_parallelism_gemm_and_all_reduce_fuse_both_ways() {
        // Megatron's g (forward all-reduce of the row-parallel output) and f (backward
        // all-reduce of the input gradient).
        let items = vec![
            coll("mlp.in.hidden_states.tp", ParAxis::Tp, None, Some(Ar)),
            seg(
                "mlp",
                vec![gemm(256, HIDDEN), mb(4), gemm(HIDDEN, 256)],
                vec![gemm(256, HIDDEN), mb(4), gemm(HIDDEN, 256)],
            ),
            coll("mlp.out.hidden_states.tp", ParAxis::Tp, Some(Ar), None),
        ];
        let f = plan_stage(&items, Pass::Forward, FUSED4);
        let s = f.segments[1].as_ref().unwrap();
        assert_eq!((s.gather, s.reduce, s.head.len()), (None, Some(2), 0));
        assert_eq!(s.body.len(), 2);
        assert_eq!(f.colls[2].as_ref().unwrap().chunks[0].kind, Ar);
        let b = plan_stage(&items, Pass::Backward, FUSED4);
        let s = b.segments[1].as_ref().unwrap();
        assert_eq!((s.gather, s.reduce), (None, Some(0)));
        assert!(b.colls[2].is_none());
    }

    #[test]
    fn pairs_without_an_adjacent_gemm_stay_serialized() {
        let tp_in = || coll("x.in.hidden_states.tp", ParAxis::Tp, Some(Ag), None);
        let tp_out = || coll("x.out.hidden_states.tp", ParAxis::Tp, Some(Rs), None);
        // The gathered input is consumed by a memory-bound kernel first; the output is
        // produced by one (an MoE combine).
        let mb_first = vec![mb(1), gemm(64, HIDDEN), mb(2)];
        let items = vec![tp_in(), seg("x", mb_first, vec![]), tp_out()];
        assert!(plan_stage(&items, Pass::Forward, FUSED4).is_empty());
        // An expert-parallel exchange between the GEMM and the reduce-scatter.
        let items = vec![
            seg("x", vec![gemm(64, HIDDEN)], vec![]),
            coll(
                "x.combine.ep",
                ParAxis::Ep,
                Some(CollectiveKind::AllToAllV),
                None,
            ),
            tp_out(),
        ];
        assert!(plan_stage(&items, Pass::Forward, FUSED4).is_empty());
        // Context-parallel gathers never fuse; a memory-bound list without FLOPs (an
        // embedding lookup) is no lump.
        let items = vec![
            coll("x.kv.cp", ParAxis::Cp, Some(Ag), None),
            seg("x", vec![gemm(64, HIDDEN)], vec![]),
            seg("embed", vec![KernelWork::memory_bound(1, 0, 64)], vec![]),
            tp_out(),
        ];
        assert!(plan_stage(&items, Pass::Forward, FUSED4).is_empty());
    }

    #[test]
    fn output_gathers_and_input_reduces_do_not_fuse_forward() {
        // lm_head: the logits gather leaves the boundary; the loss after it is no GEMM
        // consumer even when its list starts with one.
        let items = vec![
            seg("lm_head", vec![gemm(1000, HIDDEN)], vec![]),
            coll("lm_head.out.logits.tp", ParAxis::Tp, Some(Ag), None),
            seg("loss", vec![gemm(8, 8), mb(4)], vec![]),
            coll("next.in.hidden_states.tp", ParAxis::Tp, Some(Rs), None),
        ];
        assert!(plan_stage(&items, Pass::Forward, FUSED4).is_empty());
        // A collective whose name has no boundary side never fuses.
        let items = vec![
            coll("attn.hidden_states.tp", ParAxis::Tp, Some(Ag), None),
            seg("attn", vec![gemm(64, HIDDEN)], vec![]),
        ];
        assert!(plan_stage(&items, Pass::Forward, FUSED4).is_empty());
    }

    #[test]
    fn a_gather_fuses_across_an_unrelated_collective() {
        // TP gather, then the CP K/V gather, then the projections: the TP gather still fuses.
        let items = vec![
            coll("attn.in.hidden_states.tp", ParAxis::Tp, Some(Ag), None),
            coll("attn.kv.cp", ParAxis::Cp, Some(Ag), None),
            seg("attn", vec![gemm(64, HIDDEN), mb(1)], vec![]),
        ];
        let plan = plan_stage(&items, Pass::Forward, FUSED4);
        assert_eq!(plan.segments[2].as_ref().unwrap().gather, Some(0));
        assert!(plan.colls[1].is_none());
    }

    #[test]
    fn a_lump_is_chunked_whole_and_shared_by_both_collectives() {
        let lump = KernelWork::memory_bound(19, 4_000_000, 8_000_000);
        let items = vec![
            coll("a.in.hidden_states.tp", ParAxis::Tp, Some(Ag), Some(Rs)),
            seg("a", vec![lump], vec![lump]),
            coll("a.out.hidden_states.tp", ParAxis::Tp, Some(Rs), Some(Ag)),
        ];
        let plan = plan_stage(&items, Pass::Forward, TpCommOverlap::Fused { chunks: 3 });
        let s = plan.segments[1].as_ref().unwrap();
        assert!(s.shared && s.body.is_empty() && s.tail.is_empty());
        assert_eq!(s.head.len(), 3);
        let all: Vec<KernelWork> = s.head.concat();
        assert_eq!(
            hpfsdp_plan::kernel::totals(&all),
            (4_000_000, 8_000_000, 19)
        );
        assert_eq!(plan.colls[0].as_ref().unwrap().chunks.len(), 3);
        assert_eq!(plan.colls[2].as_ref().unwrap().chunks.len(), 3);
    }

    #[test]
    fn one_chunk_count_per_segment_clamped_by_rows() {
        // A GEMM of 2 rows allows 2 chunks: the gather is cut in 2 as well.
        let items = vec![
            coll("a.in.hidden_states.tp", ParAxis::Tp, Some(Ag), None),
            seg("a", vec![KernelWork::gemm(2, 64, 64, 1, 2)], vec![]),
        ];
        let plan = plan_stage(&items, Pass::Forward, FUSED4);
        assert_eq!(plan.segments[1].as_ref().unwrap().head.len(), 2);
        assert_eq!(plan.colls[0].as_ref().unwrap().chunks.len(), 2);
    }

    /// Emission: the exp-a-mbs2 generator with every compute segment replaced by explicit
    /// GEMM lists (`[column GEMM, memory-bound, row GEMM]`), so this checks the emitter on
    /// real stage structure independently of how segments are built.
    mod emission {
        use super::*;
        use crate::step::{Category, OpId, Payload, StepProgram};
        use crate::strategy::{ProgramGenerator, StrategyKind};
        use hpfsdp_plan::fsdp::build_fsdp_plan;
        use hpfsdp_plan::planner::plan;
        use hpfsdp_plan::scenario::Scenario;
        use std::collections::HashMap;

        /// Tokens per rank and micro-batch of exp-a-mbs2 (2 x 4096 over TP 4).
        const RANK_TOKENS: u64 = 2048;

        fn generator(overlap: TpCommOverlap) -> ProgramGenerator {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../scenarios/paper/exp-a-mbs2.toml");
            let s = Scenario::load(&path).unwrap();
            let p = plan(&s.model, &s.planner_input());
            let f = build_fsdp_plan(&s, &p);
            let mut g = ProgramGenerator::new(&s, &p, &f, StrategyKind::HyperParallel).unwrap();
            g.ctx.opts.tp_comm_overlap = overlap;
            let list = || {
                vec![
                    KernelWork::gemm(RANK_TOKENS, 1536, 2048, 1, 2),
                    KernelWork::memory_bound(6, 1 << 20, 1 << 24),
                    KernelWork::gemm(RANK_TOKENS, 2048, 512, 1, 2),
                ]
            };
            for stage in &mut g.ctx.stages {
                for item in &mut stage.items {
                    match item {
                        Item::Compute(seg) => {
                            seg.fwd = list();
                            seg.bwd = [list(), list()].concat();
                        }
                        Item::Coll(c) if c.axis == ParAxis::Tp => {
                            assert!(boundary_side(c).is_some(), "{} has no side", c.name);
                        }
                        Item::Coll(_) => {}
                    }
                }
            }
            g
        }

        fn name(p: &StepProgram, id: OpId) -> &str {
            p.ops[id.0 as usize].name.as_deref().unwrap_or("")
        }

        /// The single GEMM an op runs, if it runs exactly one.
        fn single_gemm(p: &StepProgram, id: OpId) -> Option<KernelWork> {
            match &p.ops[id.0 as usize].payload {
                Payload::Compute(w) => match p.kernel_mixes.get(&w.mix?)?.as_slice() {
                    [k] if is_gemm(k) => Some(*k),
                    _ => None,
                },
                _ => None,
            }
        }

        fn chunk_index(name: &str) -> Option<u64> {
            name.rsplit_once(".c")?.1.parse().ok()
        }

        fn compute_flops(p: &StepProgram) -> u64 {
            p.ops
                .iter()
                .filter_map(|o| match &o.payload {
                    Payload::Compute(w) => Some(w.flops),
                    _ => None,
                })
                .sum()
        }

        #[test]
        fn fused_chunks_have_the_pipeline_dependencies() {
            let p = generator(FUSED4).program(0).unwrap();
            let mut consumers: HashMap<OpId, Vec<OpId>> = HashMap::new();
            for o in &p.ops {
                for d in &o.deps {
                    consumers.entry(*d).or_default().push(o.id);
                }
            }
            let (mut gathers, mut reduces) = (0, 0);
            for o in p.ops.iter().filter(|o| o.category == Category::Tp) {
                let n = name(&p, o.id);
                let Some(i) = chunk_index(n) else {
                    continue;
                };
                let rows = |g: KernelWork| match g.class {
                    KernelClass::Gemm { m, .. } => m,
                    _ => unreachable!(),
                };
                let c = o.payload.as_collective().unwrap();
                if c.kind == CollectiveKind::AllGather {
                    // Gather chunk i is waited for by GEMM chunk i alone.
                    gathers += 1;
                    let users = &consumers[&o.id];
                    assert_eq!(users.len(), 1, "{n}");
                    let g = single_gemm(&p, users[0]).unwrap_or_else(|| panic!("{n}"));
                    assert_eq!(chunk_index(name(&p, users[0])), Some(i), "{n}");
                    assert_eq!(rows(g), part(RANK_TOKENS, 4, i), "{n}");
                } else {
                    // Reduce chunk i waits for GEMM chunk i alone.
                    reduces += 1;
                    assert_eq!(o.deps.len(), 1, "{n}");
                    let g = single_gemm(&p, o.deps[0]).unwrap_or_else(|| panic!("{n}"));
                    assert_eq!(chunk_index(name(&p, o.deps[0])), Some(i), "{n}");
                    assert_eq!(rows(g), part(RANK_TOKENS, 4, i), "{n}");
                }
            }
            assert!(gathers > 0 && reduces > 0, "{gathers} {reduces}");
            assert_eq!(gathers % 4, 0);
            assert_eq!(reduces % 4, 0);
        }

        #[test]
        fn fused_programs_keep_bytes_and_flops_and_chunk_every_fusible_collective() {
            let none = generator(TpCommOverlap::None).program(0).unwrap();
            let fused = generator(FUSED4).program(0).unwrap();
            assert_eq!(compute_flops(&none), compute_flops(&fused));
            let tp = |p: &StepProgram| -> HashMap<String, (u64, u64, u64)> {
                let mut m: HashMap<String, (u64, u64, u64)> = HashMap::new();
                // TP collectives only (the TP gradient all-reduces' AVG divisions are TP
                // kernels).
                let colls = p.ops.iter().filter(|o| o.payload.as_collective().is_some());
                for o in colls.filter(|o| o.category == Category::Tp) {
                    let n = name(p, o.id);
                    let base = match chunk_index(n) {
                        Some(_) => n.rsplit_once(".c").unwrap().0,
                        None => n,
                    };
                    let c = o.payload.as_collective().unwrap();
                    let e = m.entry(base.to_string()).or_default();
                    *e = (e.0 + 1, e.1 + c.input_bytes, e.2 + c.output_bytes);
                }
                m
            };
            let (a, b) = (tp(&none), tp(&fused));
            assert_eq!(a.len(), b.len(), "the same TP collectives, chunked or not");
            let mut chunked = 0;
            for (n, &(count, i, o)) in &a {
                assert_eq!(count, 1, "{n}");
                let &(fc, fi, fo) = b.get(n).unwrap_or_else(|| panic!("{n} missing"));
                assert_eq!((fi, fo), (i, o), "{n}: bytes kept");
                assert!(fc == 1 || fc == 4, "{n}: {fc}");
                chunked += usize::from(fc == 4);
                // The logits gather leaves lm_head for the loss: never fused.
                if n.contains(".out.logits.") {
                    assert_eq!(fc, 1, "{n}");
                }
            }
            // Every SP gather / reduce-scatter of the decoder layers is fused in this setup.
            let sp = a.keys().filter(|n| n.contains(".hidden_states.tp")).count();
            assert_eq!(chunked, sp, "{chunked} of {sp}");
        }
    }
}
