//! The engine's event queue: a radix heap keyed by `(time, sequence number)`.
//!
//! The engine only ever schedules events at or after the time of the event it is processing,
//! and sequence numbers only grow, so keys pushed are never below the last key popped: the
//! queue is *monotone*, which a radix heap exploits. Entries live in 129 buckets by the
//! highest bit in which their key differs from the last popped key; a push is O(1), and a pop
//! empties the lowest non-empty bucket into lower ones (each entry moves down a handful of
//! times in its life). Keys are unique (the sequence number), so entries come out in exactly
//! the `(time, sequence)` order of a binary heap: results are unchanged, bit for bit.

use std::cmp::Reverse;

/// A `(time, sequence, payload)` entry, wrapped as the engine's former binary heap held it.
pub(super) type Entry<E> = Reverse<(u64, u64, E)>;

const BUCKETS: usize = 129;

/// A monotone min-queue of `(time, sequence, payload)` entries with unique `(time, sequence)`.
#[derive(Debug, Clone)]
pub(super) struct EventQueue<E> {
    buckets: Vec<Vec<Entry<E>>>,
    /// Bit `i - 1` set when bucket `i` (1..=128) holds entries.
    nonempty: u128,
    /// The last key popped (entries are never below it).
    last: u128,
    len: usize,
}

fn key<E>(e: &Entry<E>) -> u128 {
    let Reverse((time, seq, _)) = e;
    (u128::from(*time) << 64) | u128::from(*seq)
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue.
    pub(super) fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            nonempty: 0,
            last: 0,
            len: 0,
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn bucket_of(&self, k: u128) -> usize {
        (128 - (k ^ self.last).leading_zeros()) as usize
    }

    fn put(&mut self, e: Entry<E>) {
        let b = self.bucket_of(key(&e));
        self.buckets[b].push(e);
        if b > 0 {
            self.nonempty |= 1 << (b - 1);
        }
    }

    /// Adds an entry; its `(time, sequence)` must not be below the last one popped (the
    /// engine never schedules into the past). A key below it is a logic error of the caller:
    /// it is still queued and comes out next, never lost.
    #[inline]
    pub(super) fn push(&mut self, e: Entry<E>) {
        let k = key(&e);
        if k < self.last {
            // Not monotone: reset the reference so the invariant holds again.
            self.rebase(k);
        }
        self.put(e);
        self.len += 1;
    }

    /// Re-buckets every entry against a new reference key `k` (at most every queued key).
    fn rebase(&mut self, k: u128) {
        let all: Vec<Entry<E>> = self.buckets.iter_mut().flat_map(std::mem::take).collect();
        self.nonempty = 0;
        self.last = k;
        for e in all {
            self.put(e);
        }
    }

    /// Removes and returns the entry with the lowest `(time, sequence)`.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Entry<E>> {
        if self.buckets[0].is_empty() {
            if self.nonempty == 0 {
                return None;
            }
            let b = self.nonempty.trailing_zeros() as usize + 1;
            self.nonempty &= !(1 << (b - 1));
            let mut moved = std::mem::take(&mut self.buckets[b]);
            self.last = moved.iter().map(key).min().unwrap_or(self.last);
            for e in moved.drain(..) {
                self.put(e);
            }
            // Hand the emptied buffer back so its capacity is reused.
            self.buckets[b] = moved;
        }
        let e = self.buckets[0].pop()?;
        self.len -= 1;
        Some(e)
    }

    /// Every queued entry, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry<E>> {
        self.buckets.iter().flatten()
    }
}

impl<E: Copy> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BinaryHeap;

    /// Same pop order as a binary heap on a monotone workload with many equal times.
    #[test]
    fn pops_in_binary_heap_order() {
        let mut q = EventQueue::new();
        let mut h = BinaryHeap::new();
        let mut seq = 0u64;
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut now = 0u64;
        let mut popped = Vec::new();
        for round in 0..20_000 {
            let pushes = (rand() % 3) as usize + usize::from(round < 50);
            for _ in 0..pushes {
                seq += 1;
                let dt = match rand() % 4 {
                    0 => 0,
                    1 => rand() % 10,
                    2 => rand() % 100_000,
                    _ => rand() % 5_000_000_000,
                };
                let e = Reverse((now + dt, seq, (seq % 7) as u32));
                q.push(e);
                h.push(e);
            }
            assert_eq!(q.len(), h.len());
            let (a, b) = (q.pop(), h.pop());
            assert_eq!(a, b);
            if let Some(Reverse((t, _, _))) = a {
                now = t;
                popped.push(a);
            }
            let mut all: Vec<_> = q.iter().copied().collect();
            let mut want: Vec<_> = h.iter().copied().collect();
            if round % 1000 == 0 {
                all.sort();
                want.sort();
                assert_eq!(all, want);
            }
        }
        while let Some(e) = h.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert_eq!(q.pop(), None);
        assert!(popped.len() > 10_000);
    }

    /// A key below the last popped one (a caller bug) is still delivered, first.
    #[test]
    fn a_push_into_the_past_is_not_lost() {
        let mut q = EventQueue::new();
        q.push(Reverse((100, 1, 'a')));
        q.push(Reverse((200, 2, 'b')));
        assert_eq!(q.pop(), Some(Reverse((100, 1, 'a'))));
        q.push(Reverse((50, 3, 'c')));
        assert_eq!(q.pop(), Some(Reverse((50, 3, 'c'))));
        assert_eq!(q.pop(), Some(Reverse((200, 2, 'b'))));
        assert_eq!(q.pop(), None);
    }
}
