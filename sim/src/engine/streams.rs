//! Where each device stream of a unit stands, kept inline in the unit's hot cache lines.
//!
//! Every launch, op start and op end reads its stream's position (is it busy, which op is at
//! its head). With hundreds of units interleaved in time that state is out of cache on
//! nearly every event, so it sits next to the unit's other hot fields (`UnitRt` is laid out
//! in declaration order) instead of in a list of its own: a position is 4 bytes (the head's
//! index in the stream's queue, the busy flag in the top bit) and the first [`INLINE`]
//! streams need no other memory. A stream's queue itself is read-only and shared
//! ([`super::statics::UnitStatics::queues`]).

/// Streams whose positions are stored inline.
pub(super) const INLINE: usize = 8;

/// A stream's position: the index of its head op in its queue and whether it runs an op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct StreamPos(u32);

const BUSY: u32 = 1 << 31;

impl StreamPos {
    /// Index of the head op in the stream's queue (its length once every op ran).
    #[inline]
    pub(super) fn head(self) -> usize {
        (self.0 & !BUSY) as usize
    }

    /// Whether the stream runs its head op.
    #[inline]
    pub(super) fn busy(self) -> bool {
        self.0 & BUSY != 0
    }

    /// Head `head`, busy or not (`head` below 2^31: queues are indexed by `u32` ops).
    #[inline]
    pub(super) fn new(head: usize, busy: bool) -> Self {
        debug_assert!(head < BUSY as usize);
        Self(head as u32 | if busy { BUSY } else { 0 })
    }
}

/// The positions of a unit's device streams (local stream index order).
#[derive(Debug, Clone, Default)]
pub(super) struct Positions {
    inline: [StreamPos; INLINE],
    /// Streams from [`INLINE`] on (rare: most programs use fewer).
    more: Vec<StreamPos>,
    len: u16,
}

impl Positions {
    /// `n` idle streams at the heads of their queues.
    pub(super) fn new(n: usize) -> Self {
        Self {
            inline: [StreamPos::default(); INLINE],
            more: vec![StreamPos::default(); n.saturating_sub(INLINE)],
            len: n as u16,
        }
    }

    /// Number of streams.
    pub(super) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Stream `s`'s position.
    #[inline]
    pub(super) fn get(&self, s: u16) -> StreamPos {
        match self.inline.get(s as usize) {
            Some(&p) => p,
            None => self.more[s as usize - INLINE],
        }
    }

    /// Sets stream `s`'s position.
    #[inline]
    pub(super) fn set(&mut self, s: u16, to: StreamPos) {
        match self.inline.get_mut(s as usize) {
            Some(p) => *p = to,
            None => self.more[s as usize - INLINE] = to,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_inline_and_beyond() {
        let mut p = Positions::new(INLINE + 2);
        assert_eq!(p.len(), INLINE + 2);
        p.set(1, StreamPos::new(7, true));
        p.set((INLINE + 1) as u16, StreamPos::new(3, false));
        assert_eq!((p.get(1).head(), p.get(1).busy()), (7, true));
        let far = p.get((INLINE + 1) as u16);
        assert_eq!((far.head(), far.busy()), (3, false));
        assert_eq!(p.get(0), StreamPos::default());
    }
}
