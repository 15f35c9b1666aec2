//! The gradient divisions of the data-parallel reductions, where and how torch_npu runs them.
//!
//! Both FSDP implementations average gradients by asking the collective for
//! `ReduceOp.AVG`; HCCL has no average. torch_npu (Ascend/pytorch
//! `torch_npu/csrc/distributed/ProcessGroupHCCL.cpp`) handles it in two places:
//!
//! - `getHcclReduceOp` maps `ReduceOp::AVG` to `HCCL_REDUCE_SUM` ("HCCL does not support
//!   ReduceOp::AVG yet / PTA supports it by summing first, then dividing"); `PREMUL_SUM` is
//!   in neither `hcclOp` nor `unsupportedOp`, so it fails with "Unhandled ReduceOp".
//! - `_reduce_scatter_base` (what `dist.reduce_scatter_tensor` calls), `reduce_scatter`,
//!   `reduce_scatter_tensor_coalesced`, `allreduce` and `reduce` pass a `post` callback to
//!   `ProcessGroupHCCL::collective`: `if (opts.reduceOp == AVG) { NPUStreamGuard
//!   guard(hcclStreams[0]); for (auto& tensor : outputs) tensor.div_(getSize()); }`. The
//!   callback runs after the HCCL call is enqueued and before `hcclEndEvents_` is recorded.
//!
//! So every averaged collective is followed by **one in-place division kernel of its output**
//! (the reduce-scatter's shard, the all-reduce's whole buffer: read and written once), **on
//! the process group's own HCCL stream**, divisor the group size; `Work::wait()` and every
//! stream that waits on the work wait for the division too. In the step programs the shard
//! group's collectives share that stream ([`super::emit::shard_group_stream`]), so the
//! division also delays the all-gathers issued behind it.
//!
//! Which op each strategy asks for: HyperParallel's reduce-scatter takes
//! `reduce_op=self.reduce_op_type`, `ReduceOp.AVG` unless `set_reduce_op_type("sum")`
//! (hyper-parallel `platform/torch/fully_shard/state.py` `TorchHSDPStateV2.__init__` and
//! `param.py` `TorchHSDPParamV2.reduce_scatter_grad`); its fused replica all-reduce always sums
//! and divides itself (notes `hyper-parallel.md` 5.3, `wait_and_split_grads`). FSDP2 follows
//! [`fsdp2_division`].

use super::emit::Emitter;
use crate::step::{Category, ComputeWork, Op, OpId, Payload, Stream};
use hpfsdp_plan::model::DType;

/// The reduction a data-parallel collective is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `ReduceOp.SUM`: HCCL sums, nothing divides.
    Sum,
    /// `ReduceOp.AVG`: HCCL sums, torch_npu divides the output on the HCCL stream.
    Avg,
}

/// HyperParallel-FSDP's reduce-scatter op: `ReduceOp.AVG`, the default of
/// `TorchHSDPStateV2.reduce_op_type` (no scenario key sets `set_reduce_op_type("sum")`).
pub const HYPERPARALLEL_REDUCE_SCATTER_OP: ReduceOp = ReduceOp::Avg;

/// Whether torch_npu divides the output of a collective run with `op` on a group of
/// `group_size` ranks: only for AVG, and only when the collective runs at all (a group of
/// one rank issues none: HyperParallel's `reduce_scatter_grad` returns early for
/// `shard_world_size <= 1`, FSDP2 skips single-rank groups).
pub fn npu_divides(op: ReduceOp, group_size: usize) -> bool {
    op == ReduceOp::Avg && group_size > 1
}

/// FSDP2's gradient division (torch 2.9 `_fsdp_collectives.py::_get_gradient_divide_factors`,
/// no custom factor, no `force_sum_reduction_for_comms`; notes `pytorch-baselines.md` 1.4.7).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fsdp2Division {
    /// Op of the reduce-scatter and, with replicas, of the all-reduce.
    pub op: ReduceOp,
    /// `predivide_factor`: FSDP2 divides the reduce-scatter input by it before the
    /// collective (`_div_if_needed`, which skips factors of 1 or less).
    pub pre_factor: f64,
    /// `postdivide_factor`: FSDP2 divides the reduced output by it afterwards.
    pub post_factor: f64,
}

/// FSDP2's division for `reduce_dtype` and `data_parallel_size` (the reduce-scatter group's
/// size times the all-reduce group's). bf16 and f32 have no overflow risk: both ops are AVG
/// (SUM when the size is 1) and nothing divides outside the collectives. Other dtypes (f16)
/// sum and divide around them, `pre` the largest power of two with `f % pre == 0` and
/// `f / pre > pre` after the loop, `post = f / pre`.
pub fn fsdp2_division(reduce_dtype: DType, data_parallel_size: usize) -> Fsdp2Division {
    let none = |op| Fsdp2Division {
        op,
        pre_factor: 1.0,
        post_factor: 1.0,
    };
    match reduce_dtype {
        DType::F32 | DType::Bf16 if data_parallel_size == 1 => none(ReduceOp::Sum),
        DType::F32 | DType::Bf16 => none(ReduceOp::Avg),
        _ => {
            let f = data_parallel_size.max(1);
            let mut pre = 1usize;
            while f.is_multiple_of(pre) && f / pre > pre {
                pre *= 2;
            }
            Fsdp2Division {
                op: ReduceOp::Sum,
                pre_factor: pre as f64,
                post_factor: f as f64 / pre as f64,
            }
        }
    }
}

/// The work of one in-place division of `bytes` bytes of `dtype` elements: one kernel that
/// reads and writes them once (`Tensor::div_`).
pub fn division_work(bytes: u64, dtype: DType) -> ComputeWork {
    ComputeWork::memory_bound(bytes / dtype.bytes().max(1), 2 * bytes, 1)
}

/// Appends the division torch_npu runs after an averaged collective `coll` (see the module
/// documentation): on `stream`, the stream the collective ran on, over its `output_bytes`,
/// in `category` (the collective's). Returns the op after which the collective's work is
/// complete, i.e. what a `wait()` on it waits for.
pub(crate) fn after_collective(
    e: &mut Emitter,
    stream: Stream,
    category: Category,
    output_bytes: u64,
    dtype: DType,
    coll: OpId,
    name: &str,
) -> OpId {
    e.compute(
        stream,
        category,
        division_work(output_bytes, dtype),
        &[coll],
        name,
    )
}

/// Whether `op` is one of these divisions: a kernel of a gradient-reduction category
/// (reduce-scatter or all-reduce) on a stream other than the compute stream. The
/// strategies put nothing else there (FSDP2's f16 pre- and post-divisions, which run on its
/// reduction streams too, included); the compute-stream kernels of those categories are
/// the strategies' own settle work (accumulation, HyperParallel's replica division).
pub fn is_collective_stream_division(op: &Op) -> bool {
    matches!(op.payload, Payload::Compute(_))
        && matches!(op.category, Category::FsdpRs | Category::FsdpAr)
        && !matches!(op.stream, Stream::Compute | Stream::Host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_avg_on_a_real_group_divides() {
        assert!(npu_divides(ReduceOp::Avg, 16));
        assert!(!npu_divides(ReduceOp::Sum, 16));
        assert!(!npu_divides(ReduceOp::Avg, 1));
        assert_eq!(HYPERPARALLEL_REDUCE_SCATTER_OP, ReduceOp::Avg);
    }

    #[test]
    fn fsdp2_averages_bf16_and_f32_and_splits_f16() {
        let b = fsdp2_division(DType::Bf16, 16);
        assert_eq!(
            (b.op, b.pre_factor, b.post_factor),
            (ReduceOp::Avg, 1.0, 1.0)
        );
        assert_eq!(fsdp2_division(DType::F32, 1).op, ReduceOp::Sum);
        // notes pytorch-baselines.md 1.4.7: f=8 gives pre=4, post=2; f=16 gives 4 and 4.
        let h = fsdp2_division(DType::F16, 8);
        assert_eq!(
            (h.op, h.pre_factor, h.post_factor),
            (ReduceOp::Sum, 4.0, 2.0)
        );
        let h = fsdp2_division(DType::F16, 16);
        assert_eq!((h.pre_factor, h.post_factor), (4.0, 4.0));
    }

    #[test]
    fn a_division_reads_and_writes_its_tensor_once() {
        let w = division_work(4096, DType::Bf16);
        assert_eq!((w.flops, w.hbm_bytes, w.kernels), (2048, 8192, 1));
    }
}
