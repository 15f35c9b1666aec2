//! Per-parameter comparison: rebuild whole tensors from every rank's shards (checking that
//! replicas agree bit for bit), and error statistics between two tensors (max absolute error,
//! error relative to the reference's largest magnitude, ULP distance, bitwise equality).

use serde::Serialize;

use super::error::VerifyError;
use super::harness::DistRun;
use super::setup::{VerifySpec, shard_indices};
use crate::model::ParamSet;
use crate::runtime::RankTopo;
use crate::tensor::Tensor;

/// Which per-rank vectors to assemble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Averaged shard gradients.
    Grads,
    /// Updated parameter shards.
    Params,
}

/// Whole tensors rebuilt from shards.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// Whole tensors in plan order.
    pub tensors: ParamSet<f32>,
    /// Parameters whose replicas (ranks holding the same element) disagree.
    pub replica_mismatch: Vec<String>,
}

/// Rebuild every parameter's whole tensor from the ranks of `run` (the last step).
pub fn assemble(spec: &VerifySpec, run: &DistRun, which: Which) -> Result<Assembled, VerifyError> {
    assemble_with(spec, |r| {
        let rank = run.ranks.get(r)?;
        Some(match which {
            Which::Grads => &rank.grads,
            Which::Params => &rank.params,
        })
    })
}

/// Rebuild every parameter's whole tensor from the ranks of `run` after step `step`.
pub fn assemble_step(
    spec: &VerifySpec,
    run: &DistRun,
    step: usize,
    which: Which,
) -> Result<Assembled, VerifyError> {
    assemble_with(spec, |r| {
        let s = run.ranks.get(r)?.history.get(step)?;
        Some(match which {
            Which::Grads => &s.grads,
            Which::Params => &s.params,
        })
    })
}

/// Rebuild every parameter's whole tensor from per-rank FSDP-order shard vectors
/// (`shards(rank)`), checking that replicas agree bit for bit.
pub fn assemble_with<'a>(
    spec: &VerifySpec,
    shards: impl Fn(usize) -> Option<&'a Vec<Vec<f32>>>,
) -> Result<Assembled, VerifyError> {
    let mut tensors = ParamSet::new();
    let mut replica_mismatch = Vec::new();
    let topos: Vec<RankTopo> = (0..spec.world())
        .map(|r| {
            RankTopo::new(r, &spec.scenario.dense_mesh, &spec.scenario.expert_mesh)
                .map_err(|e| VerifyError::Scenario(e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    for (i, p) in spec.fsdp.params.iter().enumerate() {
        let plan_p = spec
            .sharding
            .param(&p.name)
            .ok_or_else(|| VerifyError::Scenario(format!("{} missing from the plan", p.name)))?;
        let shape: Vec<usize> = plan_p.shape.iter().map(|&d| d as usize).collect();
        let numel: usize = shape.iter().product();
        let mut full: Vec<Option<u32>> = vec![None; numel];
        let mut mismatch = false;
        for (r, topo) in topos.iter().enumerate() {
            let idx = shard_indices(spec, i, topo)?;
            let vals = shards(r).and_then(|v| v.get(i)).ok_or_else(|| {
                VerifyError::Scenario(format!("rank {r} returned no shard of {}", p.name))
            })?;
            if vals.len() != idx.len() {
                return Err(VerifyError::Scenario(format!(
                    "rank {r} holds {} elements of {} but its shard has {}",
                    vals.len(),
                    p.name,
                    idx.len()
                )));
            }
            for (&g, &v) in idx.iter().zip(vals) {
                let slot = &mut full[g as usize];
                match slot {
                    None => *slot = Some(v.to_bits()),
                    Some(b) if *b != v.to_bits() => mismatch = true,
                    Some(_) => {}
                }
            }
        }
        if full.iter().any(Option::is_none) {
            return Err(VerifyError::Scenario(format!(
                "no rank holds some elements of {}; the shards do not cover the tensor",
                p.name
            )));
        }
        if mismatch {
            replica_mismatch.push(p.name.clone());
        }
        let data: Vec<f32> = full
            .into_iter()
            .map(|b| f32::from_bits(b.unwrap_or(0)))
            .collect();
        let t = Tensor::from_vec(&shape, data).map_err(|e| VerifyError::Scenario(e.to_string()))?;
        tensors.insert(p.name.clone(), t);
    }
    Ok(Assembled {
        tensors,
        replica_mismatch,
    })
}

/// Error statistics of `actual` against `reference`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Diff {
    /// Largest absolute difference.
    pub max_abs: f64,
    /// `max_abs / max |reference|` (0 when the reference is all zeros and equal).
    pub rel_to_max: f64,
    /// Largest distance in units in the last place (ordered bit patterns).
    pub max_ulp: u64,
    /// Elements whose bits differ.
    pub mismatches: usize,
    /// Every bit equal.
    pub bitwise: bool,
}

/// The f32 bit pattern mapped to a monotone integer line (`-0.0` and `+0.0` both at 0).
pub fn ordered(x: f32) -> i64 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        -i64::from(b & 0x7fff_ffff)
    } else {
        i64::from(b)
    }
}

/// ULP distance between two f32 values.
pub fn ulp_distance(a: f32, b: f32) -> u64 {
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// Compare two same-length slices.
pub fn diff(actual: &[f32], reference: &[f32]) -> Diff {
    let mut d = Diff {
        bitwise: actual.len() == reference.len(),
        ..Diff::default()
    };
    let mut max_ref = 0.0f64;
    for (&a, &r) in actual.iter().zip(reference) {
        max_ref = max_ref.max(f64::from(r).abs());
        if a.to_bits() != r.to_bits() {
            d.bitwise = false;
            d.mismatches += 1;
            d.max_abs = d.max_abs.max((f64::from(a) - f64::from(r)).abs());
            d.max_ulp = d.max_ulp.max(ulp_distance(a, r));
        }
    }
    d.rel_to_max = if max_ref > 0.0 {
        d.max_abs / max_ref
    } else {
        d.max_abs
    };
    d
}

/// Compare two parameter sets name by name.
pub fn diff_sets(actual: &ParamSet<f32>, reference: &ParamSet<f32>) -> Vec<(String, Diff)> {
    reference
        .iter()
        .map(|(n, r)| {
            let d = match actual.get(n) {
                Ok(a) if a.shape() == r.shape() => diff(a.as_slice(), r.as_slice()),
                _ => Diff {
                    max_abs: f64::INFINITY,
                    rel_to_max: f64::INFINITY,
                    max_ulp: u64::MAX,
                    mismatches: r.len(),
                    bitwise: false,
                },
            };
            (n.to_string(), d)
        })
        .collect()
}

/// blake3 over names, shapes and element bits, parameters sorted by name: the golden digest
/// of a parameter set (independent of the order the set was built in).
pub fn digest(set: &ParamSet<f32>) -> String {
    let mut h = blake3::Hasher::new();
    let mut entries: Vec<(&str, &Tensor<f32>)> = set.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    for (n, t) in entries {
        h.update(n.as_bytes());
        h.update(&[0xff]);
        for &d in t.shape() {
            h.update(&(d as u64).to_le_bytes());
        }
        for x in t.as_slice() {
            h.update(&x.to_bits().to_le_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_and_diffs() {
        assert_eq!(ulp_distance(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulp_distance(-0.0, 0.0), 0);
        assert_eq!(ulp_distance(f32::from_bits(1), -f32::from_bits(1)), 2);
        let d = diff(&[1.0, 2.0, 3.0], &[1.0, 2.5, 3.0]);
        assert!(!d.bitwise);
        assert_eq!(d.mismatches, 1);
        assert_eq!(d.max_abs, 0.5);
        assert!((d.rel_to_max - 0.5 / 3.0).abs() < 1e-12);
        assert!(diff(&[0.5], &[0.5]).bitwise);
    }
}
