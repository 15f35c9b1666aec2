//! The mixed-precision casts of HyperParallel's per-parameter FSDP (`fully_shard`, Torch
//! backend, `TorchHSDPParamV2` in `hyper_parallel/platform/torch/fully_shard/param.py`;
//! notes `hyper-parallel.md` 5.2 and 5.6) when the master, parameter and reduce dtypes
//! differ. Both run on the compute stream, per parameter:
//!
//! - **parameter cast** ([`param_cast`]): `all_gather_inputs` returns
//!   `sharded_param_data.to(self.param_dtype)` when `param_dtype` is unlike the master dtype
//!   ("a `param_dtype` cast creates a new communication input, which breaks zero-copy",
//!   5.6), one cast kernel per parameter per unshard over its padded shard;
//! - **gradient cast** ([`grad_cast`]): `reduce_scatter_grad()` runs `grad.to(reduce_dtype)`
//!   on the unsharded gradient (computed in `param_dtype`) before `reduce_scatter_tensor`
//!   (5.2), one cast kernel per parameter over the whole gradient.
//!
//! - **reduced-gradient cast** ([`reduced_grad_cast`]): `apply_reduced_grad()` casts the
//!   reduced shard back to the sharded parameter's own dtype (`orig_dtype`, the master dtype)
//!   before assigning or accumulating it (`if not mp_policy.apply_grad_on_fp32_main_grad and
//!   reduced_grad.dtype != self.orig_dtype: reduced_grad = reduced_grad.to(self.orig_dtype)`),
//!   one cast kernel per parameter over its 1/S shard, each time the reduced gradient is
//!   applied (every micro-batch without replicas; after the replica all-reduce otherwise).
//!   It exists with a bf16 master and an f32 reduction (muon-vs-dmuon, muon-vs-flexshard,
//!   exp C), not with FP32 master weights (muon-vs-matrixfsdp) nor with an FP32 `main_grad`
//!   (`[fsdp] fp32_main_grad`, `apply_grad_on_fp32_main_grad`: exp D's "fp32 master
//!   gradients").
//!
//! With one dtype throughout (experiments A and B) none exists.

use hpfsdp_plan::DType;
use hpfsdp_plan::kernel::KernelWork;

/// The casts of `tensors` local shards totalling `shard_elems` elements from `master` to
/// `param` (reads `master`, writes `param`); `None` when the dtypes agree or nothing is cast.
pub fn param_cast(
    shard_elems: u64,
    tensors: u32,
    master: DType,
    param: DType,
) -> Option<KernelWork> {
    (master != param && shard_elems > 0 && tensors > 0).then(|| {
        KernelWork::memory_bound(
            tensors,
            shard_elems,
            (master.bytes() + param.bytes()) * shard_elems,
        )
    })
}

/// The casts of `tensors` unsharded gradients totalling `grad_elems` elements from `param`
/// to `reduce` (reads `param`, writes `reduce`); `None` when the dtypes agree or nothing is
/// cast.
pub fn grad_cast(grad_elems: u64, tensors: u32, param: DType, reduce: DType) -> Option<KernelWork> {
    param_cast(grad_elems, tensors, param, reduce)
}

/// The casts of `tensors` reduced gradient shards totalling `shard_elems` elements from
/// `reduce` back to the `master` dtype of the sharded parameter (reads `reduce`, writes
/// `master`); `None` when the dtypes agree or nothing is cast.
pub fn reduced_grad_cast(
    shard_elems: u64,
    tensors: u32,
    reduce: DType,
    master: DType,
) -> Option<KernelWork> {
    param_cast(shard_elems, tensors, reduce, master)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_only_between_different_dtypes() {
        let k = param_cast(100, 3, DType::F32, DType::Bf16).unwrap();
        assert_eq!((k.count, k.hbm_bytes), (3, 100 * 6));
        assert!(param_cast(100, 3, DType::Bf16, DType::Bf16).is_none());
        let g = grad_cast(1000, 7, DType::Bf16, DType::F32).unwrap();
        assert_eq!((g.count, g.hbm_bytes), (7, 1000 * 6));
        assert!(grad_cast(1000, 7, DType::Bf16, DType::Bf16).is_none());
        assert!(grad_cast(0, 7, DType::Bf16, DType::F32).is_none());
        // apply_reduced_grad: f32 reduced shard back to a bf16 master; nothing for an f32
        // master.
        let r = reduced_grad_cast(500, 4, DType::F32, DType::Bf16).unwrap();
        assert_eq!((r.count, r.hbm_bytes), (4, 500 * 6));
        assert!(reduced_grad_cast(500, 4, DType::F32, DType::F32).is_none());
    }
}
