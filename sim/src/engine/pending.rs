//! Collective instances waiting for participants, looked up by (communicator, launch index).
//!
//! Communicators are interned to dense ids, so the table is a vector per communicator rather
//! than a hash map: a rendezvous touches one short list (a communicator rarely has more than
//! a few collectives waiting at once) instead of hashing a key.

use smallvec::SmallVec;

/// Pending collective instances: `(communicator, launch index) -> instance`.
#[derive(Debug, Clone, Default)]
pub(super) struct Pending {
    /// Per communicator id: (launch index, instance) of its waiting instances.
    /// Inline for two: a lookup touches the table's entry, not a list stored elsewhere.
    by_key: Vec<SmallVec<[(u32, u32); 2]>>,
}

impl Pending {
    /// A table for communicator ids `0..keys` (it grows if a larger id comes).
    pub(super) fn new(keys: usize) -> Self {
        Self {
            by_key: vec![SmallVec::new(); keys],
        }
    }

    /// The instance waiting for launch index `seq` on communicator `key`.
    #[inline]
    pub(super) fn get(&self, &(key, seq): &(u32, u32)) -> Option<&u32> {
        self.by_key
            .get(key as usize)?
            .iter()
            .find(|(s, _)| *s == seq)
            .map(|(_, i)| i)
    }

    /// Records `inst` as waiting for launch index `seq` on communicator `key`.
    pub(super) fn insert(&mut self, (key, seq): (u32, u32), inst: u32) {
        let k = key as usize;
        if k >= self.by_key.len() {
            self.by_key.resize(k + 1, SmallVec::new());
        }
        let list = &mut self.by_key[k];
        match list.iter_mut().find(|(s, _)| *s == seq) {
            Some(entry) => entry.1 = inst,
            None => list.push((seq, inst)),
        }
    }

    /// Forgets the instance of `(key, seq)` (all its participants have arrived).
    #[inline]
    pub(super) fn remove(&mut self, &(key, seq): &(u32, u32)) {
        if let Some(list) = self.by_key.get_mut(key as usize)
            && let Some(pos) = list.iter().position(|(s, _)| *s == seq)
        {
            list.swap_remove(pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut p = Pending::new(2);
        assert_eq!(p.get(&(0, 0)), None);
        p.insert((0, 0), 7);
        p.insert((0, 1), 8);
        p.insert((5, 0), 9); // grows
        assert_eq!(p.get(&(0, 0)), Some(&7));
        assert_eq!(p.get(&(0, 1)), Some(&8));
        assert_eq!(p.get(&(5, 0)), Some(&9));
        assert_eq!(p.get(&(1, 0)), None);
        p.remove(&(0, 0));
        assert_eq!(p.get(&(0, 0)), None);
        assert_eq!(p.get(&(0, 1)), Some(&8));
        p.insert((0, 1), 10);
        assert_eq!(p.get(&(0, 1)), Some(&10));
        p.remove(&(9, 9)); // unknown: nothing happens
    }
}
