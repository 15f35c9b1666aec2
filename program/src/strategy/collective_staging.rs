//! The device kernels HyperParallel's runtime launches *around* a model-parallel collective:
//! the contiguity copies, concatenations and reductions of the list-based collective APIs
//! it calls. They are device kernels like any other (the measured "device kernels per step,
//! excluding communication" of experiment A count them), each costing a launch on the host.
//!
//! torch_npu's list collectives also stage their buffers with `copy_` in their pre and post
//! hooks (`ProcessGroupHCCL::allgather` copies each rank's slice out of the flattened output,
//! `reduce_scatter` copies each input into the flattened input, `alltoall` copies each
//! received slice back, Ascend/pytorch `torch_npu/csrc/distributed/ProcessGroupHCCL.cpp`).
//! Those copies are between contiguous same-dtype tensors of equal size, which torch_npu runs
//! as an asynchronous device-to-device memcpy, not a kernel (`copy_d2d_dtype_baseformat`:
//! "Contiguous source tensor copy to contiguous self tensor" -> `copy_d2d_by_memcpy`,
//! `torch_npu/csrc/aten/common/CopyKernel.cpp`), so they are not counted here.
//!
//! Where the kernels come from, per [`CallPath`]:
//!
//! - **TP/CP sequence-parallel gather** `S(d) -> R` ([`CallPath::GatherConcat`]): the
//!   boundary's production lowering (hyper-parallel `distributed/_builder/
//!   tp_collective_lowering.py` `TPExecutionOp.execute("all_gather")`, and the DTensor
//!   fallback `core/dtensor/tensor_redistribution.py` `_construct_all_concat`) calls
//!   `differentiable_all_gather_concat` (`core/utils/communication.py`; the March snapshot's
//!   `platform/torch/platform.py` has the same body): `dist_func.all_gather(data, group)`
//!   (`torch.distributed.nn.functional._AllGather`, the list `dist.all_gather`), then
//!   `torch.cat(output, dim=d)`.
//!   - forward: the `cat` (one kernel);
//!   - backward: `cat`'s gradient is `ranks` narrow views along `d`, made contiguous
//!     (`_TorchContiguousGrad`, or `_AlltoAll.forward`'s `t.contiguous()`): `ranks` copies
//!     unless a slice along `d` is already contiguous (`d` = 0, or the sequence dim with one
//!     sequence per micro-batch). `_AllGather.backward` reduces with a reduce-scatter only
//!     on NCCL/XCCL; on HCCL it takes the emulation branch ("As many backends don't support
//!     ReduceScatter, we use AlltoAll with .sum()", torch `distributed/nn/functional.py`;
//!     torch_npu patches only `_AllGatherBase`, `torch_npu/distributed/nn/functional.py`):
//!     the list `dist.all_to_all` (below: 2 concatenations), then `torch.stack` and
//!     `torch.sum(dim=0)`.
//! - **TP/CP reduce-scatter** `P -> S(d)` ([`CallPath::ChunkReduceScatter`]):
//!   `differentiable_reduce_scatter` chunks the input along `d` (`torch.chunk`) and calls
//!   `dist_func.reduce_scatter(output, chunks)`:
//!   - forward: `_Reduce_Scatter.forward` makes every chunk contiguous (`ranks` copies
//!     unless contiguous, as above) before the list `dist.reduce_scatter`;
//!   - backward: `_Reduce_Scatter.backward` is `_AllGather.apply(group, grad)` (the list
//!     all-gather), then the chunk's gradient (`split_backward`: one `cat`).
//! - **Expert-parallel token exchange** ([`CallPath::ListAllToAll`]): `ep_all_to_all` on HCCL
//!   is `_EPAllToAllUneven` (hyper-parallel `ep_utils.py` / `distributed/expert_parallel/
//!   collectives.py`): `dist.all_to_all(list(out.split(recv_counts)),
//!   list(x.split(send_counts)))` both ways (its backward re-applies itself). torch_npu's
//!   list `ProcessGroupHCCL::alltoall` concatenates the inputs and the outputs into two flat
//!   tensors (`at::cat(input_tensors_after, 0)`, `at::cat(output_tensors_after, 0)`) before
//!   the `HcclAlltoAllV`: 2 concatenation kernels on the compute stream per call.
//! - everything else ([`CallPath::Direct`]): single-tensor APIs (`all_gather_into_tensor`,
//!   `reduce_scatter_tensor`, `all_to_all_single`, the EP count exchange) launch nothing
//!   around the collective.
//!
//! Only HyperParallel's runtime takes these paths: the baselines' TP/EP collectives (Megatron's
//! `_gather_along_first_dim`, torch DTensor's `all_gather_tensor`) use single-tensor APIs, so
//! the emitter applies the staging only to the `hyperparallel` strategy.
//!
//! Bytes: every copy or concatenation reads and writes its data once; `full` is the gathered
//! (or pre-scatter) tensor on one rank, `shard` one rank's part.

use super::parallel::{CallPath, CollSpec};
use super::tp_overlap::Pass;
use hpfsdp_plan::kernel::KernelWork;

/// The kernels around one collective call, by where they run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staging {
    /// On the compute stream before the collective (it reads their output).
    pub before: Vec<KernelWork>,
    /// On the compute stream after it (the caller's use of the result).
    pub after: Vec<KernelWork>,
}

impl Staging {
    /// Kernel launches of both parts.
    pub fn kernels(&self) -> u32 {
        self.before.iter().chain(&self.after).map(|w| w.count).sum()
    }
}

/// Whether the `ranks` equal slices of a `[micro_batch, S, W]` activation along `dim` are
/// contiguous tensors (all dims before `dim` of size 1): `.contiguous()` then copies nothing.
pub fn slices_contiguous(dim: usize, micro_batch: u64) -> bool {
    dim == 0 || (dim == 1 && micro_batch <= 1)
}

/// `n` copies (or one concatenation when `n` is 1) moving `bytes` in all: read and write once.
fn copies(n: u64, bytes: u64) -> KernelWork {
    KernelWork::memory_bound(u32::try_from(n).unwrap_or(u32::MAX), 0, 2 * bytes)
}

/// The list `dist.all_to_all` on torch_npu: the input and output concatenations before it.
fn list_all_to_all(in_bytes: u64, out_bytes: u64) -> Staging {
    Staging {
        before: vec![copies(2, in_bytes + out_bytes)],
        after: Vec::new(),
    }
}

/// The contiguity copies of `ranks` slices along `dim` of a `full`-byte tensor (none when
/// the slices are contiguous already).
fn contiguous_slices(dim: usize, ranks: u64, full: u64, micro_batch: u64) -> Vec<KernelWork> {
    if slices_contiguous(dim, micro_batch) {
        Vec::new()
    } else {
        vec![copies(ranks, full)]
    }
}

/// The kernels around one call of collective `spec` issued through `path` in `pass`, on a
/// rank whose micro-batch holds `micro_batch` sequences. `spec` is the call's own
/// collective (a gather's backward carries its reduce-scatter's sizes).
pub fn staging(path: CallPath, pass: Pass, spec: &CollSpec, micro_batch: u64) -> Staging {
    let full = spec.input_bytes.max(spec.output_bytes);
    let shard = spec.input_bytes.min(spec.output_bytes);
    match (path, pass) {
        (CallPath::Direct, _) => Staging::default(),
        (CallPath::ListAllToAll { .. }, _) => list_all_to_all(spec.input_bytes, spec.output_bytes),
        (CallPath::GatherConcat { .. }, Pass::Forward)
        | (CallPath::ChunkReduceScatter { .. }, Pass::Backward) => Staging {
            before: Vec::new(),
            after: vec![copies(1, full)],
        },
        (CallPath::GatherConcat { dim, ranks }, Pass::Backward) => {
            let mut before = contiguous_slices(dim, ranks, full, micro_batch);
            before.extend(list_all_to_all(full, full).before);
            // `torch.stack(gxs)` then `torch.sum(..., dim=0)` (reads every part, writes one).
            Staging {
                before,
                after: vec![
                    copies(1, full),
                    KernelWork::memory_bound(1, 0, full + shard),
                ],
            }
        }
        (CallPath::ChunkReduceScatter { dim, ranks }, Pass::Forward) => Staging {
            before: contiguous_slices(dim, ranks, full, micro_batch),
            after: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::collective::CollectiveKind;

    fn spec(kind: CollectiveKind, input_bytes: u64, output_bytes: u64) -> CollSpec {
        CollSpec {
            kind,
            input_bytes,
            output_bytes,
        }
    }

    /// Experiment A's attention input: `[2, 1024, 2048]` bf16 per rank, gathered over TP 4
    /// along the sequence (dim 1).
    const SHARD: u64 = 2 * 1024 * 2048 * 2;
    const FULL: u64 = 4 * SHARD;

    #[test]
    fn sequence_parallel_gather_costs_one_kernel_forward_and_eight_backward() {
        let g = CallPath::GatherConcat { dim: 1, ranks: 4 };
        let f = staging(
            g,
            Pass::Forward,
            &spec(CollectiveKind::AllGather, SHARD, FULL),
            2,
        );
        // The cat; torch_npu's post-hook slice copies are memcpys.
        assert_eq!((f.before.len(), f.kernels()), (0, 1));
        assert_eq!(f.after[0].hbm_bytes, 2 * FULL);
        let b = staging(
            g,
            Pass::Backward,
            &spec(CollectiveKind::ReduceScatter, FULL, SHARD),
            2,
        );
        // 4 contiguous copies + the all-to-all's 2 concatenations; stack + sum.
        let counts = |ws: &[KernelWork]| ws.iter().map(|w| w.count).collect::<Vec<_>>();
        assert_eq!(
            (counts(&b.before), counts(&b.after)),
            (vec![4, 2], vec![1, 1])
        );
        assert_eq!(b.kernels(), 8);
        assert_eq!(b.before[1].hbm_bytes, 4 * FULL);
        assert_eq!(b.after[1].hbm_bytes, FULL + SHARD);
        // One sequence per micro-batch: the sequence slices are contiguous, no copies.
        let b1 = staging(
            g,
            Pass::Backward,
            &spec(CollectiveKind::ReduceScatter, FULL, SHARD),
            1,
        );
        assert_eq!(b1.kernels(), 4);
    }

    #[test]
    fn sequence_parallel_reduce_scatter_costs_four_kernels_forward_and_one_backward() {
        let r = CallPath::ChunkReduceScatter { dim: 1, ranks: 4 };
        let f = staging(
            r,
            Pass::Forward,
            &spec(CollectiveKind::ReduceScatter, FULL, SHARD),
            2,
        );
        assert_eq!((f.before[0].count, f.kernels()), (4, 4));
        assert_eq!(f.before[0].hbm_bytes, 2 * FULL);
        let b = staging(
            r,
            Pass::Backward,
            &spec(CollectiveKind::AllGather, SHARD, FULL),
            2,
        );
        assert_eq!(b.kernels(), 1);
        // A batch-dim scatter chunks contiguously: nothing before the call.
        let r0 = CallPath::ChunkReduceScatter { dim: 0, ranks: 4 };
        let f0 = staging(
            r0,
            Pass::Forward,
            &spec(CollectiveKind::ReduceScatter, FULL, SHARD),
            2,
        );
        assert_eq!(f0.kernels(), 0);
    }

    #[test]
    fn list_all_to_all_concatenates_inputs_and_outputs() {
        let s = staging(
            CallPath::ListAllToAll { ranks: 4 },
            Pass::Backward,
            &spec(CollectiveKind::AllToAllV, 1000, 3000),
            2,
        );
        assert_eq!((s.before[0].count, s.kernels()), (2, 2));
        assert_eq!(s.before[0].hbm_bytes, 2 * (1000 + 3000));
        let d = staging(
            CallPath::Direct,
            Pass::Forward,
            &spec(CollectiveKind::AllToAll, 16, 16),
            2,
        );
        assert_eq!(d, Staging::default());
    }

    #[test]
    fn slice_contiguity_follows_the_leading_dims() {
        assert!(slices_contiguous(0, 4));
        assert!(slices_contiguous(1, 1));
        assert!(!slices_contiguous(1, 2));
        assert!(!slices_contiguous(2, 1));
    }
}
