//! `hpfsdp sweep --under-mpi`: the points of a sweep spread over the ranks of an `mpirun` job,
//! so a large sweep uses many machines. Point `i` is simulated by rank `i mod world`; every
//! rank's rows travel to every rank as JSON bytes (one all-gather of their lengths, one of the
//! padded bytes) and rank 0 writes the same `sweep.csv` / `sweep.html` a single-process sweep
//! writes (rows back in point order, each point's strategies in their order).

use anyhow::Result;
use hpfsdp_reports::sweep::SweepRow;

/// This process's share of the points (`rank`, `world`) when launched under `mpirun`, and the
/// gather that brings the rows back.
#[cfg(feature = "mpi")]
pub struct MpiSpread {
    comm: hpfsdp_backends::mpi::MpiComm,
}

#[cfg(feature = "mpi")]
impl MpiSpread {
    /// Joins the `mpirun` job (MPI's world communicator, deterministic mode).
    pub fn join() -> Result<Self> {
        use anyhow::Context;
        let comm = hpfsdp_backends::mpi::MpiComm::world()
            .context("--under-mpi: starting MPI (launch with `mpirun -np N hpfsdp sweep ...`)")?;
        Ok(Self { comm })
    }

    /// This rank's index in the job.
    pub fn rank(&self) -> usize {
        use hpfsdp_backends::Collective;
        self.comm.rank()
    }

    /// Whether point `index` is simulated by this rank.
    pub fn owns(&self, index: usize) -> bool {
        use hpfsdp_backends::Collective;
        index % self.comm.world_size() == self.comm.rank()
    }

    /// Every rank's rows, in point order (stable: a point's rows keep their strategy order).
    pub fn gather(&self, mine: &[SweepRow]) -> Result<Vec<SweepRow>> {
        use anyhow::Context;
        use hpfsdp_backends::{Collective, CollectiveExt, Group};
        let world = Group::world(self.comm.world_size())?;
        let wire: Vec<WireRow> = mine.iter().map(WireRow::from).collect();
        let bytes = serde_json::to_vec(&wire).context("encoding this rank's sweep rows")?;
        let lens = self
            .comm
            .all_gather_vec::<u8>(&world, (bytes.len() as u64).to_le_bytes().to_vec())?;
        let lens: Vec<usize> = lens
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
            .collect();
        let max = lens.iter().copied().max().unwrap_or(0);
        let mut padded = bytes;
        padded.resize(max, 0);
        let all = self.comm.all_gather_vec::<u8>(&world, padded)?;
        let mut rows = Vec::new();
        for (rank, len) in lens.iter().enumerate() {
            let chunk = &all[rank * max..rank * max + len];
            let part: Vec<WireRow> = serde_json::from_slice(chunk)
                .with_context(|| format!("decoding the sweep rows of rank {rank}"))?;
            rows.extend(part.into_iter().map(SweepRow::from));
        }
        rows.sort_by_key(|r| r.point);
        Ok(rows)
    }
}

/// A [`SweepRow`] as it travels between ranks: floats as their IEEE bits, so rank 0 writes
/// exactly the bytes a one-process sweep writes (JSON's decimal floats need not round-trip).
#[cfg(feature = "mpi")]
#[derive(serde::Serialize, serde::Deserialize)]
struct WireRow {
    point: usize,
    values: Vec<String>,
    strategy: String,
    status: String,
    step_time_bits: Option<u64>,
    tokens_per_s_bits: Option<u64>,
    peak_memory_bytes: Option<u64>,
    hbm_capacity_bytes: Option<u64>,
    hardware: Option<String>,
    pareto: bool,
    best: bool,
    message: String,
}

#[cfg(feature = "mpi")]
impl From<&SweepRow> for WireRow {
    fn from(r: &SweepRow) -> Self {
        Self {
            point: r.point,
            values: r.values.clone(),
            strategy: r.strategy.clone(),
            status: r.status.clone(),
            step_time_bits: r.step_time_s.map(f64::to_bits),
            tokens_per_s_bits: r.tokens_per_s.map(f64::to_bits),
            peak_memory_bytes: r.peak_memory_bytes,
            hbm_capacity_bytes: r.hbm_capacity_bytes,
            hardware: r.hardware.clone(),
            pareto: r.pareto,
            best: r.best,
            message: r.message.clone(),
        }
    }
}

#[cfg(feature = "mpi")]
impl From<WireRow> for SweepRow {
    fn from(w: WireRow) -> Self {
        Self {
            point: w.point,
            values: w.values,
            strategy: w.strategy,
            status: w.status,
            step_time_s: w.step_time_bits.map(f64::from_bits),
            tokens_per_s: w.tokens_per_s_bits.map(f64::from_bits),
            peak_memory_bytes: w.peak_memory_bytes,
            hbm_capacity_bytes: w.hbm_capacity_bytes,
            hardware: w.hardware,
            pareto: w.pareto,
            best: w.best,
            message: w.message,
        }
    }
}

/// Without MPI compiled in, `--under-mpi` is refused with the rebuild command.
#[cfg(not(feature = "mpi"))]
pub struct MpiSpread;

#[cfg(not(feature = "mpi"))]
impl MpiSpread {
    /// Always an error: this binary has no MPI.
    pub fn join() -> Result<Self> {
        anyhow::bail!(
            "--under-mpi: this hpfsdp was built without MPI support; rebuild with \
             `cargo build --release --features mpi` (needs an MPI library, mpicc and libclang) and \
             launch with `mpirun -np N target/release/hpfsdp sweep ... --under-mpi`"
        )
    }
    /// Unreachable without MPI (`join` fails).
    pub fn rank(&self) -> usize {
        0
    }
    /// Unreachable without MPI (`join` fails).
    pub fn owns(&self, _index: usize) -> bool {
        true
    }
    /// Unreachable without MPI (`join` fails).
    pub fn gather(&self, mine: &[SweepRow]) -> Result<Vec<SweepRow>> {
        Ok(mine.to_vec())
    }
}
