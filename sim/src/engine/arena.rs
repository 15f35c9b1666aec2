//! One allocation for the per-op runtime state of every unit of an engine, backed by huge
//! pages where the system offers them.
//!
//! The engine's per-op state ([`OpRt`], one cache line per op) of exp-d's 528 forked Muon
//! tails is 112 MB, walked by hundreds of units interleaved in time: with 4 KiB pages
//! nearly every event also misses the TLB. One allocation advised for transparent huge pages
//! (Linux `madvise(MADV_HUGEPAGE)`, before its first touch) covers the same bytes with a few
//! dozen 2 MiB pages. The advice is only a hint: where it is refused or not available the
//! storage is ordinary memory, and nothing else changes.

use super::OpRt;

/// Per-op runtime state of all units, handed out as one slice per unit.
pub(super) struct OpArena {
    ops: Vec<OpRt>,
}

impl OpArena {
    /// Storage for `len` ops, every one [`OpRt::EMPTY`].
    pub(super) fn new(len: usize) -> Self {
        let mut ops: Vec<OpRt> = Vec::with_capacity(len);
        advise_huge_pages(ops.as_mut_ptr().cast(), len * std::mem::size_of::<OpRt>());
        ops.resize(len, OpRt::EMPTY);
        Self { ops }
    }

    /// Splits the storage into consecutive slices of the given lengths (their sum must not
    /// exceed the arena's length).
    pub(super) fn split<'a>(
        &'a mut self,
        lens: impl Iterator<Item = usize>,
    ) -> Vec<&'a mut [OpRt]> {
        let mut rest: &'a mut [OpRt] = &mut self.ops;
        lens.map(|n| {
            let (mine, more) = std::mem::take(&mut rest).split_at_mut(n);
            rest = more;
            mine
        })
        .collect()
    }
}

/// Advises the kernel to back `len` bytes from `start` with transparent huge pages (Linux
/// only; ignored when refused).
fn advise_huge_pages(start: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        // Only whole huge pages inside the allocation can be huge.
        let first = (start as usize).next_multiple_of(HUGE);
        let end = (start as usize).saturating_add(len) & !(HUGE - 1);
        if end > first {
            // SAFETY: the range lies inside an allocation this process owns; the advice
            // changes how it is backed, never its contents or validity. A failure is ignored.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}
