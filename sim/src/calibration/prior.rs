//! Priors of the fitted constants and what the data add to them.
//!
//! Every constant of the joint fit (a runs file's `[[fit]]` entry, [`super::params::FitParam`])
//! carries a [`Prior`]: a centre and a width on the log scale, each from a PUBLIC source or
//! first principles (never from the held-in measurements, which are the data), with its
//! source text. The fit is then
//! a maximum a posteriori fit: the least squares gets one extra residual per constant,
//! `(ln v - ln centre) / log_width` ([`super::params::prior_residuals`]), so a constant the figures pin is
//! set by the figures and one they do not pin stays at its prior instead of wandering to
//! wherever an underdetermined fit leaves it (leave-one-out without experiment B used to fit
//! eight constants to three figures at cost 0.0000).
//!
//! [`data_shares`] says, per constant, how much of the prior's variance the data removed
//! (Laplace approximation of the posterior at the fitted point): near 1 the data identify
//! the constant, near 0 it is its prior.

use super::lm::solve;

/// A constant's prior: log-normal around `centre` with standard deviation `log_width` of
/// `ln(value)`, and where both come from.
#[derive(Debug, Clone, PartialEq)]
pub struct Prior {
    /// The prior's median, in the constant's own unit (> 0).
    pub centre: f64,
    /// One standard deviation of `ln(value)`: one sigma is a factor `e^log_width` either
    /// side of the centre (> 0).
    pub log_width: f64,
    /// The public source (address, hardware, versions) and the arithmetic, or ASSUMPTION
    /// with its first-principles argument.
    pub source: String,
}

impl Prior {
    /// The prior residual of log value `z`: `(z - ln centre) / log_width`, in sigmas.
    pub fn residual(&self, z: f64) -> f64 {
        (z - self.centre.ln()) / self.log_width
    }
}

/// A constant counts as identified by the data when they removed at least this fraction of
/// its prior variance ([`data_shares`]); below it the prior dominates.
pub const IDENTIFIED_DATA_SHARE: f64 = 0.5;

/// Per constant, the fraction of its prior variance the data remove: with `jac_data` the
/// Jacobian of the data residuals in log parameters (row per residual) and `widths` the
/// prior log widths, the posterior precision is `H = JᵀJ + diag(1 / width²)` and the share
/// is `1 - (H⁻¹)ⱼⱼ / widthⱼ²`, in [0, 1]. It counts correlations: two constants that only
/// their product is pinned get a share each well below one. NaN when `H` is singular
/// (cannot happen with positive widths).
pub fn data_shares(jac_data: &[Vec<f64>], widths: &[f64]) -> Vec<f64> {
    let n = widths.len();
    let h: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let d: f64 = jac_data.iter().map(|row| row[i] * row[j]).sum();
                    d + if i == j {
                        1.0 / (widths[i] * widths[i])
                    } else {
                        0.0
                    }
                })
                .collect()
        })
        .collect();
    (0..n)
        .map(|j| {
            let mut e = vec![0.0; n];
            e[j] = 1.0;
            match solve(h.clone(), e) {
                Some(col) => (1.0 - col[j] / (widths[j] * widths[j])).clamp(0.0, 1.0),
                None => f64::NAN,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_residual_counts_sigmas_on_the_log_scale() {
        let p = Prior {
            centre: 10.0,
            log_width: 2f64.ln(),
            source: "test".into(),
        };
        assert!(p.residual(10f64.ln()).abs() < 1e-12);
        assert!((p.residual(20f64.ln()) - 1.0).abs() < 1e-12);
        assert!((p.residual(2.5f64.ln()) + 2.0).abs() < 1e-12);
    }

    /// No data: nothing is removed; data much sharper than the prior: almost everything; a
    /// product pinned but not its factors: neither factor is identified alone.
    #[test]
    fn data_shares_follow_the_posterior_variance() {
        let w = [1.0, 1.0];
        assert_eq!(data_shares(&[vec![0.0, 0.0]], &w), vec![0.0, 0.0]);
        let sharp = data_shares(&[vec![100.0, 0.0], vec![0.0, 0.01]], &w);
        assert!(sharp[0] > 0.999 && sharp[1] < 1e-3, "{sharp:?}");
        // Only x0 + x1 (a product of the constants) is measured, very precisely.
        let product = data_shares(&[vec![100.0, 100.0]], &w);
        assert!(
            product.iter().all(|s| (s - 0.5).abs() < 1e-3),
            "{product:?}"
        );
    }
}
