//! Live-memory accounting per simulated rank: bytes allocated when ops start and freed when
//! they end, per tag, giving the peak and a memory-over-time series.

use hpfsdp_program::step::{MemTag, MemoryEffect, ResidentMemory};
use serde::{Deserialize, Serialize};

/// Live bytes at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Nanoseconds from the start of the step.
    pub time_ns: u64,
    /// Bytes live after every change at this instant.
    pub live_bytes: u64,
}

/// Bytes of one tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagBytes {
    /// The tag.
    pub tag: MemTag,
    /// Bytes.
    pub bytes: u64,
}

/// Memory figures of one simulated rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Highest live total (the "peak allocated" figure).
    pub peak_bytes: u64,
    /// First instant the peak was reached.
    pub peak_time_ns: u64,
    /// What was live at the peak, per tag (tags with zero bytes omitted).
    pub at_peak: Vec<TagBytes>,
    /// Highest live bytes each tag reached on its own (tags with zero bytes omitted).
    pub peak_by_tag: Vec<TagBytes>,
    /// Live bytes at the end of the step.
    pub end_bytes: u64,
    /// Live total after every change (one sample per instant); empty when not recorded.
    pub series: Vec<MemorySample>,
}

const TAGS: usize = MemTag::ALL.len();

/// Bytes of one tag allocated or freed by an op, in the compact form the engine keeps for its
/// inner loop (the tag as its [`MemTag::index`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TagDelta {
    /// Bytes allocated or freed.
    pub bytes: u64,
    /// [`MemTag::index`] of the tag.
    pub tag: u8,
}

impl TagDelta {
    /// `bytes` of `tag`.
    pub fn new(tag: MemTag, bytes: u64) -> Self {
        Self {
            bytes,
            tag: tag.index() as u8,
        }
    }
}

/// Tracks live bytes of one simulated rank while the engine runs.
#[derive(Debug, Clone)]
pub struct MemoryTracker {
    live: [u64; TAGS],
    total: u64,
    peak: u64,
    peak_time_ns: u64,
    at_peak: [u64; TAGS],
    peak_by_tag: [u64; TAGS],
    series: Option<Vec<MemorySample>>,
}

impl MemoryTracker {
    /// Starts with the resident memory at time 0; `record_series` keeps the time series.
    pub fn new(resident: &[ResidentMemory], record_series: bool) -> Self {
        let mut t = Self {
            live: [0; TAGS],
            total: 0,
            peak: 0,
            peak_time_ns: 0,
            at_peak: [0; TAGS],
            peak_by_tag: [0; TAGS],
            series: record_series.then(Vec::new),
        };
        for r in resident {
            t.live[r.tag.index()] = t.live[r.tag.index()].saturating_add(r.bytes);
            t.total = t.total.saturating_add(r.bytes);
        }
        t.observe(0);
        t
    }

    /// Applies the allocations of an op starting at `time_ns`.
    pub fn on_start(&mut self, time_ns: u64, effects: &[MemoryEffect]) {
        let mut changed = false;
        for e in effects.iter().filter(|e| e.alloc_bytes > 0) {
            self.live[e.tag.index()] = self.live[e.tag.index()].saturating_add(e.alloc_bytes);
            self.total = self.total.saturating_add(e.alloc_bytes);
            changed = true;
        }
        if changed {
            self.observe(time_ns);
        }
    }

    /// Applies the frees of an op ending at `time_ns`. Frees never take a tag below zero
    /// (programs are validated so they cannot in issue order).
    pub fn on_end(&mut self, time_ns: u64, effects: &[MemoryEffect]) {
        let mut changed = false;
        for e in effects.iter().filter(|e| e.free_bytes > 0) {
            let slot = &mut self.live[e.tag.index()];
            let freed = e.free_bytes.min(*slot);
            *slot -= freed;
            self.total = self.total.saturating_sub(freed);
            changed = true;
        }
        if changed {
            self.observe(time_ns);
        }
    }

    /// Applies allocations at `time_ns` given as [`TagDelta`]s (an op's non-zero
    /// `alloc_bytes`, in order): the same as [`MemoryTracker::on_start`] with those effects.
    #[inline]
    pub fn alloc(&mut self, time_ns: u64, allocs: &[TagDelta]) {
        if allocs.is_empty() {
            return;
        }
        for a in allocs {
            let t = a.tag as usize;
            self.live[t] = self.live[t].saturating_add(a.bytes);
            self.total = self.total.saturating_add(a.bytes);
            // Only the tags allocated can reach a new peak of their own.
            self.peak_by_tag[t] = self.peak_by_tag[t].max(self.live[t]);
        }
        self.observe_total(time_ns);
    }

    /// Applies frees at `time_ns` given as [`TagDelta`]s (an op's non-zero `free_bytes`, in
    /// order): the same as [`MemoryTracker::on_end`] with those effects.
    #[inline]
    pub fn free(&mut self, time_ns: u64, frees: &[TagDelta]) {
        if frees.is_empty() {
            return;
        }
        for f in frees {
            let slot = &mut self.live[f.tag as usize];
            let freed = f.bytes.min(*slot);
            *slot -= freed;
            self.total = self.total.saturating_sub(freed);
        }
        // Frees lower tags: no tag reaches a new peak of its own.
        self.observe_total(time_ns);
    }

    fn observe(&mut self, time_ns: u64) {
        for (p, l) in self.peak_by_tag.iter_mut().zip(self.live) {
            *p = (*p).max(l);
        }
        self.observe_total(time_ns);
    }

    /// Peak and series after a change; every tag's own peak is up to date already (every
    /// change keeps `peak_by_tag >= live` per tag).
    #[inline]
    fn observe_total(&mut self, time_ns: u64) {
        if self.total > self.peak || (self.peak == 0 && time_ns == 0) {
            self.peak = self.total;
            self.peak_time_ns = time_ns;
            self.at_peak = self.live;
        }
        if let Some(series) = &mut self.series {
            match series.last_mut() {
                Some(last) if last.time_ns == time_ns => last.live_bytes = self.total,
                _ => series.push(MemorySample {
                    time_ns,
                    live_bytes: self.total,
                }),
            }
        }
    }

    /// This tracker as it would read had the step started with `to` resident instead of
    /// `from`: every live figure shifted by the difference per tag, the series so far left
    /// out (it is the original's shifted by [`resident_shift`]; [`join_series`] puts the two
    /// together). Exact as long as no free of a tag whose resident bytes differ was clamped
    /// at zero (the prefix sharing of [`crate::share`] keeps such tags equal within a block).
    pub fn rebased(&self, from: &[ResidentMemory], to: &[ResidentMemory]) -> Self {
        let mut delta = [0i128; TAGS];
        for r in from {
            delta[r.tag.index()] -= r.bytes as i128;
        }
        for r in to {
            delta[r.tag.index()] += r.bytes as i128;
        }
        let sum: i128 = delta.iter().sum();
        let mut t = Self {
            series: self.series.as_ref().map(|_| Vec::new()),
            ..*self
        };
        for (i, &d) in delta.iter().enumerate() {
            t.live[i] = shift(t.live[i], d);
            t.at_peak[i] = shift(t.at_peak[i], d);
            t.peak_by_tag[i] = shift(t.peak_by_tag[i], d);
        }
        t.total = shift(t.total, sum);
        t.peak = shift(t.peak, sum);
        t
    }

    /// The series recorded so far (empty when not recorded).
    pub fn series(&self) -> &[MemorySample] {
        self.series.as_deref().unwrap_or(&[])
    }

    /// The figures so far.
    pub fn report(&self) -> MemoryReport {
        let tags = |a: &[u64; TAGS]| {
            MemTag::ALL
                .iter()
                .zip(a)
                .filter(|(_, b)| **b > 0)
                .map(|(&tag, &bytes)| TagBytes { tag, bytes })
                .collect()
        };
        MemoryReport {
            peak_bytes: self.peak,
            peak_time_ns: self.peak_time_ns,
            at_peak: tags(&self.at_peak),
            peak_by_tag: tags(&self.peak_by_tag),
            end_bytes: self.total,
            series: self.series.clone().unwrap_or_default(),
        }
    }
}

fn shift(x: u64, d: i128) -> u64 {
    (x as i128 + d).clamp(0, u64::MAX as i128) as u64
}

/// Total resident bytes of `to` minus those of `from`: how much a series recorded with `from`
/// resident must be shifted to read as if `to` had been.
pub fn resident_shift(from: &[ResidentMemory], to: &[ResidentMemory]) -> i128 {
    let sum = |r: &[ResidentMemory]| r.iter().map(|x| x.bytes as i128).sum::<i128>();
    sum(to) - sum(from)
}

/// A series recorded in two parts: `head` (shifted by `shift` bytes) then `tail`; a tail
/// sample at the head's last instant replaces it (one sample per instant).
pub fn join_series(
    head: &[MemorySample],
    shift_bytes: i128,
    tail: &[MemorySample],
) -> Vec<MemorySample> {
    let mut out: Vec<MemorySample> = Vec::with_capacity(head.len() + tail.len());
    out.extend(head.iter().map(|s| MemorySample {
        time_ns: s.time_ns,
        live_bytes: shift(s.live_bytes, shift_bytes),
    }));
    if let (Some(last), Some(first)) = (out.last(), tail.first())
        && last.time_ns == first.time_ns
    {
        out.pop();
    }
    out.extend_from_slice(tail);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_and_series() {
        let mut m = MemoryTracker::new(
            &[ResidentMemory {
                tag: MemTag::Params,
                bytes: 10,
            }],
            true,
        );
        let ag = [MemoryEffect {
            tag: MemTag::Params,
            alloc_bytes: 40,
            free_bytes: 0,
        }];
        let act = [
            MemoryEffect {
                tag: MemTag::Activations,
                alloc_bytes: 5,
                free_bytes: 0,
            },
            MemoryEffect {
                tag: MemTag::Params,
                alloc_bytes: 0,
                free_bytes: 40,
            },
        ];
        m.on_start(100, &ag);
        m.on_start(200, &act);
        m.on_end(300, &act);
        m.on_start(300, &ag);
        let r = m.report();
        assert_eq!(r.peak_bytes, 55);
        assert_eq!(r.peak_time_ns, 200);
        assert_eq!(r.end_bytes, 55);
        assert_eq!(
            r.at_peak,
            vec![
                TagBytes {
                    tag: MemTag::Params,
                    bytes: 50
                },
                TagBytes {
                    tag: MemTag::Activations,
                    bytes: 5
                }
            ]
        );
        let times: Vec<_> = r.series.iter().map(|s| (s.time_ns, s.live_bytes)).collect();
        assert_eq!(times, vec![(0, 10), (100, 50), (200, 55), (300, 55)]);

        // The compact form gives the same figures.
        let compact = |effects: &[MemoryEffect], f: fn(&MemoryEffect) -> u64| -> Vec<TagDelta> {
            effects
                .iter()
                .filter(|e| f(e) > 0)
                .map(|e| TagDelta::new(e.tag, f(e)))
                .collect()
        };
        let mut c = MemoryTracker::new(
            &[ResidentMemory {
                tag: MemTag::Params,
                bytes: 10,
            }],
            true,
        );
        c.alloc(100, &compact(&ag, |e| e.alloc_bytes));
        c.alloc(200, &compact(&act, |e| e.alloc_bytes));
        c.free(300, &compact(&act, |e| e.free_bytes));
        c.alloc(300, &compact(&ag, |e| e.alloc_bytes));
        c.free(400, &[]);
        assert_eq!(c.report(), r);
    }
}
