//! Bandwidth sharing on the network tiers.
//!
//! Every simulated rank has one link per tier. A transfer (one phase of one collective) is
//! active on the link of every participant for its tier. When `k` transfers are active on a
//! rank's link, each gets `1/k` of it; a transfer spanning several ranks progresses at the
//! share of its most loaded participant, `1/max(k)`. Work is measured in nanoseconds at full
//! bandwidth; finish times are re-planned for every transfer that shares a link with one that
//! starts or finishes. All arithmetic is integer, so results are exact and repeatable.
//!
//! Every re-planning gives the transfer a new finish **version**, drawn from one counter for
//! the whole network, so a finish event of an earlier plan is never mistaken for the current
//! one: not even after the id is reused, as the engine does for every phase of a collective.
//! A transfer's storage is kept from its first start until the engine releases its id
//! ([`Network::release`], when the collective completes) and then reused for another id.

use hpfsdp_plan::Tier;

/// Identifies a transfer (the engine uses its collective-instance index).
pub type TransferId = u32;

#[derive(Debug, Clone, Default)]
struct Transfer {
    /// Whether the transfer is active; an inactive slot keeps its `units` buffer for reuse.
    active: bool,
    units: Vec<u32>,
    tier: usize,
    remaining_ns: u64,
    share_k: u64,
    last_ns: u64,
    version: u64,
}

/// A new finish time for a transfer; older versions of its finish event are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// The transfer.
    pub id: TransferId,
    /// When it finishes if nothing else changes.
    pub time_ns: u64,
    /// Version to match against the finish event; unique over the network's lifetime.
    pub version: u64,
}

/// Active transfers and per-(rank, tier) link loads.
#[derive(Debug, Clone, Default)]
pub struct Network {
    links: Vec<Vec<TransferId>>,
    /// Per transfer id (ids are dense: the engine's collective-instance indices): its slot
    /// in `transfers`, [`NO_SLOT`] before its first start and after its release.
    slot_of: Vec<u32>,
    /// Transfer storage by slot.
    transfers: Vec<Transfer>,
    /// Released slots, reused first.
    free: Vec<u32>,
    /// Scratch list of the transfers a re-planning touches (kept to avoid an allocation).
    affected: Vec<TransferId>,
    /// The last finish version handed out (to any transfer).
    last_version: u64,
}

/// [`Network::slot_of`] of an id without storage.
const NO_SLOT: u32 = u32::MAX;

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::IntraMachine => 0,
        Tier::IntraSupernode => 1,
        Tier::InterSupernode => 2,
    }
}

impl Network {
    /// A network for `units` simulated ranks.
    pub fn new(units: usize) -> Self {
        Self {
            links: vec![Vec::new(); units * 3],
            slot_of: Vec::new(),
            transfers: Vec::new(),
            free: Vec::new(),
            affected: Vec::new(),
            last_version: 0,
        }
    }

    /// Starts transfer `id` over `units` on `tier` with `work_ns` of work at full bandwidth;
    /// returns new finish times for it and every transfer whose share changed.
    pub fn start(
        &mut self,
        id: TransferId,
        units: &[u32],
        tier: Tier,
        work_ns: u64,
        now_ns: u64,
    ) -> Vec<Finish> {
        let mut out = Vec::new();
        self.start_into(id, units, tier, work_ns, now_ns, &mut out);
        out
    }

    /// [`Network::start`] appending the new finish times to `out` (a buffer the caller
    /// reuses: the engine starts a transfer for every phase of every collective).
    pub fn start_into(
        &mut self,
        id: TransferId,
        units: &[u32],
        tier: Tier,
        work_ns: u64,
        now_ns: u64,
        out: &mut Vec<Finish>,
    ) {
        let t = tier_index(tier);
        for &u in units {
            self.links[u as usize * 3 + t].push(id);
        }
        let tr = self.slot(id);
        tr.active = true;
        tr.units.clear();
        tr.units.extend_from_slice(units);
        tr.tier = t;
        tr.remaining_ns = work_ns;
        tr.share_k = 1;
        tr.last_ns = now_ns;
        tr.version = 0;
        self.replan(units, t, now_ns, out);
    }

    /// The storage of transfer `id`, created (inactive) when it has none.
    fn slot(&mut self, id: TransferId) -> &mut Transfer {
        let i = id as usize;
        if i >= self.slot_of.len() {
            self.slot_of.resize(i + 1, NO_SLOT);
        }
        if self.slot_of[i] == NO_SLOT {
            self.slot_of[i] = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.transfers.push(Transfer::default());
                    self.transfers.len() as u32 - 1
                }
            };
        }
        &mut self.transfers[self.slot_of[i] as usize]
    }

    /// Index in `transfers` of transfer `id`, when it has storage.
    #[inline]
    fn index(&self, id: TransferId) -> Option<usize> {
        let s = *self.slot_of.get(id as usize)?;
        (s != NO_SLOT).then_some(s as usize)
    }

    /// Active transfer `id`.
    fn active(&self, id: TransferId) -> Option<&Transfer> {
        self.index(id)
            .map(|s| &self.transfers[s])
            .filter(|t| t.active)
    }

    /// Gives up transfer `id`'s storage (its collective completed: the id is never started
    /// again); finish events still queued for it are stale from now on.
    pub fn release(&mut self, id: TransferId) {
        let Some(s) = self.index(id) else {
            return;
        };
        if self.transfers[s].active {
            return; // still on its links: kept (the engine releases only completed ids)
        }
        self.slot_of[id as usize] = NO_SLOT;
        self.free.push(s as u32);
    }

    /// True when `version` is the current finish event of transfer `id`.
    pub fn is_current(&self, id: TransferId, version: u64) -> bool {
        self.active(id).is_some_and(|t| t.version == version)
    }

    /// Removes a finished transfer; returns new finish times of the transfers it shared with.
    pub fn finish(&mut self, id: TransferId, now_ns: u64) -> Vec<Finish> {
        let mut out = Vec::new();
        self.finish_into(id, now_ns, &mut out);
        out
    }

    /// [`Network::finish`] appending the new finish times to `out`.
    pub fn finish_into(&mut self, id: TransferId, now_ns: u64, out: &mut Vec<Finish>) {
        let Some(s) = self.index(id).filter(|&s| self.transfers[s].active) else {
            return;
        };
        let tr = &mut self.transfers[s];
        tr.active = false;
        let (units, tier) = (std::mem::take(&mut tr.units), tr.tier);
        for &u in &units {
            let link = &mut self.links[u as usize * 3 + tier];
            if let Some(pos) = link.iter().position(|&x| x == id) {
                link.remove(pos);
            }
        }
        self.replan(&units, tier, now_ns, out);
        self.transfers[s].units = units;
    }

    /// Number of transfers active on `unit`'s link of `tier`.
    pub fn load(&self, unit: u32, tier: Tier) -> usize {
        self.links[unit as usize * 3 + tier_index(tier)].len()
    }

    /// The progress of active transfer `id`: (tier index, remaining work at the share it had
    /// since `last_ns`, that share's divisor, `last_ns`); `None` when it is not active. Used
    /// to copy a transfer when the engine forks a shared prefix.
    pub fn progress(&self, id: TransferId) -> Option<(usize, u64, u64, u64)> {
        self.active(id)
            .map(|t| (t.tier, t.remaining_ns, t.share_k, t.last_ns))
    }

    /// Re-creates a transfer with the progress [`Network::progress`] gave, over `units`,
    /// without re-planning anyone (the copy stands for the original, whose peers are copied
    /// too); returns the version its pending finish event must carry.
    pub fn restore(
        &mut self,
        id: TransferId,
        units: &[u32],
        progress: (usize, u64, u64, u64),
    ) -> u64 {
        let (tier, remaining_ns, share_k, last_ns) = progress;
        for &u in units {
            self.links[u as usize * 3 + tier].push(id);
        }
        self.last_version += 1;
        let version = self.last_version;
        let tr = self.slot(id);
        tr.active = true;
        tr.units.clear();
        tr.units.extend_from_slice(units);
        tr.tier = tier;
        tr.remaining_ns = remaining_ns;
        tr.share_k = share_k;
        tr.last_ns = last_ns;
        tr.version = version;
        version
    }

    fn replan(&mut self, units: &[u32], tier: usize, now_ns: u64, out: &mut Vec<Finish>) {
        let mut affected = std::mem::take(&mut self.affected);
        affected.clear();
        affected.extend(
            units
                .iter()
                .flat_map(|&u| self.links[u as usize * 3 + tier].iter().copied()),
        );
        affected.sort_unstable();
        affected.dedup();
        out.reserve(affected.len());
        for &id in &affected {
            let Some(tr) = self.active(id) else {
                continue;
            };
            let k = tr
                .units
                .iter()
                .map(|&u| self.links[u as usize * 3 + tr.tier].len() as u64)
                .max()
                .unwrap_or(1)
                .max(1);
            let Some(s) = self.index(id) else {
                continue;
            };
            let tr = &mut self.transfers[s];
            let done = (now_ns - tr.last_ns) / tr.share_k;
            tr.remaining_ns = tr.remaining_ns.saturating_sub(done);
            tr.last_ns = now_ns;
            tr.share_k = k;
            self.last_version += 1;
            tr.version = self.last_version;
            out.push(Finish {
                id,
                time_ns: now_ns + tr.remaining_ns * k,
                version: tr.version,
            });
        }
        self.affected = affected;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_transfers_share_a_link() {
        let mut n = Network::new(2);
        // A: 100 ns of work alone from t=0.
        let f = n.start(1, &[0, 1], Tier::IntraMachine, 100, 0);
        assert_eq!(
            f,
            vec![Finish {
                id: 1,
                time_ns: 100,
                version: 1
            }]
        );
        // B joins at t=40 on unit 1 only: A has 60 left at half rate -> 160; B 50 -> 140.
        let f = n.start(2, &[1], Tier::IntraMachine, 50, 40);
        assert_eq!(
            f,
            vec![
                Finish {
                    id: 1,
                    time_ns: 160,
                    version: 2
                },
                Finish {
                    id: 2,
                    time_ns: 140,
                    version: 3
                }
            ]
        );
        assert_eq!(n.load(1, Tier::IntraMachine), 2);
        assert!(!n.is_current(1, 1));
        // B finishes at 140: A did 50 of its 60, 10 left alone -> 150.
        let f = n.finish(2, 140);
        assert_eq!(
            f,
            vec![Finish {
                id: 1,
                time_ns: 150,
                version: 4
            }]
        );
        // Other tiers are independent.
        let f = n.start(3, &[1], Tier::InterSupernode, 7, 140);
        assert_eq!(
            f,
            vec![Finish {
                id: 3,
                time_ns: 147,
                version: 5
            }]
        );
    }

    /// The engine reuses a collective's transfer id for each of its phases. A finish event
    /// left over from an earlier phase (its plan was superseded by an earlier finish) must not
    /// end a later phase that happens to be re-planned as often.
    #[test]
    fn stale_finish_of_an_earlier_phase_never_matches_a_reused_id() {
        let mut n = Network::new(1);
        // Phase 1 of transfer 1: 100 ns alone, then shared with 2 (10 ns) from t=0.
        n.start(1, &[0], Tier::IntraSupernode, 100, 0);
        let f = n.start(2, &[0], Tier::IntraSupernode, 10, 0);
        let stale = f.iter().find(|f| f.id == 1).copied().unwrap();
        assert_eq!(stale.time_ns, 200);
        // 2 ends at 20; 1 speeds up (its event at 200 goes stale) and ends at 110.
        let f = n.finish(2, 20);
        assert_eq!(f[0].time_ns, 110);
        assert!(n.is_current(1, f[0].version));
        n.finish(1, 110);
        // Phase 2 reuses id 1 and is re-planned once, as phase 1 was before its stale event.
        n.start(1, &[0], Tier::IntraSupernode, 500, 110);
        let f = n.start(3, &[0], Tier::IntraSupernode, 500, 110);
        let current = f.iter().find(|f| f.id == 1).copied().unwrap();
        assert_eq!(current.time_ns, 1110);
        assert!(
            !n.is_current(1, stale.version),
            "the event at 200 would end phase 2"
        );
        assert!(n.is_current(1, current.version));
    }

    /// A released id's storage goes to the next new id; the released id's queued finish
    /// events are stale, and an active transfer is never released.
    #[test]
    fn released_storage_is_reused_and_old_finishes_are_stale() {
        let mut n = Network::new(1);
        let f = n.start(7, &[0], Tier::IntraMachine, 10, 0);
        n.release(7);
        assert_eq!(n.transfers.len(), 1, "active: kept");
        assert!(n.is_current(7, f[0].version));
        n.finish(7, 10);
        n.release(7);
        assert!(!n.is_current(7, f[0].version) && n.progress(7).is_none());
        let g = n.start(9, &[0], Tier::IntraMachine, 5, 10);
        assert_eq!(n.transfers.len(), 1, "the released storage is reused");
        assert_eq!((g[0].id, g[0].time_ns), (9, 15));
        assert!(n.is_current(9, g[0].version) && !n.is_current(7, g[0].version));
    }
}
