//! A compute segment emitted as several ops ([`super::compute::Segment::pieces`]): each
//! piece's integer share of the segment's kernel launches, FLOPs and bytes, host events and
//! syncs, cut so the pieces add up to the whole exactly.

use hpfsdp_plan::kernel::KernelWork;

/// Piece `i` of `n` of `total` (events, syncs): the integer shares add up to `total`.
pub fn share(total: u32, i: u32, n: u32) -> u32 {
    let cut = |j: u32| (u64::from(total) * u64::from(j) / u64::from(n.max(1))) as u32;
    cut(i + 1) - cut(i)
}

/// Piece `i` of `n` of a kernel list: each entry's launches split into integer shares
/// ([`share`]), its FLOPs and bytes in proportion by the same cumulative cuts, so the `n`
/// pieces add up to the list exactly; entries with no launch in the piece are left out.
pub fn piece_of(kernels: &[KernelWork], i: u32, n: u32) -> Vec<KernelWork> {
    // The first `j` pieces' part of `total` over an entry of `count` launches.
    let cut = |total: u64, j: u32, count: u32| -> u64 {
        let done = u64::from(count) * u64::from(j) / u64::from(n.max(1));
        (u128::from(total) * u128::from(done) / u128::from(count.max(1))) as u64
    };
    kernels
        .iter()
        .filter_map(|k| {
            let count = share(k.count, i, n);
            (count > 0).then(|| KernelWork {
                count,
                flops: cut(k.flops, i + 1, k.count) - cut(k.flops, i, k.count),
                hbm_bytes: cut(k.hbm_bytes, i + 1, k.count) - cut(k.hbm_bytes, i, k.count),
                ..*k
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        let parts: Vec<u32> = (0..128).map(|i| share(641, i, 128)).collect();
        assert_eq!(parts.iter().sum::<u32>(), 641);
        assert!(parts.iter().all(|&p| p == 5 || p == 6));
        assert_eq!(share(7, 0, 1), 7);
    }

    #[test]
    fn pieces_add_up_to_the_kernel_list_exactly() {
        let gemm = KernelWork {
            count: 128,
            ..KernelWork::gemm(256, 1536, 2048, 1, 2)
        };
        let list = [
            gemm,
            KernelWork::memory_bound(1, 7, 1001),
            KernelWork::memory_bound(383, 5, 999_999),
        ];
        let pieces: Vec<Vec<KernelWork>> = (0..128).map(|i| piece_of(&list, i, 128)).collect();
        let sum = |f: fn(&KernelWork) -> u64| pieces.iter().flatten().map(f).sum::<u64>();
        let total = |f: fn(&KernelWork) -> u64| list.iter().map(f).sum::<u64>();
        assert_eq!(sum(|k| u64::from(k.count)), total(|k| u64::from(k.count)));
        assert_eq!(sum(|k| k.flops), total(|k| k.flops));
        assert_eq!(sum(|k| k.hbm_bytes), total(|k| k.hbm_bytes));
        // One launch per piece of the per-expert GEMM, at its shape; the single kernel lands
        // whole in one piece.
        assert!(
            pieces
                .iter()
                .all(|p| p[0].count == 1 && p[0].class == gemm.class)
        );
        assert_eq!(pieces.iter().flatten().filter(|k| k.flops == 7).count(), 1);
    }
}
