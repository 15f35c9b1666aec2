//! Distributed Muon inside the verification step (`[optimizer] kind = "muon+adamw"`): the
//! scenario's Muon plan over exactly the shards the reference runtime holds, each rank's
//! optimizer (the deduplicated engine with AdamW chained first, plus naive distributed Muon on
//! its own copy of the parameters fed the same real gradients), and the single-device
//! optimizer the sharded runs are compared with.

use hpfsdp_backends::Collective;

use super::muon_spec::MuonVerify;
use crate::model::ParamSet;
use crate::muon::{
    AdamwPart, ChainedOptimizer, DistributedMuon, MuonError, MuonResult, NaiveDistributedMuon,
    StepReport,
};
use crate::runtime::RuntimeError;

/// What one rank's optimizer did in one step.
#[derive(Debug, Clone, Default)]
pub struct MuonStepRecord {
    /// The deduplicated engine's counters.
    pub dedup: StepReport,
    /// Naive distributed Muon's counters (when it ran).
    pub naive: Option<StepReport>,
    /// Parameters whose updated local piece differs in any bit between the two.
    pub naive_mismatch: Vec<String>,
    /// Positions in this rank's communication trace of the deduplicated engine's calls in
    /// this step (AdamW chained first issues none; naive Muon's calls come after).
    pub dedup_calls: std::ops::Range<usize>,
}

struct NaiveSide {
    adamw: AdamwPart,
    muon: NaiveDistributedMuon,
    params: ParamSet<f32>,
}

/// One rank's optimizer in a Muon verification run.
pub struct MuonRank<'a> {
    mv: &'a MuonVerify,
    rank: usize,
    dedup: ChainedOptimizer,
    naive: Option<NaiveSide>,
}

impl<'a> MuonRank<'a> {
    /// The optimizer of `rank`, starting from its FSDP-order master shards `initial`; with
    /// `naive`, naive distributed Muon runs beside on its own copy of the parameters.
    pub fn new(
        mv: &'a MuonVerify,
        rank: usize,
        initial: &[Vec<f32>],
        naive: bool,
    ) -> MuonResult<MuonRank<'a>> {
        let s = &mv.setup;
        let dedup = ChainedOptimizer {
            adamw: AdamwPart::new(s.adamw, &s.routed),
            muon: DistributedMuon::new(
                s.cfg.clone(),
                s.plan.clone(),
                s.domains.clone(),
                s.routed.clone(),
                rank,
            )?,
        };
        let naive = if naive {
            Some(NaiveSide {
                adamw: AdamwPart::new(s.adamw, &s.routed),
                muon: NaiveDistributedMuon::new(
                    s.cfg.clone(),
                    s.plan.clone(),
                    s.domains.clone(),
                    s.routed.clone(),
                    rank,
                )?,
                params: mv.to_set(rank, initial)?,
            })
        } else {
            None
        };
        Ok(MuonRank {
            mv,
            rank,
            dedup,
            naive,
        })
    }

    /// One optimizer step on this rank's master shards with its reduced shard gradients
    /// (FSDP order): AdamW then deduplicated Muon update `shards`; naive Muon (if any) takes
    /// the same gradients on its own copy, and the two are compared bit for bit.
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        shards: &mut [Vec<f32>],
        grads: &[Vec<f32>],
    ) -> MuonResult<MuonStepRecord> {
        let g = self.mv.to_set(self.rank, grads)?;
        let mut p = self.mv.to_set(self.rank, shards)?;
        let start = comm.trace().len();
        let dedup = self.dedup.step(comm, &mut p, &g)?;
        let mut rec = MuonStepRecord {
            dedup,
            dedup_calls: start..comm.trace().len(),
            ..MuonStepRecord::default()
        };
        if let Some(n) = &mut self.naive {
            n.adamw.step(&mut n.params, &g)?;
            rec.naive = Some(n.muon.step(comm, &mut n.params, &g)?);
            for (name, t) in p.iter() {
                if !n.params.get(name)?.bit_eq(t) {
                    rec.naive_mismatch.push(name.to_string());
                }
            }
        }
        self.mv.write_back(&p, shards)?;
        Ok(rec)
    }
}

/// A Muon error inside a rank, as the runtime reports it (communication failures keep their
/// kind, so a peer's exit is told apart from the rank's own error).
pub fn runtime_error(e: MuonError) -> RuntimeError {
    match e {
        MuonError::Comm(c) => RuntimeError::Comm(c),
        MuonError::Tensor(t) => RuntimeError::Kernel(t),
        other => RuntimeError::plan(format!("distributed Muon: {other}")),
    }
}
