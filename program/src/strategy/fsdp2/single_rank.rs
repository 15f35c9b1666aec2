//! FSDP2 on a single-rank shard group (a one-GPU `fully_shard`, or HSDP with `dp_shard = 1`):
//! the collectives degenerate, the copies around them do not.
//!
//! Measured on one H200 with torch 2.11 (`shared/calibration/h200/profiles/`, the three
//! FSDP2 runs and the dense-14B trace), per unit:
//! - **copy-in** (`all_gather_copy_in`, pre-forward and pre-backward hooks, on the default
//!   stream like everything but the reduce-scatter memcpys): one cast kernel per parameter (`_foreach_copy_` from the fp32 master shard into the flat bf16 buffer;
//!   `bfloat16_copy_kernel_cuda`: 93 kernels in the dense-14B forward for 91 parameters plus
//!   the root's tensors), reading the master bytes and writing the param-dtype bytes;
//! - **all-gather**: NCCL's one-rank in-place all-gather launches nothing (no NCCL kernel in
//!   any of the three kernel tables);
//! - **copy-out** (`split_with_sizes_copy` of a one-row output): one device-to-device memcpy
//!   per parameter (178,257,920 B = one bf16 `gate_proj` of Qwen3-14B, 48 times = 8 layers x 3
//!   MLP projections x forward + backward);
//! - **reduce-scatter copy-in** (`chunk_cat` of the bf16 gradients into the fp32 reduce
//!   buffer): one `chunk_cat_cuda_kernel<float, BFloat16>` per unit;
//! - **reduce-scatter**: NCCL's one-rank out-of-place reduce-scatter is one device-to-device
//!   memcpy of the whole reduce buffer (1,321,247,744 B = one Qwen3-14B layer's 330.3 M
//!   parameters in fp32, 8 times; 6,223,319,040 B for the root).
//!
//! No division (`data_parallel_size == 1`: `ReduceOp.SUM`) and no all-reduce without
//! replicas.

use super::{F2, group_name, short};

/// Host CPU operator events of a copy-in per parameter: `aten::to` -> `_to_copy` ->
/// `empty_strided` + `copy_` (the dense-14B trace: 44 of the 58 events inside a layer's
/// `FSDP::pre_forward` for its 11 parameters).
pub const COPY_IN_EVENTS_PER_PARAM: u32 = 4;
/// Host events of a copy-out per parameter (`aten::copy_`: 11 of the 58).
pub const COPY_OUT_EVENTS_PER_PARAM: u32 = 1;
/// Host events of a hook around a copy-in/copy-out pair that no parameter accounts for
/// (3 of the 58: post-backward registration and views).
pub const UNSHARD_HOOK_EVENTS: u32 = 3;
/// Host events of a reduction per parameter (`aten::as_strided` views of the reduced
/// gradient: 11 of the 22 events inside a layer's `FSDP::post_backward_reduce`).
pub const REDUCE_EVENTS_PER_PARAM: u32 = 1;
/// Host events of a reduction that no parameter accounts for (`empty` x 2, `view`,
/// `fsdp::chunk_cat` and its `_chunk_cat`, `copy_`, ...: the other 11 of the 22).
pub const REDUCE_FIXED_EVENTS: u32 = 11;
use crate::step::{CopyKind, MemTag, OpId, Stream};

impl F2<'_> {
    /// Copy-in of single-rank group `gi` of unit `u`: one cast (or copy) kernel per parameter
    /// into the flat all-gather buffer, after the copy-out two units earlier. Returns the op
    /// the copy-out waits for (there is no collective).
    pub(super) fn single_rank_copy_in(&mut self, u: usize, gi: usize, phase: &str) -> OpId {
        let o = &self.e.ctx.opts;
        let (master, pd) = (o.master_dtype.bytes(), o.param_dtype.bytes());
        let g = &self.units[u].groups[gi];
        let (elems, params, ag_out) = (g.shard_elems, g.params, g.ag_out);
        let gname = group_name(short(&self.units[u].name), g.domain);
        let deps: Vec<OpId> = self
            .copy_outs
            .len()
            .checked_sub(2)
            .map(|i| self.copy_outs[i])
            .into_iter()
            .collect();
        // Each element is read in the master dtype and written in the param dtype:
        // `CopyWork::bytes` is the mean of the two (the copy cost reads and writes it).
        // On the current stream: the H200 trace shows every copy-in cast on the default
        // stream (stream 7), none on a copy-in stream.
        let cin = self.e.copy(
            Stream::Compute,
            elems * (master + pd) / 2,
            params,
            &deps,
            &format!("{gname}.copy_in{phase}"),
        );
        self.e.alloc(cin, MemTag::Buffers, ag_out);
        self.e
            .b
            .host_events(cin, COPY_IN_EVENTS_PER_PARAM * params + UNSHARD_HOOK_EVENTS);
        cin
    }

    /// Copy-out of single-rank group `gi` of unit `u` after `cin`: one device-to-device
    /// memcpy per parameter on the compute stream. It also waits for the last one-rank
    /// reduce-scatter issued: the group's collectives run in issue order on NCCL's stream, so
    /// the (kernel-less) all-gather the copy-out waits for completes after the reduce-scatter
    /// memcpy queued before it. The dense-14B trace shows it: in 6 of 8 layers the default
    /// stream's next copy-out starts 11-27 us after the reduce-scatter memcpy ends (the
    /// memcpys overlap the default stream by 1.4 ms of their 8.0 ms in all).
    pub(super) fn single_rank_copy_out(
        &mut self,
        u: usize,
        gi: usize,
        cin: OpId,
        phase: &str,
    ) -> OpId {
        let g = &self.units[u].groups[gi];
        let (params, ag_out, domain) = (g.params, g.ag_out, g.domain);
        let gname = group_name(short(&self.units[u].name), domain);
        let deps: Vec<OpId> = std::iter::once(cin)
            .chain(self.last_single_rank_rs)
            .collect();
        let op = self.e.memcpy(
            Stream::Compute,
            ag_out,
            params,
            &deps,
            &format!("{gname}.copy_out{phase}"),
        );
        self.e.alloc(op, MemTag::Params, ag_out);
        self.e.free(op, MemTag::Buffers, ag_out);
        self.e.b.host_events(op, COPY_OUT_EVENTS_PER_PARAM * params);
        op
    }

    /// Reduction of single-rank group `gi` of unit `u` after `wait`: `chunk_cat` of the
    /// param-dtype gradients into the reduce-dtype buffer on the compute stream, then the
    /// one-rank reduce-scatter as one memcpy of the buffer on the group's stream. Returns the
    /// memcpy (what the optimizer waits for).
    pub(super) fn single_rank_reduce(
        &mut self,
        u: usize,
        gi: usize,
        wait: &[OpId],
        first_mb: bool,
    ) -> OpId {
        let o = &self.e.ctx.opts;
        let (pd, rd) = (o.param_dtype.bytes(), o.reduce_dtype.bytes());
        let g = &self.units[u].groups[gi];
        let (elems, rs_in, rs_out, domain) = (g.shard_elems, g.rs_in, g.rs_out, g.domain);
        let unsharded_grads = g.unsharded_grad_bytes;
        let params = g.params;
        let gname = group_name(short(&self.units[u].name), domain);
        let cin = self.e.copy_of_kind(
            Stream::Compute,
            elems * (pd + rd) / 2,
            1,
            CopyKind::ChunkCat,
            wait,
            &format!("{gname}.rs_copy_in"),
        );
        self.e.alloc(cin, MemTag::Buffers, rs_in);
        self.e.free(cin, MemTag::Grads, unsharded_grads);
        self.e
            .b
            .host_events(cin, REDUCE_EVENTS_PER_PARAM * params + REDUCE_FIXED_EVENTS)
            .copy_elements(cin, elems);
        let rs = self.e.memcpy(
            super::shard_group_stream(domain),
            rs_in,
            1,
            &[cin],
            &format!("{gname}.rs"),
        );
        self.e.free(rs, MemTag::Buffers, rs_in);
        self.last_single_rank_rs = Some(rs);
        if first_mb {
            self.e.alloc(rs, MemTag::Grads, rs_out);
        }
        rs
    }
}
