//! Newton-Schulz accuracy per preset against an f64 SVD (nalgebra): the singular-value range
//! of the (bf16-emulated) output, the orthogonality error `max |X Xᵀ − I|` (wide orientation),
//! and the distance to the exact polar factor `U Vᵀ` of the input.

use nalgebra::DMatrix;

use super::error::{MuonError, MuonResult};
use super::newton_schulz::newton_schulz;
use super::presets::{MuonConfig, MuonPreset};
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// Accuracy of Newton-Schulz on one random Gaussian matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct NsAccuracy {
    /// Preset name.
    pub preset: &'static str,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Iterations.
    pub steps: usize,
    /// Smallest singular value of the output.
    pub sigma_min: f64,
    /// Largest singular value of the output.
    pub sigma_max: f64,
    /// `max |X Xᵀ − I|` with `X` oriented wide.
    pub orthogonality_error: f64,
    /// `max |X − U Vᵀ|` against the input's exact polar factor.
    pub polar_error: f64,
}

fn matrix(rows: usize, cols: usize, data: &[f32]) -> DMatrix<f64> {
    DMatrix::from_row_iterator(rows, cols, data.iter().map(|&x| f64::from(x)))
}

/// Runs `cfg`'s Newton-Schulz on a `rows x cols` Gaussian matrix (keyed by `seed`) and
/// measures it against the SVD.
pub fn ns_accuracy(
    cfg: &MuonConfig,
    rows: usize,
    cols: usize,
    seed: u64,
) -> MuonResult<NsAccuracy> {
    if rows == 0 || cols == 0 {
        return Err(MuonError::plan("accuracy needs a non-empty matrix"));
    }
    let g: Vec<f32> = KeyedRng::new(seed, 0x5eed)
        .normal_range(0, (rows * cols) as u64)
        .into_iter()
        .collect();
    let out = newton_schulz(&Tensor::from_vec(&[rows, cols], g.clone())?, &cfg.ns)?;
    let x = matrix(rows, cols, out.as_slice());
    let sv = x.clone().svd(false, false).singular_values;
    let sigma_min = sv.iter().copied().fold(f64::INFINITY, f64::min);
    let sigma_max = sv.iter().copied().fold(0.0, f64::max);
    let wide = if rows > cols {
        x.transpose()
    } else {
        x.clone()
    };
    let gram = &wide * wide.transpose();
    let orthogonality_error = (gram - DMatrix::identity(wide.nrows(), wide.nrows()))
        .iter()
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let svd = matrix(rows, cols, &g).svd(true, true);
    let (u, vt) = match (svd.u, svd.v_t) {
        (Some(u), Some(vt)) => (u, vt),
        _ => return Err(MuonError::plan("SVD did not converge")),
    };
    let polar = u * vt;
    let polar_error = (x - polar).iter().fold(0.0f64, |m, v| m.max(v.abs()));
    Ok(NsAccuracy {
        preset: cfg.preset.name(),
        rows,
        cols,
        steps: cfg.ns.steps(),
        sigma_min,
        sigma_max,
        orthogonality_error,
        polar_error,
    })
}

/// The accuracy table: every named preset (torch in its default mode) on a wide and a tall
/// Gaussian matrix.
pub fn accuracy_table(seed: u64) -> MuonResult<Vec<NsAccuracy>> {
    let mut out = Vec::new();
    for preset in [
        MuonPreset::HyperParallel,
        MuonPreset::KellerJordan,
        MuonPreset::Torch,
        MuonPreset::Moonlight,
    ] {
        let cfg = MuonConfig::preset(preset);
        for (r, c) in [(64, 128), (192, 48)] {
            out.push(ns_accuracy(&cfg, r, c, seed)?);
        }
    }
    Ok(out)
}
