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

use hpfsdp_plan::Tier;
use std::collections::HashMap;

/// Identifies a transfer (the engine uses its collective-instance index).
pub type TransferId = u32;

#[derive(Debug, Clone)]
struct Transfer {
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
    transfers: HashMap<TransferId, Transfer>,
    /// The last finish version handed out (to any transfer).
    last_version: u64,
}

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
            transfers: HashMap::new(),
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
        let t = tier_index(tier);
        for &u in units {
            self.links[u as usize * 3 + t].push(id);
        }
        self.transfers.insert(
            id,
            Transfer {
                units: units.to_vec(),
                tier: t,
                remaining_ns: work_ns,
                share_k: 1,
                last_ns: now_ns,
                version: 0,
            },
        );
        self.replan(units, t, now_ns)
    }

    /// True when `version` is the current finish event of transfer `id`.
    pub fn is_current(&self, id: TransferId, version: u64) -> bool {
        self.transfers
            .get(&id)
            .is_some_and(|t| t.version == version)
    }

    /// Removes a finished transfer; returns new finish times of the transfers it shared with.
    pub fn finish(&mut self, id: TransferId, now_ns: u64) -> Vec<Finish> {
        let Some(tr) = self.transfers.remove(&id) else {
            return Vec::new();
        };
        for &u in &tr.units {
            let link = &mut self.links[u as usize * 3 + tr.tier];
            if let Some(pos) = link.iter().position(|&x| x == id) {
                link.remove(pos);
            }
        }
        self.replan(&tr.units, tr.tier, now_ns)
    }

    /// Number of transfers active on `unit`'s link of `tier`.
    pub fn load(&self, unit: u32, tier: Tier) -> usize {
        self.links[unit as usize * 3 + tier_index(tier)].len()
    }

    /// The progress of active transfer `id`: (tier index, remaining work at the share it had
    /// since `last_ns`, that share's divisor, `last_ns`); `None` when it is not active. Used
    /// to copy a transfer when the engine forks a shared prefix.
    pub fn progress(&self, id: TransferId) -> Option<(usize, u64, u64, u64)> {
        self.transfers
            .get(&id)
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
        self.transfers.insert(
            id,
            Transfer {
                units: units.to_vec(),
                tier,
                remaining_ns,
                share_k,
                last_ns,
                version: self.last_version,
            },
        );
        self.last_version
    }

    fn replan(&mut self, units: &[u32], tier: usize, now_ns: u64) -> Vec<Finish> {
        let mut affected: Vec<TransferId> = units
            .iter()
            .flat_map(|&u| self.links[u as usize * 3 + tier].iter().copied())
            .collect();
        affected.sort_unstable();
        affected.dedup();
        let mut out = Vec::with_capacity(affected.len());
        for id in affected {
            let Some(tr) = self.transfers.get(&id) else {
                continue;
            };
            let k = tr
                .units
                .iter()
                .map(|&u| self.links[u as usize * 3 + tr.tier].len() as u64)
                .max()
                .unwrap_or(1)
                .max(1);
            let Some(tr) = self.transfers.get_mut(&id) else {
                continue;
            };
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
        out
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
}
