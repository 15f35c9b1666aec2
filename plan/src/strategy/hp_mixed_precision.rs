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
//! With one dtype throughout (experiments A and B) neither exists. Not modelled:
//! `apply_reduced_grad`'s cast of the reduced shard back to the parameter's dtype when the
//! reduce dtype is wider (bf16 master, f32 reduction), one kernel over the 1/S shard.

use crate::DType;
use crate::kernel::KernelWork;

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
    }
}
