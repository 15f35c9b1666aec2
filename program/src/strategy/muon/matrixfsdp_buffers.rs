//! The device kernels MatrixFSDP's flat buffer runs around its owner collectives
//! (`songbingze/matrix-fsdp`, `matrix_fsdp/runtime/flat_buffer.py` and
//! `runtime/collectives.py`, with the `fully_shard` / `matrix_fully_shard` defaults of
//! `matrix_fsdp/api.py`: `matrix_collective_backend = "owner_broadcast"`,
//! `backward_reduce_strategy = "bucket_reduce_scatter"`, `use_zero_copy_grad_bucket = False`,
//! `finalize_after_backward = True`). All of them run on the compute stream (on an NPU
//! MatrixFSDP has no communication streams: `MatrixFSDPCommContext` is CUDA-only, so every
//! `cuda_stream` argument is `None`). The strategy program (`strategy::hyperparallel`, its
//! MatrixFSDP branches) places them; this module only says what they are:
//!
//! - **publication copy-in** ([`publication_copy_in`]): `start_all_gather_full_params` casts
//!   the rank's whole local shard of the unit to the parameter dtype
//!   (`_maybe_to_param_dtype(self.local_shard)`, a new tensor only when the master dtype
//!   differs) and `broadcast_rank_segments_1d_into_async` copies it into the rank's segment
//!   of the full buffer (`_copy_local_rank_segments`, one `copy_` per coalesced segment: one
//!   for a compact owner layout) before the broadcasts;
//! - **reduction copy-in** ([`reduce_cast`], then [`reduce_pack`]): `collect_grad_bucket` casts each parameter's
//!   gradient to the reduce dtype (`_maybe_to_reduce_dtype(grad)`, the whole gradient, on
//!   every rank), then `_fill_compact_owner_reduce_scatter_input` zeroes the packed
//!   reduce-dtype workspace of the unit (`packed_rank_chunks.zero_()`) and copies every
//!   gradient into it (`view.copy_(grad)`, one per parameter) before the per-owner
//!   `dist.reduce` calls read it;
//! - **reduction settle** ([`reduce_settle`]): the handle's `wait()` in
//!   `reduce_owner_rank_chunks_1d_async` divides the rank's own chunk by the group size
//!   (`rank_chunk(rank).div_(len(shard_sizes))`, `divide_grads_by_world = True`) and copies
//!   it into a fresh local gradient shard (`local_grad_shard.copy_(rank_chunk(rank))`); a
//!   rank that owns nothing of the unit has an empty chunk (no kernels).

use hpfsdp_plan::DType;
use hpfsdp_plan::kernel::KernelWork;

/// The publication copy-in of one unit on one rank: `local_elems` elements of the rank's
/// local shard held in `master`, published in `param`. A cast (read `master`, write
/// `param`) when they differ, then one copy of the `param`-dtype shard into the full
/// buffer. Empty when the rank holds nothing of the unit.
pub fn publication_copy_in(local_elems: u64, master: DType, param: DType) -> Vec<KernelWork> {
    if local_elems == 0 {
        return Vec::new();
    }
    let p = param.bytes();
    let mut k = Vec::with_capacity(2);
    if master != param {
        k.push(KernelWork::memory_bound(
            1,
            local_elems,
            (master.bytes() + p) * local_elems,
        ));
    }
    k.push(KernelWork::memory_bound(1, 0, 2 * p * local_elems));
    k
}

/// The reduction casts of one unit on one rank (`collect_grad_bucket`): one per parameter
/// over its whole gradient of `grad_elems` elements in total, read in `param` and written
/// in `reduce`; `None` when they agree.
pub fn reduce_cast(
    grad_elems: u64,
    tensors: u32,
    param: DType,
    reduce: DType,
) -> Option<KernelWork> {
    (param != reduce && grad_elems > 0 && tensors > 0).then(|| {
        KernelWork::memory_bound(
            tensors,
            grad_elems,
            (param.bytes() + reduce.bytes()) * grad_elems,
        )
    })
}

/// The packing of one unit's `tensors` reduce-dtype gradients (`grad_elems` elements) into
/// the compact owner workspace (`_fill_compact_owner_reduce_scatter_input`): its `zero_`
/// (writes it once) and one copy per parameter (read and write in `reduce`). Empty when
/// the unit has no gradient.
pub fn reduce_pack(grad_elems: u64, tensors: u32, reduce: DType) -> Vec<KernelWork> {
    if grad_elems == 0 || tensors == 0 {
        return Vec::new();
    }
    let r = reduce.bytes();
    vec![
        KernelWork::memory_bound(1, 0, r * grad_elems),
        KernelWork::memory_bound(tensors, 0, 2 * r * grad_elems),
    ]
}

/// The settle of one unit's owner reductions on one rank that owns `owned_elems` gradient
/// elements of it in `reduce`: the in-place division of its chunk (reads and writes it)
/// and its copy into the local gradient shard. Empty when the rank owns nothing of the
/// unit.
pub fn reduce_settle(owned_elems: u64, reduce: DType) -> Vec<KernelWork> {
    if owned_elems == 0 {
        return Vec::new();
    }
    let r = reduce.bytes();
    vec![
        KernelWork::memory_bound(1, owned_elems, 2 * r * owned_elems),
        KernelWork::memory_bound(1, 0, 2 * r * owned_elems),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(k: &[KernelWork]) -> (u32, u64) {
        (
            k.iter().map(|w| w.count).sum(),
            k.iter().map(|w| w.hbm_bytes).sum(),
        )
    }

    #[test]
    fn publication_casts_only_a_wider_master() {
        // FP32 master, bf16 publication: cast (4 + 2 bytes) and copy (2 + 2 bytes).
        let k = publication_copy_in(100, DType::F32, DType::Bf16);
        assert_eq!(totals(&k), (2, 100 * (6 + 4)));
        // Same dtype: only the copy into the full buffer.
        let k = publication_copy_in(100, DType::Bf16, DType::Bf16);
        assert_eq!(totals(&k), (1, 100 * 4));
        assert!(publication_copy_in(0, DType::F32, DType::Bf16).is_empty());
    }

    #[test]
    fn reduction_copy_in_casts_zeroes_and_packs() {
        // bf16 gradients reduced in f32 over 7 parameters: 7 casts (2 + 4 bytes), one
        // zero_ (4 bytes), 7 copies (4 + 4 bytes).
        let c = reduce_cast(1000, 7, DType::Bf16, DType::F32).unwrap();
        assert_eq!((c.count, c.hbm_bytes), (7, 1000 * 6));
        assert!(reduce_cast(1000, 7, DType::F32, DType::F32).is_none());
        let k = reduce_pack(1000, 7, DType::F32);
        assert_eq!(totals(&k), (8, 1000 * (4 + 8)));
        assert!(reduce_pack(0, 7, DType::F32).is_empty());
    }

    #[test]
    fn settle_divides_and_copies_the_owned_chunk() {
        let k = reduce_settle(10, DType::F32);
        assert_eq!(totals(&k), (2, 10 * 16));
        assert!(reduce_settle(0, DType::F32).is_empty());
    }
}
