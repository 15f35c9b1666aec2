//! A small bounded Levenberg-Marquardt least-squares solver with forward finite differences,
//! generic over the residual function. Used by the joint calibration fit in log-parameter
//! space, where each residual evaluation re-simulates the measured runs.
//!
//! Bounds are handled by projection with an active set: a variable sitting on a bound whose
//! gradient pushes it outward is held for that iteration, the others take a damped
//! Gauss-Newton step (`(JᵀJ + μ diag(JᵀJ)) δ = -Jᵀr`) clipped into the box. A variable no
//! residual depends on (a zero Jacobian column) is never moved and is reported as
//! unidentified. The Jacobian's columns are evaluated in parallel. Everything is
//! deterministic: same inputs, same iterates.

use rayon::prelude::*;

/// Settings of [`minimise`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmOptions {
    /// Outer iterations (Jacobian evaluations) at most.
    pub max_iterations: usize,
    /// Forward-difference step in the variables' units (log units in the calibration fit).
    pub fd_step: f64,
    /// Stop when an accepted step lowers the cost by less than this fraction of it.
    pub relative_tolerance: f64,
}

impl Default for LmOptions {
    fn default() -> Self {
        Self {
            max_iterations: 30,
            fd_step: 0.01,
            relative_tolerance: 1e-4,
        }
    }
}

/// What [`minimise`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct LmOutcome {
    /// The variables at the minimum found.
    pub x: Vec<f64>,
    /// Residuals there.
    pub residuals: Vec<f64>,
    /// Half the sum of squared residuals at the start.
    pub cost_start: f64,
    /// Half the sum of squared residuals at the end.
    pub cost: f64,
    /// Outer iterations run.
    pub iterations: usize,
    /// Residual evaluations.
    pub evaluations: usize,
    /// Per variable: no residual depended on it at the last Jacobian (never moved).
    pub unidentified: Vec<bool>,
}

fn cost_of(r: &[f64]) -> f64 {
    0.5 * r.iter().map(|v| v * v).sum::<f64>()
}

/// Solves the square system `a x = b` by Gaussian elimination with partial pivoting; `None`
/// when it is singular.
pub(crate) fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (top, bottom) = a.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for (offset, row) in bottom.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[col + 1 + offset] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
}

/// Forward-difference Jacobian (`m x n`, row per residual) at `x`, stepping inward at an
/// upper bound. The columns are evaluated in parallel (each is one evaluation of `f`, in a
/// calibration one simulation of every selected run); the result does not depend on the
/// order they finish in.
pub(crate) fn jacobian<E: Send>(
    x: &[f64],
    r: &[f64],
    hi: &[f64],
    step: f64,
    f: &(impl Fn(&[f64]) -> Result<Vec<f64>, E> + Sync),
) -> Result<Vec<Vec<f64>>, E> {
    let columns: Vec<Vec<f64>> = (0..x.len())
        .into_par_iter()
        .map(|j| {
            let h = if x[j] + step > hi[j] { -step } else { step };
            let mut xp = x.to_vec();
            xp[j] += h;
            let rp = f(&xp)?;
            Ok(r.iter()
                .enumerate()
                .map(|(i, ri)| (rp[i] - ri) / h)
                .collect())
        })
        .collect::<Result<_, E>>()?;
    Ok((0..r.len())
        .map(|i| columns.iter().map(|c| c[i]).collect())
        .collect())
}

/// Minimises `0.5 |f(x)|²` over the box `[lo, hi]` from `x0` (clipped into the box).
/// Errors of `f` end the fit and are returned as they are.
pub fn minimise<E: Send>(
    x0: &[f64],
    lo: &[f64],
    hi: &[f64],
    options: &LmOptions,
    f: impl Fn(&[f64]) -> Result<Vec<f64>, E> + Sync,
) -> Result<LmOutcome, E> {
    let n = x0.len();
    let mut x: Vec<f64> = (0..n).map(|j| x0[j].clamp(lo[j], hi[j])).collect();
    let mut r = f(&x)?;
    let mut evaluations = 1;
    let cost_start = cost_of(&r);
    let mut cost = cost_start;
    let mut mu = 1e-3;
    let mut iterations = 0;
    let mut unidentified = vec![false; n];
    while iterations < options.max_iterations && cost > 0.0 {
        iterations += 1;
        let jac = jacobian(&x, &r, hi, options.fd_step, &f)?;
        evaluations += n;
        let g: Vec<f64> = (0..n)
            .map(|j| jac.iter().zip(&r).map(|(row, ri)| row[j] * ri).sum())
            .collect();
        let a: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| jac.iter().map(|row| row[i] * row[j]).sum())
                    .collect()
            })
            .collect();
        let free: Vec<usize> = (0..n)
            .filter(|&j| {
                unidentified[j] = a[j][j] <= 1e-18;
                let at_lo = x[j] - lo[j] <= 1e-12 && g[j] > 0.0;
                let at_hi = hi[j] - x[j] <= 1e-12 && g[j] < 0.0;
                !unidentified[j] && !at_lo && !at_hi
            })
            .collect();
        if free.is_empty() {
            break;
        }
        let mut accepted = None;
        for _ in 0..12 {
            let sys: Vec<Vec<f64>> = free
                .iter()
                .map(|&i| {
                    free.iter()
                        .map(|&j| a[i][j] + if i == j { mu * a[i][i] } else { 0.0 })
                        .collect()
                })
                .collect();
            let rhs: Vec<f64> = free.iter().map(|&j| -g[j]).collect();
            let Some(delta) = solve(sys, rhs) else {
                mu *= 4.0;
                continue;
            };
            let mut trial = x.clone();
            for (k, &j) in free.iter().enumerate() {
                trial[j] = (x[j] + delta[k]).clamp(lo[j], hi[j]);
            }
            let rt = f(&trial)?;
            evaluations += 1;
            let ct = cost_of(&rt);
            if ct < cost {
                mu = (mu / 3.0).max(1e-9);
                accepted = Some((trial, rt, ct));
                break;
            }
            mu *= 4.0;
        }
        let Some((trial, rt, ct)) = accepted else {
            break;
        };
        let gain = (cost - ct) / cost;
        x = trial;
        r = rt;
        cost = ct;
        if gain < options.relative_tolerance {
            break;
        }
    }
    Ok(LmOutcome {
        x,
        residuals: r,
        cost_start,
        cost,
        iterations,
        evaluations,
        unidentified,
    })
}

/// [`minimise`] from each of `starts` in turn, keeping the lowest final cost (the earliest
/// start on a tie). The residual functions of a calibration are not convex (a constant can
/// buy one experiment's missing time at another's expense), so one start can stop in a local
/// minimum; a fixed list of starts keeps the result deterministic. `cost_start` is the first
/// start's; iterations and evaluations add up over all starts.
pub fn minimise_multistart<E: Send>(
    starts: &[Vec<f64>],
    lo: &[f64],
    hi: &[f64],
    options: &LmOptions,
    f: impl Fn(&[f64]) -> Result<Vec<f64>, E> + Sync,
) -> Result<LmOutcome, E> {
    let mut best: Option<LmOutcome> = None;
    let (mut iterations, mut evaluations, mut cost_start) = (0, 0, None);
    for x0 in starts {
        let out = minimise(x0, lo, hi, options, &f)?;
        iterations += out.iterations;
        evaluations += out.evaluations;
        cost_start.get_or_insert(out.cost_start);
        if best.as_ref().is_none_or(|b| out.cost < b.cost) {
            best = Some(out);
        }
    }
    let mut best = best.unwrap_or(LmOutcome {
        x: Vec::new(),
        residuals: Vec::new(),
        cost_start: 0.0,
        cost: 0.0,
        iterations: 0,
        evaluations: 0,
        unidentified: Vec::new(),
    });
    best.cost_start = cost_start.unwrap_or(best.cost_start);
    best.iterations = iterations;
    best.evaluations = evaluations;
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp_model(x: &[f64]) -> Result<Vec<f64>, ()> {
        // y = a * exp(b t) sampled at t = 0..5 from a = 2, b = -0.5.
        Ok((0..6)
            .map(|t| {
                let t = t as f64;
                x[0] * (x[1] * t).exp() - 2.0 * (-0.5 * t).exp()
            })
            .collect())
    }

    #[test]
    fn recovers_the_parameters_of_an_exact_model() {
        let out = minimise(
            &[1.0, 0.0],
            &[0.1, -3.0],
            &[10.0, 3.0],
            &LmOptions::default(),
            exp_model,
        )
        .unwrap();
        assert!((out.x[0] - 2.0).abs() < 1e-3, "{:?}", out.x);
        assert!((out.x[1] + 0.5).abs() < 1e-3, "{:?}", out.x);
        assert!(out.cost < 1e-8 && out.cost < out.cost_start);
    }

    #[test]
    fn stops_at_a_bound_the_data_pushes_against() {
        // The unconstrained optimum a = 2 lies above the upper bound 1.5.
        let out = minimise(
            &[1.0, -0.5],
            &[0.1, -3.0],
            &[1.5, 3.0],
            &LmOptions::default(),
            exp_model,
        )
        .unwrap();
        assert_eq!(out.x[0], 1.5);
        assert!(out.cost > 0.0);
    }

    #[test]
    fn a_variable_nothing_depends_on_is_reported_and_kept() {
        let out = minimise(
            &[0.0, 0.7],
            &[-5.0, 0.0],
            &[5.0, 1.0],
            &LmOptions::default(),
            |x: &[f64]| Ok::<_, ()>(vec![x[0] - 1.0, 2.0 * (x[0] - 1.0)]),
        )
        .unwrap();
        assert!((out.x[0] - 1.0).abs() < 1e-6);
        assert_eq!(out.x[1], 0.7);
        assert!(out.unidentified[1] && !out.unidentified[0]);
    }

    #[test]
    fn a_second_start_escapes_a_local_minimum() {
        // r1 = (x - 1)(x - 4), r2 = 0.1 (x - 4): a local minimum near x = 1 (cost ~0.045)
        // and the global one at x = 4 (cost 0) in the box [0, 5].
        let f = |x: &[f64]| Ok::<_, ()>(vec![(x[0] - 1.0) * (x[0] - 4.0), 0.1 * (x[0] - 4.0)]);
        let options = LmOptions::default();
        let (lo, hi) = ([0.0], [5.0]);
        let one = minimise(&[0.0], &lo, &hi, &options, f).unwrap();
        assert!(one.cost > 0.01 && one.x[0] < 2.0, "{one:?}");
        let both = minimise_multistart(&[vec![0.0], vec![2.5]], &lo, &hi, &options, f).unwrap();
        assert!(
            both.cost < 1e-8 && (both.x[0] - 4.0).abs() < 1e-3,
            "{both:?}"
        );
        // The first start's cost is reported as the start; the work of both starts counts.
        assert_eq!(both.cost_start, one.cost_start);
        assert!(both.evaluations > one.evaluations);
        // Same starts, same answer.
        let again = minimise_multistart(&[vec![0.0], vec![2.5]], &lo, &hi, &options, f).unwrap();
        assert_eq!(again.x, both.x);
    }
}
