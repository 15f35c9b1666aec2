//! The Muon part of a verification verdict: the deduplication figures of the run (Newton-Schulz
//! matrices and momentum bytes per rank, deduplicated engine versus naive distributed Muon,
//! against the plan's prediction) and the Muon checks (deduplicated == naive bitwise, the
//! sharded optimizer == single-device Muon on the run's own gradients bitwise, replicas and
//! replica subgroups identical after every step).

use serde::Serialize;

use super::check::Check;
use super::compare::{Which, assemble_step, diff};
use super::error::VerifyError;
use super::harness::{DistRun, SingleRun};
use super::muon_spec::{MuonVerify, Route};
use super::setup::VerifySpec;
use crate::model::ParamSet;

pub use super::bounds::MUON_STEP_BOUND;

/// The per-step bound on `|p_tp − p_1|` of FSDP-plan parameter `i`: AdamW moves an element by
/// at most `lr` per step, so `PARAM_ABS_BOUND_LR · lr`; Muon [`MUON_STEP_BOUND`]` · lr · s`.
pub fn param_step_bound(spec: &VerifySpec, i: usize) -> f64 {
    match spec.muon.as_ref() {
        Some(m) if m.route(i) != Route::Adamw => {
            MUON_STEP_BOUND * m.setup.cfg.lr * m.update_scale(i)
        }
        _ => super::bounds::PARAM_ABS_BOUND_LR * spec.adamw.lr,
    }
}

/// One rank's measured Muon load (the first step; every step is checked to repeat it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MuonRankLoad {
    /// Rank.
    pub rank: usize,
    /// Newton-Schulz matrices per step, deduplicated engine.
    pub ns_dedup: usize,
    /// Newton-Schulz matrices per step, naive distributed Muon.
    pub ns_naive: usize,
    /// Momentum bytes held, deduplicated engine.
    pub momentum_bytes_dedup: u64,
    /// Momentum bytes held, naive distributed Muon.
    pub momentum_bytes_naive: u64,
    /// Bytes received from the engine's fused all-gathers per step.
    pub gather_bytes: u64,
    /// Bytes of relay broadcasts per step.
    pub relay_bytes: u64,
    /// Bytes of replica broadcasts per step.
    pub replica_bytes: u64,
    /// Collective calls of the engine per step.
    pub collectives: usize,
}

/// The Muon figures of a verification.
#[derive(Debug, Clone, Serialize)]
pub struct MuonSummary {
    /// Preset name.
    pub preset: String,
    /// Muon learning rate.
    pub lr: f64,
    /// Newton-Schulz iterations.
    pub ns_steps: usize,
    /// Optimizer steps run.
    pub steps: usize,
    /// Matrices (`muon`), whole local matrices (`local-muon`) and AdamW parameters.
    pub routes: RouteCounts,
    /// Replica subgroup size of replica-domain dedup (`None`: whole replica groups).
    pub replica_count: Option<usize>,
    /// Replica axes of the Muon matrices with their subgroup sizes (`dp_replicate 4/2`).
    pub replica_subgroups: Vec<String>,
    /// Batches of the Muon plan.
    pub batches: usize,
    /// Parameters whose Muon layout is the runtime's strided FSDP-over-TP/EP layout.
    pub realigned_layouts: usize,
    /// Per-rank measured load.
    pub ranks: Vec<MuonRankLoad>,
    /// Newton-Schulz matrices of one single-device step.
    pub ns_single: usize,
    /// Mean loss of each step, production run.
    pub step_losses: Vec<f32>,
    /// Mean loss of each step, single device.
    pub single_step_losses: Vec<f32>,
}

/// Parameters per optimizer route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RouteCounts {
    /// Gathered Muon matrices.
    pub muon: usize,
    /// Muon on whole local matrices.
    pub local_muon: usize,
    /// AdamW.
    pub adamw: usize,
}

impl MuonSummary {
    /// Newton-Schulz matrices per step summed over ranks: (deduplicated, naive).
    pub fn ns_totals(&self) -> (usize, usize) {
        self.ranks
            .iter()
            .fold((0, 0), |(a, b), r| (a + r.ns_dedup, b + r.ns_naive))
    }

    /// Momentum bytes summed over ranks: (deduplicated, naive).
    pub fn momentum_totals(&self) -> (u64, u64) {
        self.ranks.iter().fold((0, 0), |(a, b), r| {
            (a + r.momentum_bytes_dedup, b + r.momentum_bytes_naive)
        })
    }
}

fn route_counts(mv: &MuonVerify) -> RouteCounts {
    let mut c = RouteCounts::default();
    for i in 0..mv.plan_index.len() {
        match mv.route(i) {
            Route::Muon => c.muon += 1,
            Route::LocalMuon => c.local_muon += 1,
            Route::Adamw => c.adamw += 1,
        }
    }
    c
}

fn check(name: &str, passed: bool, detail: String) -> Check {
    Check {
        name: name.into(),
        passed,
        gating: true,
        detail,
    }
}

fn step_losses(spec: &VerifySpec, run: &DistRun) -> Vec<f32> {
    let m = spec.micro_batches();
    let mut all: Vec<(usize, f32)> = run.ranks.iter().flat_map(|r| r.losses.clone()).collect();
    all.sort_by_key(|x| x.0);
    all.dedup_by_key(|x| x.0);
    (0..spec.steps)
        .map(|s| {
            let xs: Vec<f32> = all
                .iter()
                .filter(|(id, _)| id / m.max(1) == s)
                .map(|x| x.1)
                .collect();
            xs.iter().fold(0.0, |a, b| a + b) / xs.len().max(1) as f32
        })
        .collect()
}

/// The Muon figures and checks of a production run `prod` (with naive Muon beside it) and the
/// single-device run.
pub fn muon_part(
    spec: &VerifySpec,
    mv: &MuonVerify,
    prod: &DistRun,
    single: &SingleRun,
) -> Result<(MuonSummary, Vec<Check>), VerifyError> {
    let mut checks = vec![naive_check(spec, prod)];
    let subgroups = replica_subgroups(mv);
    checks.extend(own_gradient_checks(spec, mv, prod, &subgroups)?);
    let (ranks, off) = measured_loads(mv, prod)?;
    let ns_single = single.ns_matrices.first().copied().unwrap_or(0);
    let summary = MuonSummary {
        preset: mv.setup.cfg.preset.name().into(),
        lr: mv.setup.cfg.lr,
        ns_steps: mv.setup.cfg.ns.steps(),
        steps: spec.steps,
        routes: route_counts(mv),
        replica_count: mv.setup.plan.replica_count,
        replica_subgroups: subgroups,
        batches: mv.setup.plan.batches.len(),
        realigned_layouts: mv.realigned.len(),
        ranks,
        ns_single,
        step_losses: step_losses(spec, prod),
        single_step_losses: single.step_losses.clone(),
    };
    let (nd, nn) = summary.ns_totals();
    let (md, mn) = summary.momentum_totals();
    checks.push(check(
        "Muon dedup figures match the plan",
        off.is_empty() && prod.ranks.len() == summary.ranks.len(),
        if off.is_empty() {
            format!(
                "NS matrices per step: {nd} (dedup) vs {nn} (naive) vs {ns_single} (single device); momentum {md} vs {mn} bytes over all ranks, as predicted per rank"
            )
        } else {
            off.join("; ")
        },
    ));
    Ok((summary, checks))
}

fn muon_err(e: crate::muon::MuonError) -> VerifyError {
    VerifyError::Scenario(format!("distributed Muon: {e}"))
}

/// Check 1: the deduplicated engine equals naive distributed Muon (run beside it on the same
/// real gradients) on every rank after every step.
fn naive_check(spec: &VerifySpec, prod: &DistRun) -> Check {
    let mut bad = Vec::new();
    let mut missing = false;
    for (r, rank) in prod.ranks.iter().enumerate() {
        if rank.muon.len() != spec.steps {
            missing = true;
        }
        for (s, rec) in rank.muon.iter().enumerate() {
            missing |= rec.naive.is_none();
            for n in &rec.naive_mismatch {
                bad.push(format!("rank {r} step {} {n}", s + 1));
            }
        }
    }
    check(
        "Muon dedup == naive distributed Muon (bitwise)",
        bad.is_empty() && !missing,
        if missing {
            "naive distributed Muon did not run beside the engine".into()
        } else if bad.is_empty() {
            format!(
                "every updated shard on all {} ranks equal after each of {} steps (same real gradients)",
                spec.world(),
                spec.steps
            )
        } else {
            format!(
                "differs: {}",
                bad.into_iter().take(4).collect::<Vec<_>>().join(", ")
            )
        },
    )
}

/// Checks 2 and 3: the sharded optimizer equals single-device AdamW + Muon applied to the
/// run's own assembled gradients, step by step, and replicas (and replica subgroups) hold the
/// same bits after every step.
fn own_gradient_checks(
    spec: &VerifySpec,
    mv: &MuonVerify,
    prod: &DistRun,
    subgroups: &[String],
) -> Result<[Check; 2], VerifyError> {
    let mut own = mv.single_device();
    let mut params: ParamSet<f32> = spec
        .model
        .init_params::<f32>(spec.seed)
        .map_err(|e| VerifyError::Scenario(e.to_string()))?;
    let mut own_bad = Vec::new();
    let mut rep_bad = Vec::new();
    for s in 0..spec.steps {
        let g = assemble_step(spec, prod, s, Which::Grads)?;
        let p = assemble_step(spec, prod, s, Which::Params)?;
        rep_bad.extend(
            g.replica_mismatch
                .iter()
                .chain(&p.replica_mismatch)
                .map(|n| format!("step {} {n}", s + 1)),
        );
        own.step(&mut params, &g.tensors).map_err(muon_err)?;
        for (name, t) in params.iter() {
            let d = diff(
                p.tensors
                    .get(name)
                    .map_err(|e| VerifyError::Scenario(e.to_string()))?
                    .as_slice(),
                t.as_slice(),
            );
            if !d.bitwise {
                own_bad.push(format!("step {} {name} (max ULP {})", s + 1, d.max_ulp));
            }
        }
    }
    let own_check = check(
        "Muon sharded == single-device Muon on the run's gradients (bitwise)",
        own_bad.is_empty(),
        if own_bad.is_empty() {
            format!(
                "AdamW + Muon on the assembled gradients of each of {} steps reproduce every updated parameter",
                spec.steps
            )
        } else {
            format!(
                "differs: {}",
                own_bad.into_iter().take(4).collect::<Vec<_>>().join(", ")
            )
        },
    );
    let replica_check = check(
        "replicas and replica subgroups agree after every step",
        rep_bad.is_empty(),
        if rep_bad.is_empty() {
            format!(
                "every element held by several ranks has the same bits after each of {} steps{}",
                spec.steps,
                if subgroups.is_empty() {
                    String::new()
                } else {
                    format!(" (replica subgroups: {})", subgroups.join(", "))
                }
            )
        } else {
            format!(
                "replicas differ: {}",
                rep_bad.into_iter().take(4).collect::<Vec<_>>().join(", ")
            )
        },
    );
    Ok([own_check, replica_check])
}

/// Each rank's measured deduplication figures of the first step, and the differences from the
/// plan's per-rank prediction (or a load that changes between steps).
fn measured_loads(
    mv: &MuonVerify,
    prod: &DistRun,
) -> Result<(Vec<MuonRankLoad>, Vec<String>), VerifyError> {
    let predicted = mv.predicted().map_err(muon_err)?;
    let mut ranks = Vec::new();
    let mut off = Vec::new();
    for (r, rank) in prod.ranks.iter().enumerate() {
        let Some(first) = rank.muon.first() else {
            continue;
        };
        let naive = first.naive.clone().unwrap_or_default();
        let load = MuonRankLoad {
            rank: r,
            ns_dedup: first.dedup.ns_matrices,
            ns_naive: naive.ns_matrices,
            momentum_bytes_dedup: first.dedup.momentum_elems as u64 * 4,
            momentum_bytes_naive: naive.momentum_elems as u64 * 4,
            gather_bytes: first.dedup.gather_bytes,
            relay_bytes: first.dedup.relay_bytes,
            replica_bytes: first.dedup.replica_bytes,
            collectives: first.dedup.collectives,
        };
        let p = predicted.per_rank.get(r).copied().unwrap_or_default();
        let want = (
            p.ns_matrices_dedup as usize,
            p.ns_matrices_naive as usize,
            p.momentum_elems_dedup * 4,
            p.momentum_elems_naive * 4,
        );
        let got = (
            load.ns_dedup,
            load.ns_naive,
            load.momentum_bytes_dedup,
            load.momentum_bytes_naive,
        );
        if got != want {
            off.push(format!("rank {r}: measured {got:?}, plan {want:?}"));
        }
        let repeats = rank.muon.iter().all(|x| {
            x.dedup.ns_matrices == first.dedup.ns_matrices
                && x.dedup.momentum_elems == first.dedup.momentum_elems
        });
        if !repeats {
            off.push(format!("rank {r}: the load changes between steps"));
        }
        ranks.push(load);
    }
    Ok((ranks, off))
}

/// `axis size/subgroup` of every replica axis of the Muon matrices, deduplicated.
fn replica_subgroups(mv: &MuonVerify) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in &mv.setup.plan.params {
        for (axis, size) in &p.replicate_axes {
            let sub = mv.setup.plan.replica_subgroup_size(axis, *size);
            let t = format!("{axis} {size}/{sub}");
            if p.core_shape.is_some() && !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}
