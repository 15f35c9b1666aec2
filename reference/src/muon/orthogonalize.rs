//! The orthogonalization stage shared by every executor: split each matrix into its parts,
//! run Newton-Schulz per part (shape-fused batches or one matrix at a time), multiply
//! in-update shape scales, and restore the parts.

use std::collections::BTreeMap;

use super::adapters::{MatrixSplit, Part, restore_matrix, split_matrix};
use super::error::MuonResult;
use super::newton_schulz::{newton_schulz, newton_schulz_batched};
use super::presets::MuonConfig;
use super::update::{LrScale, scale_in_place};
use crate::tensor::Tensor;

/// Which Newton-Schulz kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsKernel {
    /// One matrix at a time ([`newton_schulz`]).
    PerMatrix,
    /// All parts of one core shape together ([`newton_schulz_batched`]).
    Batched,
}

/// One tensor to orthogonalize: `count` matrices of `rows x cols` (bf16 values in f32).
#[derive(Debug, Clone, Copy)]
pub struct OrthoJob<'a> {
    /// The stacked matrices.
    pub input: &'a [f32],
    /// Number of matrices.
    pub count: usize,
    /// Rows per matrix.
    pub rows: usize,
    /// Columns per matrix.
    pub cols: usize,
    /// How each matrix is split.
    pub split: &'a MatrixSplit,
}

/// The result of [`orthogonalize`].
#[derive(Debug, Clone, PartialEq)]
pub struct OrthoOutput {
    /// One update per job, same layout as its input (bf16 values in f32).
    pub updates: Vec<Vec<f32>>,
    /// Newton-Schulz matrices run (parts count separately).
    pub ns_matrices: usize,
}

/// Orthogonalizes every job; in-update shape factors (HyperParallel, Keller Jordan) are applied
/// per part from the part's own dims.
pub fn orthogonalize(
    cfg: &MuonConfig,
    jobs: &[OrthoJob<'_>],
    kernel: NsKernel,
) -> MuonResult<OrthoOutput> {
    struct Item {
        job: usize,
        matrix: usize,
        part: usize,
        data: Vec<f32>,
    }
    let mut parts_of: Vec<Vec<Part>> = Vec::with_capacity(jobs.len());
    let mut groups: BTreeMap<(usize, usize), Vec<Item>> = BTreeMap::new();
    for (j, job) in jobs.iter().enumerate() {
        let parts = job.split.parts(job.rows, job.cols)?;
        let size = job.rows * job.cols;
        for k in 0..job.count {
            let pieces = split_matrix(&job.input[k * size..(k + 1) * size], job.cols, &parts);
            for (p, data) in pieces.into_iter().enumerate() {
                groups
                    .entry(parts[p].dims(job.cols))
                    .or_default()
                    .push(Item {
                        job: j,
                        matrix: k,
                        part: p,
                        data,
                    });
            }
        }
        parts_of.push(parts);
    }
    let mut results: BTreeMap<(usize, usize, usize), Vec<f32>> = BTreeMap::new();
    let mut ns_matrices = 0;
    for ((r, c), items) in groups {
        ns_matrices += items.len();
        let outs: Vec<Vec<f32>> = match kernel {
            NsKernel::Batched => {
                let stacked: Vec<f32> = items.iter().flat_map(|i| i.data.iter().copied()).collect();
                let out = newton_schulz_batched(&stacked, items.len(), r, c, &cfg.ns)?;
                out.chunks(r * c).map(<[f32]>::to_vec).collect()
            }
            NsKernel::PerMatrix => items
                .iter()
                .map(|i| {
                    let t = Tensor::from_vec(&[r, c], i.data.clone())?;
                    Ok(newton_schulz(&t, &cfg.ns)?.into_vec())
                })
                .collect::<MuonResult<_>>()?,
        };
        for (item, mut out) in items.into_iter().zip(outs) {
            if cfg.scale.in_update() {
                scale_in_place(&mut out, cfg.scale.factor(r, c));
            }
            results.insert((item.job, item.matrix, item.part), out);
        }
    }
    let mut updates = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        let parts = &parts_of[j];
        let mut u = Vec::with_capacity(job.count * job.rows * job.cols);
        for k in 0..job.count {
            let data: Vec<Vec<f32>> = (0..parts.len())
                .map(|p| results.remove(&(j, k, p)).unwrap_or_default())
                .collect();
            u.extend(restore_matrix(&data, job.rows, job.cols, parts));
        }
        updates.push(u);
    }
    Ok(OrthoOutput {
        updates,
        ns_matrices,
    })
}

/// The learning-rate factor pattern of one `rows x cols` matrix: uniform, or one value per
/// element when a split gives its parts different lr-folded factors.
pub fn lr_pattern(
    cfg: &MuonConfig,
    rows: usize,
    cols: usize,
    split: &MatrixSplit,
) -> MuonResult<LrScale> {
    if cfg.scale.in_update() {
        return Ok(LrScale::Uniform(1.0));
    }
    let parts = split.parts(rows, cols)?;
    if let [p] = parts.as_slice() {
        let (r, c) = p.dims(cols);
        return Ok(LrScale::Uniform(cfg.scale.factor(r, c)));
    }
    let mut pattern = vec![1.0f64; rows * cols];
    for p in &parts {
        let (r, c) = p.dims(cols);
        let f = cfg.scale.factor(r, c);
        for &row in &p.rows {
            pattern[row * cols..(row + 1) * cols].fill(f);
        }
    }
    Ok(LrScale::PerElement(pattern))
}

/// The lr factors of the elements at `positions` (flat indices into the global or local
/// tensor), from a per-matrix [`lr_pattern`].
pub fn lr_scale_at(pattern: &LrScale, positions: impl Iterator<Item = usize>) -> LrScale {
    match pattern {
        LrScale::Uniform(s) => LrScale::Uniform(*s),
        LrScale::PerElement(p) => {
            LrScale::PerElement(positions.map(|i| p[i % p.len().max(1)]).collect())
        }
    }
}
