//! The verdict of one verification: the three runs compared per parameter, the checks, the
//! golden digest, and the table rows reports are made of (with the Muon figures and checks of
//! [`super::muon_report`] when the optimizer is Muon).

use hpfsdp_plan::fsdp::DataDomain;
use hpfsdp_plan::planner::templates::format_axis_placements;
use serde::Serialize;

use super::bounds::MUON_STEP_BOUND;
use super::check::Check;
use super::compare::{Diff, Which, assemble, assemble_step, diff, diff_sets, digest};
use super::error::VerifyError;
use super::harness::{DistRun, run_distributed, run_single};
use super::muon_report::{MuonSummary, muon_part, param_step_bound};
use super::muon_spec::Route;
use super::setup::VerifySpec;
use super::trace::{Part, ProgramRoots, compare_part, compare_trace_with_program};
use crate::runtime::fsdp::FsdpCounts;
use crate::runtime::{ActDType, DispatchStats, ExecMode};
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};

/// Bound on row-parallel TP gradients: `max |g_tp − g_1| ≤ GRAD_REL_BOUND · max |g_1|` per
/// parameter. Row-parallel layers split each length-`K` dot product into `tp` partial sums
/// added across ranks, which changes f32 rounding by O(K·u) relative to the sum of the
/// absolute terms (`u = 2^-24`, `K ≤ 256` here, so ≲ 1.5e-5 in the worst case, typically
/// `sqrt(K)·u ≈ 1e-6`); the observed worst case on `dense-tp2-fsdp2` is 6.8e-7. 1e-4 leaves
/// two orders of magnitude of margin and is still four orders below what a real sharding bug
/// produces (a dropped all-reduce gives errors of 0.5-1.2 of max|g|).
pub const GRAD_REL_BOUND: f64 = 1e-4;

/// Unit roundoff of bf16 (8 significand bits): round-to-nearest-even changes a value by at
/// most this fraction of its magnitude.
pub const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 256.0;

/// The bound on row-parallel TP gradients of `spec` (`max |g_tp − g_1| ≤ bound · max |g_1|`),
/// given the TP collectives one micro-batch's forward and backward issue on a rank
/// (`tp_crossings`). With f32 activations it is [`GRAD_REL_BOUND`]. With bf16 activations
/// (the compute dtype) every crossing also rounds: each of the `tp` partial inputs and the
/// sum once, so the carried activation (or activation gradient) moves by at most
/// `(tp + 1) · u` (`u` = [`BF16_UNIT_ROUNDOFF`]) of the sum of the partials' magnitudes,
/// where the single device keeps f32. To first order the perturbations of the crossings a
/// gradient depends on add up, so the bound grows by `tp_crossings · (tp + 1) · u`: 0.129 on
/// `dense-tp2-fsdp2-bf16` (11 crossings, tp 2), where the measured worst case is 5e-3 (the
/// layers damp more than they amplify) and a dropped all-reduce still gives 0.5-1.2.
pub fn grad_rel_bound(spec: &VerifySpec, tp_crossings: usize) -> f64 {
    match spec.act_dtype() {
        ActDType::F32 => GRAD_REL_BOUND,
        ActDType::Bf16 => {
            let tp = spec.scenario.file.mesh.tp as f64;
            GRAD_REL_BOUND + tp_crossings as f64 * (tp + 1.0) * BF16_UNIT_ROUNDOFF
        }
    }
}

/// TP collectives one micro-batch's forward and backward issue on rank 0 (its step-1 trace
/// on the `tp` communicator over the micro-batches it ran).
pub fn tp_crossings(spec: &VerifySpec, prod: &DistRun) -> usize {
    let calls = prod
        .traces
        .first()
        .map_or(0, |t| t.iter().filter(|e| e.group_label == "tp").count());
    calls.div_ceil(spec.grad_accum.max(1))
}

pub use super::bounds::PARAM_ABS_BOUND_LR;

/// One parameter's line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct ParamRow {
    /// FQN.
    pub name: String,
    /// Global shape.
    pub shape: Vec<usize>,
    /// Placement: plan axes, FSDP shard dim and group, replicas.
    pub placement: String,
    /// Optimizer route: `adamw`, `muon` or `local-muon`.
    pub route: Route,
    /// Production gradients (assembled) versus single device (the last step's).
    pub grad: Diff,
    /// Production updated parameters versus single device (after the last step).
    pub param: Diff,
    /// The same comparisons after the first step (multi-step runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_step: Option<FirstStep>,
    /// Order-changing runs: the bound on `param.max_abs` per step (the first step's parameters
    /// must be within it, the last step's within `steps` times it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param_bound_per_step: Option<f64>,
    /// Production and validation bitwise equal (gradients and parameters, every rank).
    pub prod_val_bitwise: bool,
    /// Whether this parameter's sharded-vs-single comparison must be bitwise.
    pub bitwise_required: bool,
    /// `pass` or `FAIL`.
    pub verdict: String,
}

/// Gradients and updated parameters versus the single device after the first step, when
/// both runs still start from the same parameters.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FirstStep {
    /// Gradients of step 1.
    pub grad: Diff,
    /// Parameters after step 1.
    pub param: Diff,
}

/// Loss of each execution.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Losses {
    /// Production mode.
    pub production: f32,
    /// Validation mode.
    pub validation: f32,
    /// Single device.
    pub single_device: f32,
}

/// Wall time of each execution, seconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timings {
    /// Production mode (slowest rank).
    pub production_s: f64,
    /// Validation mode (slowest rank).
    pub validation_s: f64,
    /// Single device.
    pub single_device_s: f64,
}

/// The result of `verify`.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// Ranks.
    pub world: usize,
    /// Mesh degrees.
    pub mesh: String,
    /// Micro-batches per step (all data-parallel streams).
    pub micro_batches: usize,
    /// Micro-batches per stream.
    pub grad_accum: usize,
    /// Tokens per micro-batch.
    pub tokens_per_micro_batch: usize,
    /// Gathered-parameter dtype.
    pub param_dtype: String,
    /// Optimizer (`adamw`, `muon+adamw (preset)`).
    pub optimizer: String,
    /// Training steps per run (forward, backward, optimizer).
    pub steps: usize,
    /// Loss per execution.
    pub loss: Losses,
    /// Time per execution.
    pub timings: Timings,
    /// Dispatch events summed over ranks, per mode.
    pub dispatch_production: DispatchStats,
    /// Dispatch events summed over ranks, validation mode.
    pub dispatch_validation: DispatchStats,
    /// Rank 0's FSDP collectives.
    pub fsdp_rank0: FsdpCounts,
    /// Per-parameter rows.
    pub rows: Vec<ParamRow>,
    /// Checks.
    pub checks: Vec<Check>,
    /// blake3 of the updated parameters (production run, assembled), the golden digest.
    pub digest: String,
    /// blake3 of the single device's updated parameters.
    pub single_device_digest: String,
    /// Every check passed.
    pub passed: bool,
    /// Simplifications that apply.
    pub notes: Vec<String>,
    /// Muon figures (Muon optimizer only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub muon: Option<MuonSummary>,
}

fn placement_text(spec: &VerifySpec, name: &str) -> String {
    let plan = spec
        .sharding
        .param(name)
        .map_or("R".to_string(), |p| format_axis_placements(&p.placements));
    let Some(f) = spec.fsdp.param(name) else {
        return plan;
    };
    let (shard, rep) = match f.domain {
        DataDomain::Dense => ("dense.shard", "dense.replicate"),
        DataDomain::Expert => ("expert.shard", "expert.replicate"),
    };
    let s = spec.fsdp.groups.get(shard).map_or(1, |g| g.size);
    let r = spec.fsdp.groups.get(rep).map_or(1, |g| g.size);
    let mut t = format!("{plan}; fsdp S({})/{s}", f.shard_dim);
    if r > 1 {
        t.push_str(&format!(" x{r} rep"));
    }
    t
}

fn prod_val_equal(p: &DistRun, v: &DistRun) -> (bool, Vec<String>) {
    let mut bad = Vec::new();
    for (r, (a, b)) in p.ranks.iter().zip(&v.ranks).enumerate() {
        let bits = |x: &[Vec<f32>]| {
            x.iter()
                .map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        if bits(&a.grads) != bits(&b.grads) || bits(&a.params) != bits(&b.params) {
            bad.push(format!("rank {r}"));
        }
        let history_equal = a.history.len() == b.history.len()
            && a.history.iter().zip(&b.history).all(|(x, y)| {
                bits(&x.grads) == bits(&y.grads) && bits(&x.params) == bits(&y.params)
            });
        if !history_equal {
            bad.push(format!("rank {r} (an earlier step)"));
        }
        let lb = |x: &[(usize, f32)]| x.iter().map(|(i, l)| (*i, l.to_bits())).collect::<Vec<_>>();
        if lb(&a.losses) != lb(&b.losses) {
            bad.push(format!("rank {r} loss"));
        }
    }
    (bad.is_empty(), bad)
}

/// Run the three executions of `spec` (the distributed ones on in-process ranks) and compare
/// them.
pub fn verify(spec: &VerifySpec) -> Result<VerifyReport, VerifyError> {
    let prod = run_distributed(spec, ExecMode::Production)?;
    let val = run_distributed(spec, ExecMode::Validation)?;
    verify_runs(spec, &prod, &val)
}

/// The production run's tensors assembled from the ranks, plus validation mode's, which every
/// row compares bit for bit with production's.
struct AssembledRuns {
    prod_grads: super::compare::Assembled,
    prod_params: super::compare::Assembled,
    val_grads: super::compare::Assembled,
    val_params: super::compare::Assembled,
}

impl AssembledRuns {
    fn new(spec: &VerifySpec, prod: &DistRun, val: &DistRun) -> Result<Self, VerifyError> {
        Ok(Self {
            prod_grads: assemble(spec, prod, Which::Grads)?,
            prod_params: assemble(spec, prod, Which::Params)?,
            val_grads: assemble(spec, val, Which::Grads)?,
            val_params: assemble(spec, val, Which::Params)?,
        })
    }

    /// Whether `name`'s gradient and updated value are bitwise equal in both modes.
    fn prod_val_bitwise(&self, name: &str) -> bool {
        match (
            self.prod_grads.tensors.get(name),
            self.val_grads.tensors.get(name),
            self.prod_params.tensors.get(name),
            self.val_params.tensors.get(name),
        ) {
            (Ok(a), Ok(b), Ok(c), Ok(d)) => a.bit_eq(b) && c.bit_eq(d),
            _ => false,
        }
    }
}

/// Compare distributed runs made on any backend (`prod` in production mode, `val` in
/// validation mode) with the single device, which runs here.
pub fn verify_runs(
    spec: &VerifySpec,
    prod: &DistRun,
    val: &DistRun,
) -> Result<VerifyReport, VerifyError> {
    let single = run_single(spec)?;
    let runs = AssembledRuns::new(spec, prod, val)?;
    let grad_bound = grad_rel_bound(spec, tp_crossings(spec, prod));
    let rows = param_rows(spec, prod, &runs, &single, grad_bound)?;
    let mut checks = vec![
        prod_val_check(spec, prod, val),
        replica_check(&runs),
        single_device_check(spec, &rows, grad_bound),
        fsdp_count_check(spec, prod),
    ];
    let mv = spec.muon.as_ref();
    let muon = match mv {
        Some(m) => {
            let (summary, muon_checks) = muon_part(spec, m, prod, &single)?;
            checks.extend(muon_checks);
            Some(summary)
        }
        None => None,
    };
    checks.push(trace_check(spec, prod));
    if mv.is_some() {
        checks.push(muon_trace_check(spec, prod));
    }
    let passed = checks.iter().filter(|c| c.gating).all(|c| c.passed);
    let m = &spec.scenario.file.mesh;
    Ok(VerifyReport {
        scenario: spec.scenario.file.name.clone(),
        description: spec.scenario.file.description.clone(),
        world: spec.world(),
        mesh: format!(
            "dp_replicate={} dp_shard={} tp={} ep={} (edp_shard={})",
            m.dp_replicate,
            m.dp_shard,
            m.tp,
            m.ep,
            spec.scenario.expert_mesh.axis_size("edp_shard")
        ),
        micro_batches: spec.micro_batches(),
        grad_accum: spec.grad_accum,
        tokens_per_micro_batch: spec.tokens(),
        param_dtype: if spec.param_bf16 { "bf16" } else { "f32" }.into(),
        optimizer: spec.optimizer_name(),
        steps: spec.steps,
        loss: Losses {
            production: prod.mean_loss(),
            validation: val.mean_loss(),
            single_device: single.mean_loss,
        },
        timings: Timings {
            production_s: prod.step_seconds(),
            validation_s: val.step_seconds(),
            single_device_s: single.step_seconds,
        },
        dispatch_production: prod.stats(),
        dispatch_validation: val.stats(),
        fsdp_rank0: prod.ranks[0].fsdp,
        rows,
        checks,
        digest: digest(&runs.prod_params.tensors),
        single_device_digest: digest(&single.params),
        passed,
        notes: spec.notes.clone(),
        muon,
    })
}

/// One row per parameter: the production run against the single device (after the last step
/// and, in a multi-step run, after the first), bitwise or within the TP bounds, and
/// production against validation mode.
fn param_rows(
    spec: &VerifySpec,
    prod: &DistRun,
    runs: &AssembledRuns,
    single: &super::harness::SingleRun,
    grad_bound: f64,
) -> Result<Vec<ParamRow>, VerifyError> {
    let grad_d = diff_sets(&runs.prod_grads.tensors, &single.grads);
    let param_d = diff_sets(&runs.prod_params.tensors, &single.params);
    let bitwise_required = !spec.order_changing();
    let first = match single.history.first() {
        Some(s1) if spec.steps > 1 => {
            let g1 = assemble_step(spec, prod, 0, Which::Grads)?;
            let p1 = assemble_step(spec, prod, 0, Which::Params)?;
            Some((
                diff_sets(&g1.tensors, &s1.grads),
                diff_sets(&p1.tensors, &s1.params),
            ))
        }
        _ => None,
    };
    let mut rows = Vec::new();
    for (k, ((name, g), (_, p))) in grad_d.iter().zip(&param_d).enumerate() {
        let index = spec.fsdp.params.iter().position(|q| q.name == *name);
        let route = match (spec.muon.as_ref(), index) {
            (Some(m), Some(i)) => m.route(i),
            _ => Route::Adamw,
        };
        let first_step = first.as_ref().and_then(|(gs, ps)| {
            Some(FirstStep {
                grad: gs.get(k)?.1,
                param: ps.get(k)?.1,
            })
        });
        let step_bound = index.map_or(0.0, |i| param_step_bound(spec, i));
        let pv = runs.prod_val_bitwise(name);
        let (g1, p1) = first_step.map_or((*g, *p), |f| (f.grad, f.param));
        let ok_single = if bitwise_required {
            g.bitwise && p.bitwise && g1.bitwise && p1.bitwise
        } else {
            g1.rel_to_max <= grad_bound
                && p1.max_abs <= step_bound
                && p.max_abs <= step_bound * spec.steps as f64
        };
        let shape = single
            .params
            .get(name)
            .map(|t| t.shape().to_vec())
            .unwrap_or_default();
        rows.push(ParamRow {
            name: name.clone(),
            shape,
            placement: placement_text(spec, name),
            route,
            grad: *g,
            param: *p,
            first_step,
            param_bound_per_step: (!bitwise_required).then_some(step_bound),
            prod_val_bitwise: pv,
            bitwise_required,
            verdict: if ok_single && pv { "pass" } else { "FAIL" }.into(),
        });
    }
    Ok(rows)
}

/// Production and validation mode agree bit for bit on every rank (after every step).
fn prod_val_check(spec: &VerifySpec, prod: &DistRun, val: &DistRun) -> Check {
    let (pv_equal, pv_bad) = prod_val_equal(prod, val);
    Check {
        name: "production == validation (bitwise)".into(),
        passed: pv_equal,
        gating: true,
        detail: if pv_equal {
            format!(
                "gradients, updated shards and losses equal on all {} ranks{}",
                spec.world(),
                if spec.steps > 1 {
                    format!(" after each of {} steps", spec.steps)
                } else {
                    String::new()
                }
            )
        } else {
            format!("differs on {}", pv_bad.join(", "))
        },
    }
}

/// Every element held by several ranks has the same bits on each.
fn replica_check(runs: &AssembledRuns) -> Check {
    let mut rep_bad = runs.prod_grads.replica_mismatch.clone();
    rep_bad.extend(runs.prod_params.replica_mismatch.iter().cloned());
    Check {
        name: "replicas agree".into(),
        passed: rep_bad.is_empty(),
        gating: true,
        detail: if rep_bad.is_empty() {
            "every element held by several ranks has the same bits on each".into()
        } else {
            format!("replicas differ for {}", rep_bad.join(", "))
        },
    }
}

/// The sharded run equals the single device: bitwise, or within the TP bound where TP changes
/// the summation order.
fn single_device_check(spec: &VerifySpec, rows: &[ParamRow], grad_bound: f64) -> Check {
    let bitwise_required = !spec.order_changing();
    let failing = rows.iter().filter(|r| r.verdict != "pass").count();
    Check {
        name: if bitwise_required {
            "sharded == single device (bitwise)".into()
        } else {
            "sharded vs single device within the TP bound".into()
        },
        passed: failing == 0,
        gating: true,
        detail: if bitwise_required {
            format!(
                "{} of {} parameters bitwise equal (gradients and updated values{})",
                rows.len() - failing,
                rows.len(),
                if spec.steps > 1 {
                    format!(" after {} steps", spec.steps)
                } else {
                    String::new()
                }
            )
        } else {
            tp_detail(spec, rows, grad_bound)
        },
    }
}

/// Rank 0 issued exactly the FSDP collectives the plan gives per micro-batch and step.
fn fsdp_count_check(spec: &VerifySpec, prod: &DistRun) -> Check {
    let (ag, rs, ar) = spec.fsdp.collective_counts();
    let steps = spec.steps as u64;
    let a = spec.grad_accum as u64 * steps;
    let want = (ag as u64 * a, rs as u64 * a, ar as u64 * steps);
    let c0 = prod.ranks[0].fsdp;
    let got = (c0.all_gathers, c0.reduce_scatters, c0.all_reduces);
    Check {
        name: "FSDP collectives match the plan".into(),
        passed: got == want,
        gating: true,
        detail: format!(
            "rank 0 issued {} all-gathers, {} reduce-scatters, {} fused all-reduces; the plan gives {} x {a}, {} x {a}, {} x {steps}",
            got.0, got.1, got.2, ag, rs, ar
        ),
    }
}

/// The TP check's detail: worst gradient and parameter errors against their bounds, per
/// optimizer route (after the first and the last step of a multi-step run).
fn tp_detail(spec: &VerifySpec, rows: &[ParamRow], grad_bound: f64) -> String {
    let worst = |f: &dyn Fn(&ParamRow) -> f64, rs: &[&ParamRow]| {
        rs.iter().map(|r| f(r)).fold(0.0, f64::max)
    };
    let all: Vec<&ParamRow> = rows.iter().collect();
    let g1 = worst(
        &|r| r.first_step.map_or(r.grad, |f| f.grad).rel_to_max,
        &all,
    );
    let mut t = format!(
        "row-parallel TP changes summation order{}: worst step-1 gradient error {g1:.2e} of max|g| (bound {grad_bound:.1e})",
        if spec.act_dtype() == ActDType::Bf16 {
            " and rounds activations to bf16"
        } else {
            ""
        }
    );
    if spec.steps > 1 {
        t.push_str(&format!(
            ", step-{} gradients {:.2e} (taken at parameters that already differ; reported)",
            spec.steps,
            worst(&|r| r.grad.rel_to_max, &all)
        ));
    }
    for route in [Route::Adamw, Route::Muon, Route::LocalMuon] {
        let mine: Vec<&ParamRow> = rows.iter().filter(|r| r.route == route).collect();
        if mine.is_empty() {
            continue;
        }
        let unit = match route {
            Route::Adamw => format!("{PARAM_ABS_BOUND_LR}·lr"),
            _ => format!("{MUON_STEP_BOUND}·lr·s"),
        };
        // Each row's error in units of its own per-step bound.
        let ratio =
            |d: Diff, r: &ParamRow| d.max_abs / r.param_bound_per_step.unwrap_or(f64::INFINITY);
        let last_abs = worst(&|r| r.param.max_abs, &mine);
        let last_rel = worst(&|r| r.param.rel_to_max, &mine);
        let last_ulp = mine.iter().map(|r| r.param.max_ulp).max().unwrap_or(0);
        let last_ratio = worst(&|r| ratio(r.param, r) / spec.steps as f64, &mine);
        t.push_str(&format!(
            "; {} parameters (bound {unit} per step):",
            route.name()
        ));
        if spec.steps > 1 {
            let first_abs = worst(&|r| r.first_step.map_or(0.0, |f| f.param.max_abs), &mine);
            let first_ratio = worst(&|r| r.first_step.map_or(0.0, |f| ratio(f.param, r)), &mine);
            t.push_str(&format!(
                " step 1 max abs {first_abs:.2e} ({:.0}% of bound),",
                first_ratio * 100.0
            ));
        }
        t.push_str(&format!(
            " step {} max abs {last_abs:.2e} (rel {last_rel:.1e}, {last_ulp} ULP; {:.0}% of {})",
            spec.steps,
            last_ratio * 100.0,
            if spec.steps > 1 {
                format!("{} x bound", spec.steps)
            } else {
                "bound".into()
            }
        ));
    }
    t
}

/// Compare every rank's production trace with the `hyperparallel` step program of that rank
/// (gating): every FSDP/HSDP, TP and EP call must match per communicator in kind, element
/// count and dtype; only all-to-all-v sizes are exempt (they depend on the routing).
pub fn trace_check(spec: &VerifySpec, prod: &DistRun) -> Check {
    let name = "collective trace == hyperparallel step program".to_string();
    let generator = match ProgramGenerator::new(
        &spec.scenario,
        &spec.sharding,
        &spec.fsdp,
        StrategyKind::HyperParallel,
    ) {
        Ok(g) => g,
        Err(e) => {
            return Check {
                name,
                passed: false,
                gating: true,
                detail: format!("no step program: {e}"),
            };
        }
    };
    let mut calls = 0;
    for (rank, trace) in prod.traces.iter().enumerate() {
        let program = match generator.program(rank) {
            Ok(p) => p,
            Err(e) => {
                return Check {
                    name,
                    passed: false,
                    gating: true,
                    detail: format!("no step program for rank {rank}: {e}"),
                };
            }
        };
        match compare_trace_with_program(trace, &program) {
            Ok(m) => calls += m.per_communicator.iter().map(|(_, n)| n).sum::<usize>(),
            Err(e) => {
                return Check {
                    name,
                    passed: false,
                    gating: true,
                    detail: format!("first difference: {e}"),
                };
            }
        }
    }
    Check {
        name,
        passed: true,
        gating: true,
        detail: format!(
            "{calls} FSDP/TP/EP calls on {} ranks match per communicator (kind, elements, dtype)",
            prod.traces.len()
        ),
    }
}

/// Name of [`muon_trace_check`].
pub const MUON_TRACE_CHECK: &str = "Muon collective trace == hyperparallel Muon optimizer program";

/// Whether the Muon trace check gates the verdict: yes, the deduplicated engine's collectives
/// (notes `hyper-parallel.md` 6.4-6.6) equal the `hyperparallel` Muon program's on every Muon
/// verification scenario, including uneven shards (segments padded to the largest rank's
/// piece) and back-to-back shard-path batches (no gather prefetch across batches).
pub const MUON_TRACE_GATING: bool = true;

/// Compare every rank's trace of the deduplicated Muon engine in the first optimizer step
/// ([`DistRun::muon_traces`]: fused shard all-gathers, relay broadcasts, replica broadcasts)
/// with the `Optimizer` collectives of the `hyperparallel` step program with the
/// `hyperparallel` Muon optimizer of that rank: per communicator (matched by membership) the
/// same sequence of kind, element count and dtype, and for broadcasts the same root position
/// in the group.
pub fn muon_trace_check(spec: &VerifySpec, prod: &DistRun) -> Check {
    let name = MUON_TRACE_CHECK.to_string();
    let fail = |detail: String| Check {
        name: name.clone(),
        passed: false,
        gating: MUON_TRACE_GATING,
        detail,
    };
    let Some(mv) = spec.muon.as_ref() else {
        return fail("not a Muon scenario".into());
    };
    let generator = match ProgramGenerator::with_optimizer(
        &spec.scenario,
        &spec.sharding,
        &spec.fsdp,
        StrategyKind::HyperParallel,
        OptimizerStrategy::HyperParallelMuon,
    ) {
        Ok(g) => g,
        Err(e) => return fail(format!("no step program: {e}")),
    };
    let roots = ProgramRoots::from_muon_plan(&mv.setup.plan);
    let (mut calls, mut root_calls, mut broadcasts) = (0, 0, 0);
    let mut per_kind: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut first: Option<String> = None;
    let mut differing = 0;
    for (rank, trace) in prod.muon_traces.iter().enumerate() {
        let program = match generator.program(rank) {
            Ok(p) => p,
            Err(e) => return fail(format!("no step program for rank {rank}: {e}")),
        };
        match compare_part(trace, &program, Part::MuonOptimizer, Some(&roots)) {
            Ok(m) => {
                calls += m.calls();
                root_calls += m.roots_compared;
            }
            Err(e) => {
                differing += 1;
                first.get_or_insert_with(|| e.to_string());
            }
        }
        for e in trace {
            if let Some(k) = e.kind.plan_kind() {
                *per_kind.entry(k.name()).or_default() += 1;
                broadcasts += usize::from(k == hpfsdp_plan::CollectiveKind::Broadcast);
            }
        }
    }
    if let Some(e) = first {
        return fail(format!(
            "first difference: {e} (the Muon calls of {differing} of {} ranks differ)",
            prod.muon_traces.len()
        ));
    }
    let kinds = per_kind
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    Check {
        name,
        passed: true,
        gating: MUON_TRACE_GATING,
        detail: format!(
            "{calls} Muon calls of step 1 on {} ranks ({}) match per communicator (kind, elements, dtype); {root_calls} of {broadcasts} broadcast roots compared",
            prod.muon_traces.len(),
            if kinds.is_empty() {
                "none".into()
            } else {
                kinds
            }
        ),
    }
}

/// The outcome of running a mutated plan in validation mode.
#[derive(Debug, Clone, Serialize)]
pub struct MutationOutcome {
    /// What was mutated.
    pub target: String,
    /// The boundary the mutation lives in.
    pub module: String,
    /// What changed.
    pub description: String,
    /// Validation mode stopped with an error.
    pub caught: bool,
    /// The module validation mode named (if any).
    pub named_module: Option<String>,
    /// The validation error message (or why it was not caught).
    pub message: String,
    /// What production mode did with the same plan.
    pub production: String,
}

/// Run a mutated spec in validation mode (and production mode, for contrast).
pub fn verify_mutation(spec: &VerifySpec) -> Result<MutationOutcome, VerifyError> {
    let m = spec.mutation.clone().ok_or_else(|| VerifyError::Mutation {
        target: String::new(),
        reason: "the spec carries no mutation".into(),
    })?;
    let production = match run_distributed(spec, ExecMode::Production) {
        Ok(_) => "ran to completion without noticing the wrong placement".to_string(),
        Err(e) => format!("failed without naming the module: {e}"),
    };
    let (caught, named_module, message) = match run_distributed(spec, ExecMode::Validation) {
        Ok(_) => (
            false,
            None,
            "validation mode ran to completion: the mutation was NOT caught".to_string(),
        ),
        Err(VerifyError::Run { source, .. }) => (
            true,
            source.module().map(str::to_string),
            source.to_string(),
        ),
        Err(e) => return Err(e),
    };
    Ok(MutationOutcome {
        target: m.target,
        module: m.module,
        description: m.description,
        caught,
        named_module,
        message,
        production,
    })
}

/// Compare a production run's assembled parameters with another's, for tests.
pub fn param_diff(
    spec: &VerifySpec,
    a: &DistRun,
    b: &DistRun,
) -> Result<Vec<(String, Diff)>, VerifyError> {
    let x = assemble(spec, a, Which::Params)?;
    let y = assemble(spec, b, Which::Params)?;
    Ok(x.tensors
        .iter()
        .zip(y.tensors.iter())
        .map(|((n, s), (_, t))| (n.to_string(), diff(s.as_slice(), t.as_slice())))
        .collect())
}
