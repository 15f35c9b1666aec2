//! Gathering every rank's measured spans on rank 0 through the backend itself (so it works
//! the same on threads and on MPI processes).
//!
//! Backends move f32 and bf16 only, so each `u64` travels as four f32 values holding 16 bits
//! each (exact: every value is below 2^16). Lengths are exchanged first, then every rank's
//! record padded to the longest is all-gathered.

use hpfsdp_program::step::{OpId, OpSpan};

use crate::buffer::Buffer;
use crate::collective::Collective;
use crate::error::{CommError, CommResult};
use crate::group::Group;

/// One rank's measured steps: one span per op per step, in op-id order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankMeasurement {
    /// The rank.
    pub rank: usize,
    /// Spans of each measured step (warm-up steps excluded).
    pub steps: Vec<Vec<OpSpan>>,
}

/// Marks an absent `launched_ns`.
const NONE: u64 = u64::MAX;

fn encode(m: &RankMeasurement) -> Vec<u64> {
    let mut out = vec![m.rank as u64, m.steps.len() as u64];
    for spans in &m.steps {
        out.push(spans.len() as u64);
        for s in spans {
            out.extend([
                u64::from(s.op.0),
                s.start_ns,
                s.end_ns,
                s.launched_ns.unwrap_or(NONE),
            ]);
        }
    }
    out
}

fn decode(words: &[u64]) -> Option<RankMeasurement> {
    let mut it = words.iter().copied();
    let rank = it.next()? as usize;
    let steps = it.next()? as usize;
    let mut out = Vec::with_capacity(steps);
    for _ in 0..steps {
        let n = it.next()? as usize;
        let mut spans = Vec::with_capacity(n);
        for _ in 0..n {
            let op = OpId(u32::try_from(it.next()?).ok()?);
            let start_ns = it.next()?;
            let end_ns = it.next()?;
            let launched = it.next()?;
            spans.push(OpSpan {
                op,
                start_ns,
                end_ns,
                launched_ns: (launched != NONE).then_some(launched),
                transfer_start_ns: None,
            });
        }
        out.push(spans);
    }
    Some(RankMeasurement { rank, steps: out })
}

fn to_f32(words: &[u64]) -> Vec<f32> {
    words
        .iter()
        .flat_map(|w| (0..4).map(move |k| ((w >> (16 * k)) & 0xffff) as f32))
        .collect()
}

fn from_f32(values: &[f32]) -> Vec<u64> {
    values
        .chunks_exact(4)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |acc, (k, v)| acc | ((*v as u64) << (16 * k)))
        })
        .collect()
}

/// All-gathers every rank's measurement; rank 0 gets them all (ascending by rank), the
/// others `None`.
pub fn gather_measurements<C: Collective + ?Sized>(
    comm: &C,
    mine: &RankMeasurement,
) -> CommResult<Option<Vec<RankMeasurement>>> {
    let world = Group::world(comm.world_size())?;
    let words = encode(mine);
    let lens = comm
        .all_gather(&world, Buffer::F32(to_f32(&[words.len() as u64])))?
        .wait_vec::<f32>()?;
    let longest = from_f32(&lens).into_iter().max().unwrap_or(0) as usize;
    let mut padded = words;
    padded.resize(longest, 0);
    let all = comm
        .all_gather(&world, Buffer::F32(to_f32(&padded)))?
        .wait_vec::<f32>()?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    let per_rank = longest * 4;
    let mut out = Vec::with_capacity(comm.world_size());
    for (r, chunk) in all
        .chunks(per_rank.max(1))
        .enumerate()
        .take(comm.world_size())
    {
        let m = decode(&from_f32(chunk)).ok_or_else(|| CommError::InvalidArgument {
            kind: crate::types::CollectiveKind::AllGather,
            reason: format!("rank {r}'s measurement record is malformed"),
        })?;
        out.push(m);
    }
    out.sort_by_key(|m| m.rank);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_f32() {
        let m = RankMeasurement {
            rank: 3,
            steps: vec![vec![OpSpan {
                op: OpId(7),
                start_ns: 123_456_789_012,
                end_ns: u64::MAX - 5,
                launched_ns: None,
                transfer_start_ns: None,
            }]],
        };
        let words = encode(&m);
        assert_eq!(from_f32(&to_f32(&words)), words);
        assert_eq!(decode(&words), Some(m));
    }
}
