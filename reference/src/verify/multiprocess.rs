//! Verification over a communicator whose ranks may be separate processes (one `mpirun` job):
//! every rank runs its part of the production and validation executions, sends its shards,
//! losses, counters and trace to rank 0 ([`super::wire`]), and rank 0 runs the single device
//! and builds the same [`VerifyReport`] as the in-process harness.

use hpfsdp_backends::{Buffer, Collective, CommError, DType};

use super::error::VerifyError;
use super::harness::{DistRun, run_rank};
use super::report::{VerifyReport, verify_runs};
use super::setup::VerifySpec;
use super::wire::{decode_rank_run, encode_rank_run};
use crate::runtime::{ExecMode, RuntimeError};

/// Tag of the messages that carry rank records to rank 0 ("verify").
const GATHER_TAG: u64 = 0x7665_7269_6679;

/// Send every rank's bytes to rank 0: rank 0 gets them all (indexed by rank), others `None`.
fn gather_to_root(comm: &dyn Collective, mine: Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, CommError> {
    if comm.rank() != 0 {
        let len = (mine.len() as u64).to_le_bytes().to_vec();
        comm.send(Buffer::U8(len), 0, GATHER_TAG)?.wait()?;
        comm.send(Buffer::U8(mine), 0, GATHER_TAG)?.wait()?;
        return Ok(None);
    }
    let mut all = vec![mine];
    for src in 1..comm.world_size() {
        let len: Vec<u8> = comm.recv(src, GATHER_TAG, DType::U8, 8)?.wait_vec()?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&len);
        let n = u64::from_le_bytes(word) as usize;
        all.push(comm.recv(src, GATHER_TAG, DType::U8, n)?.wait_vec()?);
    }
    Ok(Some(all))
}

/// Check that the communicator has exactly the scenario's ranks.
pub fn check_world(spec: &VerifySpec, comm: &dyn Collective) -> Result<(), VerifyError> {
    if comm.world_size() == spec.world() {
        return Ok(());
    }
    Err(VerifyError::unsupported(
        format!(
            "scenario {} has {} ranks but the {} world has {} processes",
            spec.scenario.file.name,
            spec.world(),
            comm.backend_name(),
            comm.world_size()
        ),
        format!(
            "launch exactly {} processes (mpirun -np {})",
            spec.world(),
            spec.world()
        ),
    ))
}

/// This rank's part of the execution in `mode`; rank 0 gets every rank's run.
pub fn run_distributed_on(
    spec: &VerifySpec,
    mode: ExecMode,
    comm: &dyn Collective,
) -> Result<Option<DistRun>, VerifyError> {
    let run_err = |source: RuntimeError| VerifyError::Run {
        mode: mode.name().to_string(),
        source: Box::new(source),
    };
    check_world(spec, comm)?;
    let run = run_rank(spec, mode, comm).map_err(run_err)?;
    let Some(all) = gather_to_root(comm, encode_rank_run(&run)).map_err(|e| run_err(e.into()))?
    else {
        return Ok(None);
    };
    let runs = all
        .iter()
        .enumerate()
        .map(|(r, bytes)| {
            decode_rank_run(bytes).map_err(|why| {
                run_err(RuntimeError::plan(format!(
                    "the record rank {r} sent is unreadable: {why}"
                )))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(DistRun::from_rank_runs(mode, runs)))
}

/// The verification of `spec` with this process as one rank of `comm`: production and
/// validation runs on every rank, then on rank 0 the single device and the report (`None` on
/// the other ranks).
pub fn verify_on(
    spec: &VerifySpec,
    comm: &dyn Collective,
) -> Result<Option<VerifyReport>, VerifyError> {
    let prod = run_distributed_on(spec, ExecMode::Production, comm)?;
    let val = run_distributed_on(spec, ExecMode::Validation, comm)?;
    match (prod, val) {
        (Some(p), Some(v)) => verify_runs(spec, &p, &v).map(Some),
        _ => Ok(None),
    }
}
