//! A compact, bit-exact binary form of one rank's [`RankRun`], so that the ranks of a
//! multi-process run can send their results to rank 0 (which assembles the report).
//!
//! Floats travel as their bit patterns (NaN and -0.0 survive); integers as little-endian u64;
//! strings as length + UTF-8. The format is private to one build of hpfsdp (every process of a
//! job runs the same binary), so it carries a magic number but no schema evolution.

use hpfsdp_backends::{CollectiveKind, DType, GroupId, ReduceOp, TraceEvent};

use super::harness::{RankResult, RankRun, StepShards};
use super::muon::MuonStepRecord;
use crate::muon::StepReport;
use crate::runtime::DispatchStats;
use crate::runtime::fsdp::FsdpCounts;

/// First word of an encoded rank run ("hpfsdpRR", version 1 in the low byte).
const MAGIC: u64 = 0x6870_6673_6470_5201;

const KINDS: [CollectiveKind; 9] = [
    CollectiveKind::AllGather,
    CollectiveKind::ReduceScatter,
    CollectiveKind::AllReduce,
    CollectiveKind::Broadcast,
    CollectiveKind::AllToAll,
    CollectiveKind::AllToAllV,
    CollectiveKind::Barrier,
    CollectiveKind::Send,
    CollectiveKind::Recv,
];

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// Appends values to a byte vector.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn opt(&mut self, x: Option<u64>) {
        self.u(x.map_or(0, |v| v + 1));
    }
    fn f32s(&mut self, v: &[f32]) {
        self.u(v.len() as u64);
        for x in v {
            self.0.extend_from_slice(&x.to_bits().to_le_bytes());
        }
    }
    fn str(&mut self, s: &str) {
        self.u(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
    fn nested(&mut self, v: &[Vec<f32>]) {
        self.u(v.len() as u64);
        for x in v {
            self.f32s(x);
        }
    }
}

/// Reads values back in the order they were written; every read checks bounds.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

type WireResult<T> = Result<T, String>;

impl Reader<'_> {
    fn take(&mut self, n: usize) -> WireResult<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated record at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u(&mut self) -> WireResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn n(&mut self) -> WireResult<usize> {
        Ok(self.u()? as usize)
    }
    fn opt(&mut self) -> WireResult<Option<u64>> {
        Ok(self.u()?.checked_sub(1))
    }
    fn len(&mut self, each_bytes: usize) -> WireResult<usize> {
        let n = self.n()?;
        if n.saturating_mul(each_bytes.max(1)) > self.bytes.len() - self.at {
            return Err(format!("length {n} at byte {} exceeds the record", self.at));
        }
        Ok(n)
    }
    fn f32s(&mut self) -> WireResult<Vec<f32>> {
        let n = self.len(4)?;
        let b = self.take(n * 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect())
    }
    fn str(&mut self) -> WireResult<String> {
        let n = self.len(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|e| e.to_string())
    }
    fn nested(&mut self) -> WireResult<Vec<Vec<f32>>> {
        let n = self.len(8)?;
        (0..n).map(|_| self.f32s()).collect()
    }
}

fn code<T: PartialEq>(all: &[T], x: &T) -> u64 {
    all.iter()
        .position(|y| y == x)
        .map_or(u64::MAX, |i| i as u64)
}

fn pick<T: Copy>(all: &[T], c: u64, what: &str) -> WireResult<T> {
    all.get(c as usize)
        .copied()
        .ok_or_else(|| format!("unknown {what} code {c}"))
}

fn put_event(w: &mut Writer, e: &TraceEvent) {
    w.u(e.index as u64);
    w.u(code(&KINDS, &e.kind));
    w.str(&e.group_label);
    w.opt(e.group_id.map(|g| g.0));
    w.u(e.ranks.len() as u64);
    e.ranks.iter().for_each(|&r| w.u(r as u64));
    w.u(e.seq);
    w.u(e.dtype.code());
    w.u(e.input_elements as u64);
    w.u(e.input_bytes as u64);
    w.u(e.output_bytes as u64);
    w.opt(e.op.map(|o| code(&OPS, &o)));
    w.opt(e.root.map(|r| r as u64));
    w.opt(e.peer.map(|r| r as u64));
    w.opt(e.tag);
}

fn get_event(r: &mut Reader<'_>) -> WireResult<TraceEvent> {
    let index = r.n()?;
    let kind = pick(&KINDS, r.u()?, "call kind")?;
    let group_label = r.str()?;
    let group_id = r.opt()?.map(GroupId);
    let n = r.len(8)?;
    let ranks = (0..n).map(|_| r.n()).collect::<WireResult<_>>()?;
    let seq = r.u()?;
    let dc = r.u()?;
    let dtype = DType::from_code(dc).ok_or_else(|| format!("unknown dtype code {dc}"))?;
    Ok(TraceEvent {
        index,
        kind,
        group_label,
        group_id,
        ranks,
        seq,
        dtype,
        input_elements: r.n()?,
        input_bytes: r.n()?,
        output_bytes: r.n()?,
        op: r.opt()?.map(|c| pick(&OPS, c, "reduce op")).transpose()?,
        root: r.opt()?.map(|x| x as usize),
        peer: r.opt()?.map(|x| x as usize),
        tag: r.opt()?,
    })
}

fn put_step_report(w: &mut Writer, s: &StepReport) {
    for x in [
        s.ns_matrices as u64,
        s.gather_bytes,
        s.relay_bytes,
        s.replica_bytes,
    ] {
        w.u(x);
    }
    for x in [s.collectives, s.momentum_elems, s.max_in_flight] {
        w.u(x as u64);
    }
}

fn get_step_report(r: &mut Reader<'_>) -> WireResult<StepReport> {
    Ok(StepReport {
        ns_matrices: r.n()?,
        gather_bytes: r.u()?,
        relay_bytes: r.u()?,
        replica_bytes: r.u()?,
        collectives: r.n()?,
        momentum_elems: r.n()?,
        max_in_flight: r.n()?,
    })
}

fn put_muon(w: &mut Writer, m: &MuonStepRecord) {
    put_step_report(w, &m.dedup);
    w.u(u64::from(m.naive.is_some()));
    if let Some(n) = &m.naive {
        put_step_report(w, n);
    }
    w.u(m.naive_mismatch.len() as u64);
    m.naive_mismatch.iter().for_each(|s| w.str(s));
    w.u(m.dedup_calls.start as u64);
    w.u(m.dedup_calls.end as u64);
}

fn get_muon(r: &mut Reader<'_>) -> WireResult<MuonStepRecord> {
    let dedup = get_step_report(r)?;
    let naive = if r.u()? == 1 {
        Some(get_step_report(r)?)
    } else {
        None
    };
    let n = r.len(8)?;
    let naive_mismatch = (0..n).map(|_| r.str()).collect::<WireResult<_>>()?;
    Ok(MuonStepRecord {
        dedup,
        naive,
        naive_mismatch,
        dedup_calls: r.n()?..r.n()?,
    })
}

fn stats_words(s: &DispatchStats) -> [u64; 7] {
    [
        s.ops,
        s.transitions,
        s.rule_lookups,
        s.rule_cache_hits,
        s.output_checks,
        s.contract_checks,
        s.validation_host_ns,
    ]
}

fn fsdp_words(f: &FsdpCounts) -> [u64; 5] {
    [
        f.all_gathers,
        f.reduce_scatters,
        f.all_reduces,
        f.copy_unshards,
        f.view_unshards,
    ]
}

/// The bytes of one rank's run.
pub fn encode_rank_run(run: &RankRun) -> Vec<u8> {
    let mut w = Writer::default();
    let res = &run.result;
    w.u(MAGIC);
    w.u(res.losses.len() as u64);
    for (id, l) in &res.losses {
        w.u(*id as u64);
        w.u(u64::from(l.to_bits()));
    }
    w.u(res.history.len() as u64);
    for h in &res.history {
        w.nested(&h.grads);
        w.nested(&h.params);
    }
    w.u(res.muon.len() as u64);
    res.muon.iter().for_each(|m| put_muon(&mut w, m));
    stats_words(&res.stats).iter().for_each(|&x| w.u(x));
    fsdp_words(&res.fsdp).iter().for_each(|&x| w.u(x));
    w.u(res.step_seconds.to_bits());
    w.u(res.cached_rules as u64);
    w.u(run.first_step_calls as u64);
    w.u(run.trace.len() as u64);
    run.trace.iter().for_each(|e| put_event(&mut w, e));
    w.0
}

/// One rank's run back from [`encode_rank_run`]'s bytes.
pub fn decode_rank_run(bytes: &[u8]) -> Result<RankRun, String> {
    let mut r = Reader { bytes, at: 0 };
    if r.u()? != MAGIC {
        return Err("not a rank record of this hpfsdp build".into());
    }
    let n = r.len(16)?;
    let losses = (0..n)
        .map(|_| Ok((r.n()?, f32::from_bits(r.u()? as u32))))
        .collect::<WireResult<Vec<_>>>()?;
    let n = r.len(16)?;
    let history: Vec<StepShards> = (0..n)
        .map(|_| {
            Ok(StepShards {
                grads: r.nested()?,
                params: r.nested()?,
            })
        })
        .collect::<WireResult<_>>()?;
    let n = r.len(8)?;
    let muon = (0..n)
        .map(|_| get_muon(&mut r))
        .collect::<WireResult<_>>()?;
    let s: Vec<u64> = (0..7).map(|_| r.u()).collect::<WireResult<_>>()?;
    let stats = DispatchStats {
        ops: s[0],
        transitions: s[1],
        rule_lookups: s[2],
        rule_cache_hits: s[3],
        output_checks: s[4],
        contract_checks: s[5],
        validation_host_ns: s[6],
    };
    let f: Vec<u64> = (0..5).map(|_| r.u()).collect::<WireResult<_>>()?;
    let fsdp = FsdpCounts {
        all_gathers: f[0],
        reduce_scatters: f[1],
        all_reduces: f[2],
        copy_unshards: f[3],
        view_unshards: f[4],
    };
    let step_seconds = f64::from_bits(r.u()?);
    let cached_rules = r.n()?;
    let first_step_calls = r.n()?;
    let n = r.len(8)?;
    let trace = (0..n)
        .map(|_| get_event(&mut r))
        .collect::<WireResult<_>>()?;
    if r.at != bytes.len() {
        return Err(format!(
            "{} trailing bytes after the record",
            bytes.len() - r.at
        ));
    }
    let last = history
        .last()
        .cloned()
        .ok_or("a rank record without any step")?;
    Ok(RankRun {
        result: RankResult {
            losses,
            grads: last.grads,
            params: last.params,
            history,
            muon,
            stats,
            fsdp,
            step_seconds,
            cached_rules,
        },
        trace,
        first_step_calls,
    })
}
