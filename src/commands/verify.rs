//! `hpfsdp verify`: the training steps of a scenario (one with AdamW; several with distributed
//! Muon, `[optimizer] kind = "muon+adamw"`) in production mode, in validation mode and on a
//! single device, compared per parameter, with the Muon dedup figures and checks; optionally a
//! mutated plan (`--mutate`), the mode benchmark (`--bench-modes`), JSON and an HTML/CSV
//! report.
//!
//! Exit status: 0 when every gating check passes (with `--mutate`: when validation mode
//! caught the mutation and named its module), 1 when a check fails, 2 on bad input.

use crate::table::Table;
use anyhow::{Context, Result};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::verify::bench::{ModeBench, bench_modes};
use hpfsdp_reference::verify::muon_report::MuonSummary;
use hpfsdp_reference::verify::report::{MutationOutcome, VerifyReport, verify_mutation};
use hpfsdp_reference::verify::{VerifySpec, verify};
use hpfsdp_reports::table::{Section, Table as ReportTable, TableReport, Verdict};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Command-line arguments of `verify`.
pub struct VerifyArgs {
    /// Scenario file.
    pub scenario: PathBuf,
    /// Print JSON instead of tables.
    pub json: bool,
    /// Write verify.html and CSV tables here.
    pub out: Option<PathBuf>,
    /// Inject a wrong placement into this module or parameter and expect validation to catch it.
    pub mutate: Option<String>,
    /// Also run the production/validation mode benchmark.
    pub bench_modes: bool,
    /// Which backend runs the distributed executions.
    pub backend: VerifyBackend,
    /// Bound on every collective wait of a process backend, seconds.
    pub timeout_s: f64,
}

/// The backend of `verify`'s distributed executions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyBackend {
    /// Every rank a thread of this process.
    Inproc,
    /// This process is one rank of an `mpirun -np <world>` job (build with `--features mpi`).
    Mpi,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    report: Option<&'a VerifyReport>,
    mutation: Option<&'a MutationOutcome>,
    mode_bench: Option<&'a [ModeBench]>,
}

/// Most parameters of a model `verify` runs: the reference executor does every multiply-add
/// on the CPU, in several modes, so verification scenarios use tiny models (the shipped ones
/// have at most 0.4 M parameters).
const VERIFY_MAX_PARAMS: u64 = 1 << 21;

/// Largest dimension of any parameter `verify` runs: Newton-Schulz costs the cube of a
/// matrix's dimensions (the shipped tiny models stay at 256).
const VERIFY_MAX_PARAM_DIM: u64 = 512;

/// Most tokens per step (`global_batch x seq_len`) `verify` runs, for the same reason.
const VERIFY_MAX_TOKENS_PER_STEP: u64 = 1 << 16;

/// Most parameter x token products per step `verify` runs (5x the largest shipped scenario;
/// seconds of CPU work).
const VERIFY_MAX_PARAM_TOKENS: u64 = 1 << 29;

/// Most ranks `verify` runs: every rank is a thread (or an MPI process) of one machine (the
/// shipped scenarios use at most 8).
const VERIFY_MAX_RANKS: usize = 64;

/// Refuses a scenario too large for the bit-exact CPU reference, naming the figure and the fix.
fn check_verify_budget(scenario: &Scenario) -> Result<()> {
    let params = scenario.model.total_params();
    let tokens = scenario.tokens_per_step();
    let file = scenario.path.display();
    if scenario.world_size() > VERIFY_MAX_RANKS {
        anyhow::bail!(
            "{file}: {} ranks; verify runs every rank on this machine and accepts at most \
             {VERIFY_MAX_RANKS}; shrink [mesh] and [topology]",
            scenario.world_size()
        );
    }
    if params > VERIFY_MAX_PARAMS {
        anyhow::bail!(
            "{file}: the model has {params} parameters; verify runs real arithmetic on the CPU \
             and accepts at most {VERIFY_MAX_PARAMS}; use a tiny model (scenarios/verify/models/)"
        );
    }
    if let Some(p) = scenario
        .model
        .params
        .iter()
        .find(|p| p.shape.iter().any(|&d| d > VERIFY_MAX_PARAM_DIM))
    {
        anyhow::bail!(
            "{file}: parameter {} has shape {:?}; verify accepts dimensions up to \
             {VERIFY_MAX_PARAM_DIM}; use a tiny model (scenarios/verify/models/)",
            p.name,
            p.shape
        );
    }
    if tokens > VERIFY_MAX_TOKENS_PER_STEP {
        anyhow::bail!(
            "{file}: [train] global_batch x seq_len = {tokens} tokens per step; verify accepts \
             at most {VERIFY_MAX_TOKENS_PER_STEP}; lower global_batch or seq_len"
        );
    }
    if params.saturating_mul(tokens) > VERIFY_MAX_PARAM_TOKENS {
        anyhow::bail!(
            "{file}: {params} parameters x {tokens} tokens per step exceeds verify's budget of \
             {VERIFY_MAX_PARAM_TOKENS}; lower global_batch or seq_len, or use a smaller model"
        );
    }
    Ok(())
}

/// Loads a scenario for verification: `Ok(Err(1))` when its sharding plan has lint errors
/// (printed, as `plan` prints them), an error when it is outside verify's budget.
fn load_gated(path: &Path) -> Result<Result<VerifySpec, ExitCode>> {
    let scenario = Scenario::load(path)?;
    let sharding = hpfsdp_plan::planner::plan(&scenario.model, &scenario.planner_input());
    if let Some(code) =
        crate::commands::lint_gate::refuse_lint_errors(&scenario, &sharding, false, "verify", false)
    {
        return Ok(Err(code));
    }
    check_verify_budget(&scenario)?;
    let spec = VerifySpec::from_scenario(&scenario).with_context(|| {
        format!(
            "{} cannot be verified by the reference executor",
            path.display()
        )
    })?;
    Ok(Ok(spec))
}

/// [`load_gated`] for the MPI ranks, where a refusal is an error every rank reports alike.
#[cfg(feature = "mpi")]
fn load(path: &Path) -> Result<VerifySpec> {
    match load_gated(path)? {
        Ok(spec) => Ok(spec),
        Err(_) => anyhow::bail!(
            "{}: the sharding plan has lint errors (listed above)",
            path.display()
        ),
    }
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.2e}")
    }
}

fn shape(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
    )
}

fn param_rows(r: &VerifyReport) -> (Vec<String>, Vec<Vec<String>>) {
    let multi = r.steps > 1;
    let mut headers = vec![
        "parameter",
        "shape",
        "placement",
        "optimizer",
        "grad max abs",
        "grad rel",
        "grad max ULP",
        "param max abs",
        "param max ULP",
    ];
    if multi {
        headers.extend(["step-1 grad rel", "step-1 param max abs"]);
    }
    headers.extend(["bitwise", "prod==val", "verdict"]);
    let rows = r
        .rows
        .iter()
        .map(|p| {
            let bitwise = p.grad.bitwise
                && p.param.bitwise
                && p.first_step
                    .is_none_or(|f| f.grad.bitwise && f.param.bitwise);
            let mut row = vec![
                p.name.clone(),
                shape(&p.shape),
                p.placement.clone(),
                p.route.name().to_string(),
                sci(p.grad.max_abs),
                sci(p.grad.rel_to_max),
                p.grad.max_ulp.to_string(),
                sci(p.param.max_abs),
                p.param.max_ulp.to_string(),
            ];
            if multi {
                let f = p.first_step;
                row.push(f.map_or("-".into(), |f| sci(f.grad.rel_to_max)));
                row.push(f.map_or("-".into(), |f| sci(f.param.max_abs)));
            }
            row.extend([
                if bitwise { "yes" } else { "no" }.into(),
                if p.prod_val_bitwise { "yes" } else { "no" }.into(),
                p.verdict.clone(),
            ]);
            row
        })
        .collect();
    (headers.iter().map(|s| s.to_string()).collect(), rows)
}

fn check_rows(r: &VerifyReport) -> Vec<Vec<String>> {
    r.checks
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                match (c.passed, c.gating) {
                    (true, _) => "pass".into(),
                    (false, true) => "FAIL".into(),
                    (false, false) => "differs (advisory)".into(),
                },
                c.detail.clone(),
            ]
        })
        .collect()
}

const MUON_HEADERS: [&str; 9] = [
    "rank",
    "NS dedup",
    "NS naive",
    "momentum bytes dedup",
    "momentum bytes naive",
    "gather bytes",
    "relay bytes",
    "replica bytes",
    "collectives",
];

fn muon_rows(m: &MuonSummary) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = m
        .ranks
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                r.ns_dedup.to_string(),
                r.ns_naive.to_string(),
                r.momentum_bytes_dedup.to_string(),
                r.momentum_bytes_naive.to_string(),
                r.gather_bytes.to_string(),
                r.relay_bytes.to_string(),
                r.replica_bytes.to_string(),
                r.collectives.to_string(),
            ]
        })
        .collect();
    let (nd, nn) = m.ns_totals();
    let (md, mn) = m.momentum_totals();
    let sum = |f: fn(&hpfsdp_reference::verify::muon_report::MuonRankLoad) -> u64| -> String {
        m.ranks.iter().map(f).sum::<u64>().to_string()
    };
    rows.push(vec![
        "all".into(),
        nd.to_string(),
        nn.to_string(),
        md.to_string(),
        mn.to_string(),
        sum(|r| r.gather_bytes),
        sum(|r| r.relay_bytes),
        sum(|r| r.replica_bytes),
        sum(|r| r.collectives as u64),
    ]);
    rows
}

fn losses(xs: &[f32]) -> String {
    xs.iter()
        .map(f32::to_string)
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// The Muon paragraph above the per-rank table.
fn muon_text(m: &MuonSummary) -> String {
    let (nd, nn) = m.ns_totals();
    format!(
        "distributed Muon ({} preset, lr {}, {} NS steps), {} optimizer steps: {} gathered matrices (muon), {} local matrix stacks (local-muon), {} AdamW parameters; Muon plan batches: {}; replica subgroups: {}; {} layouts realigned to the runtime's strided FSDP shards
  NS matrices per step: {nd} deduplicated vs {nn} naive vs {} single device
  loss per step: production {} | single device {}
",
        m.preset,
        m.lr,
        m.ns_steps,
        m.steps,
        m.routes.muon,
        m.routes.local_muon,
        m.routes.adamw,
        m.batches,
        if m.replica_subgroups.is_empty() {
            "none".to_string()
        } else {
            m.replica_subgroups.join(", ")
        },
        m.realigned_layouts,
        m.ns_single,
        losses(&m.step_losses),
        losses(&m.single_step_losses),
    )
}

fn bench_rows(b: &[ModeBench]) -> Vec<Vec<String>> {
    b.iter()
        .map(|m| {
            vec![
                m.micro_batch.to_string(),
                format!("{:.2}", m.production_s * 1e3),
                format!("{:.2}", m.validation_s * 1e3),
                format!("{:.3}", m.ratio),
                m.production_events.to_string(),
                m.validation_events.to_string(),
                m.extra_events.to_string(),
                m.rule_cache_hits.to_string(),
                format!("{:.3}", m.validation_host_s * 1e3),
                format!("{:.1}%", m.host_overhead * 100.0),
            ]
        })
        .collect()
}

/// Repeats of each mode in `--bench-modes` (the best time is kept).
const BENCH_REPEATS: usize = 5;

const BENCH_HEADERS: [&str; 10] = [
    "micro batch",
    "production ms",
    "validation ms",
    "val/prod",
    "prod events",
    "val events",
    "extra events",
    "rule cache hits",
    "val host ms/rank",
    "host overhead",
];

fn render_text(r: &VerifyReport, bench: Option<&[ModeBench]>) -> String {
    let mut out = format!(
        "verify {}: {}\n  {} ranks, {}, {} micro-batches x {} tokens ({} per rank), params {}, optimizer {}, {} step{}\n",
        r.scenario,
        r.description,
        r.world,
        r.mesh,
        r.micro_batches,
        r.tokens_per_micro_batch,
        r.grad_accum,
        r.param_dtype,
        r.optimizer,
        r.steps,
        if r.steps == 1 { "" } else { "s" }
    );
    out.push_str(&format!(
        "  loss{}: production {} | validation {} | single device {}\n  time{}: production{} {:.1} ms | validation {:.1} ms | single device {:.1} ms\n\n",
        if r.steps > 1 { " (mean over all steps)" } else { "" },
        r.loss.production,
        r.loss.validation,
        r.loss.single_device,
        if r.steps > 1 { " (all steps)" } else { "" },
        if r.muon.is_some() {
            " (naive Muon beside)"
        } else {
            ""
        },
        r.timings.production_s * 1e3,
        r.timings.validation_s * 1e3,
        r.timings.single_device_s * 1e3
    ));
    let (headers, rows) = param_rows(r);
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(&h);
    for row in rows {
        t.row(row);
    }
    out.push_str(&t.render());
    out.push('\n');
    if let Some(m) = &r.muon {
        out.push_str(&muon_text(m));
        let mut t = Table::new(&MUON_HEADERS);
        for row in muon_rows(m) {
            t.row(row);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    let mut c = Table::new(&["check", "result", "detail"]);
    for row in check_rows(r) {
        c.row(row);
    }
    out.push_str(&c.render());
    if let Some(b) = bench {
        out.push_str(&format!(
            "\nmode benchmark (one step, slowest rank, best of {BENCH_REPEATS}):\n"
        ));
        let mut t = Table::new(&BENCH_HEADERS);
        for row in bench_rows(b) {
            t.row(row);
        }
        out.push_str(&t.render());
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out.push_str(&format!(
        "\nupdated-parameter digest (blake3): {}\n{}\n",
        r.digest,
        if r.passed {
            "VERDICT: PASS".to_string()
        } else {
            format!("VERDICT: FAIL ({})", verdict(r).text)
        }
    ));
    out
}

/// The report's verdict: the FAIL text names every failing gating check.
fn verdict(r: &VerifyReport) -> Verdict {
    let v = Verdict::over_checks(
        "production == validation bitwise; sharded matches the single device",
        r.checks
            .iter()
            .filter(|c| c.gating)
            .map(|c| (c.name.as_str(), c.passed)),
    );
    if !r.passed && v.passed {
        // Defensive: the report failed without a failing gating check; never show PASS.
        return Verdict {
            passed: false,
            text: "the report failed without naming a failing gating check".into(),
        };
    }
    v
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) -> ReportTable {
    ReportTable {
        headers: headers.iter().map(|s| s.to_string()).collect(),
        rows,
    }
}

fn write_out(dir: &Path, r: &VerifyReport, bench: Option<&[ModeBench]>) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
    let (headers, rows) = param_rows(r);
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    let params = table(&h, rows);
    let checks = table(&["check", "result", "detail"], check_rows(r));
    let mut sections = vec![
        Section {
            heading: "Checks".into(),
            text: format!(
                "Loss: production {}, validation {}, single device {}. Updated-parameter digest {}.",
                r.loss.production, r.loss.validation, r.loss.single_device, r.digest
            ),
            table: checks.clone(),
        },
        Section {
            heading: "Parameters".into(),
            text: format!(
                "Production gradients and updated parameters (assembled from every rank's \
                 shards) against the single device{}; optimizer is the route of each parameter \
                 ({}); prod==val compares production and validation mode bit for bit on every rank.",
                if r.steps > 1 {
                    format!(
                        " after the last of {} steps (step-1 columns: after the first)",
                        r.steps
                    )
                } else {
                    String::new()
                },
                r.optimizer
            ),
            table: params.clone(),
        },
    ];
    if let Some(m) = &r.muon {
        let t = table(&MUON_HEADERS, muon_rows(m));
        std::fs::write(dir.join("muon.csv"), t.to_csv())?;
        sections.push(Section {
            heading: "Distributed Muon".into(),
            text: muon_text(m),
            table: t,
        });
    }
    if let Some(b) = bench {
        let t = table(&BENCH_HEADERS, bench_rows(b));
        std::fs::write(dir.join("mode_bench.csv"), t.to_csv())?;
        sections.push(Section {
            heading: "Mode benchmark".into(),
            text: "Validation versus production mode step time and dispatch events.".into(),
            table: t,
        });
    }
    let report = TableReport {
        title: format!("hpfsdp verify: {}", r.scenario),
        subtitle: format!("{} ranks, {}", r.world, r.mesh),
        verdict: Some(verdict(r)),
        sections,
    };
    std::fs::write(dir.join("verify.html"), report.to_html())?;
    std::fs::write(dir.join("params.csv"), params.to_csv())?;
    std::fs::write(dir.join("checks.csv"), checks.to_csv())?;
    Ok(())
}

/// Runs the command.
pub fn run(args: &VerifyArgs) -> Result<ExitCode> {
    let timeout = collective_timeout(args.timeout_s)?;
    if args.backend == VerifyBackend::Mpi {
        return run_mpi(args, timeout);
    }
    if let Some(dir) = &args.out {
        crate::commands::preflight::ensure_writable_dir(dir, "--out")?;
    }
    let mut spec = match load_gated(&args.scenario)? {
        Ok(spec) => spec,
        Err(code) => return Ok(code),
    };
    if let Some(target) = &args.mutate {
        spec.mutate(target)?;
        let o = verify_mutation(&spec)?;
        let named = o.caught && o.named_module.as_deref() == Some(o.module.as_str());
        if args.json {
            let j = JsonOut {
                report: None,
                mutation: Some(&o),
                mode_bench: None,
            };
            println!("{}", serde_json::to_string_pretty(&j)?);
        } else {
            println!(
                "mutated {} ({}): {}\nproduction mode: {}\nvalidation mode: {}\n{}",
                o.target,
                o.module,
                o.description,
                o.production,
                o.message,
                if named {
                    format!(
                        "VERDICT: PASS (validation mode caught the mutation in {})",
                        o.module
                    )
                } else {
                    "VERDICT: FAIL (validation mode did not name the mutated module)".into()
                }
            );
        }
        return Ok(if named {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let report = verify(&spec)?;
    let bench = if args.bench_modes {
        Some(bench_modes(&spec, BENCH_REPEATS)?)
    } else {
        None
    };
    emit(args, &report, bench.as_deref())
}

/// Print (and with `--out`, write) the report; the exit status of its verdict.
fn emit(args: &VerifyArgs, report: &VerifyReport, bench: Option<&[ModeBench]>) -> Result<ExitCode> {
    if args.json {
        let j = JsonOut {
            report: Some(report),
            mutation: None,
            mode_bench: bench,
        };
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("{}", render_text(report, bench));
    }
    if let Some(dir) = &args.out {
        write_out(dir, report, bench)?;
        if !args.json {
            println!(
                "wrote {}/verify.html, params.csv, checks.csv{}",
                dir.display(),
                if report.muon.is_some() {
                    ", muon.csv"
                } else {
                    ""
                }
            );
        }
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `--backend mpi` without MPI support compiled in.
#[cfg(not(feature = "mpi"))]
fn run_mpi(_args: &VerifyArgs, _timeout: std::time::Duration) -> Result<ExitCode> {
    anyhow::bail!(
        "this hpfsdp was built without MPI support: rebuild with `cargo build --release --features mpi` \
         (needs an MPI library, mpicc and libclang), then run `mpirun -np <world> target/release/hpfsdp verify ... --backend mpi`"
    )
}

/// Checks every rank makes before any communication; the same outcome on every rank.
#[cfg(feature = "mpi")]
fn mpi_preflight(args: &VerifyArgs, comm: &dyn hpfsdp_backends::Collective) -> Result<VerifySpec> {
    if args.mutate.is_some() || args.bench_modes {
        anyhow::bail!(
            "--mutate and --bench-modes run on the in-process backend only; drop --backend mpi"
        );
    }
    let spec = load(&args.scenario)?;
    hpfsdp_reference::verify::multiprocess::check_world(&spec, comm)
        .with_context(|| format!("{} under mpirun", args.scenario.display()))?;
    Ok(spec)
}

/// `--timeout-s` as a duration: a positive, finite number of seconds up to
/// [`hpfsdp_plan::limits::MAX_COLLECTIVE_TIMEOUT_S`] (checked on every backend, so a bad flag is reported
/// the same way whether or not MPI is compiled in).
fn collective_timeout(seconds: f64) -> Result<std::time::Duration> {
    let max = hpfsdp_plan::limits::MAX_COLLECTIVE_TIMEOUT_S;
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= max) {
        anyhow::bail!(
            "--timeout-s must be a positive number of seconds up to {max} (7 days), got {}",
            // 1e300 in full is 301 digits.
            if seconds.abs() < 1e9 {
                format!("{seconds}")
            } else {
                format!("{seconds:e}")
            }
        );
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// `verify --backend mpi`: this process is one rank; rank 0 prints the report, the others
/// print nothing. A bad scenario or world size is reported by rank 0 (exit 2 on every rank);
/// a failure during the run is printed by the rank that saw it, which then ends the job.
#[cfg(feature = "mpi")]
fn run_mpi(args: &VerifyArgs, timeout: std::time::Duration) -> Result<ExitCode> {
    use hpfsdp_backends::Collective;
    use hpfsdp_backends::mpi::{MpiComm, MpiOptions, ReductionMode};
    let comm = MpiComm::world_with(MpiOptions {
        mode: ReductionMode::Deterministic,
        timeout,
    })?;
    let rank = comm.rank();
    let spec = match mpi_preflight(args, &comm) {
        Ok(s) => s,
        Err(e) => {
            // The same outcome on every rank; rank 0 reports it. mpirun ends the whole job at
            // the first non-zero exit, so no rank leaves before rank 0 has printed.
            if rank == 0 {
                eprintln!("error: {e:#}");
            }
            if let Ok(world) = hpfsdp_backends::Group::world(comm.world_size())
                && let Ok(h) = comm.barrier(&world)
            {
                let _ = h.wait();
            }
            return Ok(ExitCode::from(2));
        }
    };
    match hpfsdp_reference::verify::verify_on(&spec, &comm) {
        Ok(Some(report)) => emit(args, &report, None),
        Ok(None) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!(
                "error (mpi rank {rank} of {}): {} cannot be verified: {e}",
                comm.world_size(),
                args.scenario.display()
            );
            comm.abort(2)
        }
    }
}
