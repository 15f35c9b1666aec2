//! `hpfsdp calibrate`: compare a hardware profile's predictions with the held-in measurements
//! (experiment B, experiment A micro batch 2); with `--fit` fit its residual constants jointly,
//! with `--loo` also refit without each experiment; with `--from` fit its curves from measured
//! tables first; write the calibration report (`reports/calibration/` by default) and, with
//! `--write-profile`, a new profile file with the fitted values.

use super::calibrate_report::{
    figure_table, flag, host_table, label, loo_tables, page, params_table, starts_table, value,
};
use super::calibrate_tables::{
    FromTables, apply_tables, sections, sourced_ranges_table, write_gemm_outputs,
};
use anyhow::{Context, Result, bail};
use hpfsdp_reports::table::{Section, Table};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::fit::{FitOutcome, fit_joint};
use hpfsdp_sim::calibration::lm::LmOptions;
use hpfsdp_sim::calibration::loo::{Fold, leave_one_out, leave_one_run_out};
use hpfsdp_sim::calibration::params::FIT_PARAMS;
use hpfsdp_sim::calibration::profile_edit::{Edit, EditValue, apply_edits};
use hpfsdp_sim::calibration::verdict::{Checked, check};
use hpfsdp_sim::calibration::{CalibrationSet, Comparison};
use hpfsdp_sim::profile::BUILTIN_PROFILES;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Directory of the shipped profiles.
const PROFILE_DIR: &str = "scenarios/hardware";

/// The command's arguments.
#[derive(Debug, Clone)]
pub struct CalibrateArgs {
    /// Hardware profile name.
    pub hardware: String,
    /// Joint fit of the residual constants.
    pub fit: bool,
    /// Leave-one-out refits.
    pub loo: bool,
    /// Measured tables to fit the profile's curves from.
    pub from: Vec<PathBuf>,
    /// Where to write the profile with the fitted values.
    pub write_profile: Option<PathBuf>,
    /// Report directory.
    pub out: PathBuf,
    /// Print JSON instead of tables.
    pub json: bool,
}

/// The profile's TOML text and where it came from (a file, or the built-in copy).
fn profile_text(name: &str) -> Result<(String, Option<PathBuf>)> {
    let path = Path::new(PROFILE_DIR).join(format!("{name}.toml"));
    if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        return Ok((text, Some(path)));
    }
    BUILTIN_PROFILES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| (t.to_string(), None))
        .with_context(|| format!("no hardware profile '{name}'"))
}

/// Refuses to overwrite the profile being calibrated or any shipped profile (a file of
/// `scenarios/hardware/` named after a built-in profile).
fn check_target(target: &Path, source: Option<&Path>) -> Result<()> {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    if let (Some(src), true) = (source, target.exists())
        && canon(src) == canon(target)
    {
        bail!(
            "--write-profile {} is the profile being calibrated; write to a new file and \
             review it before replacing the shipped one",
            target.display()
        );
    }
    let in_shipped_dir = target.exists()
        && canon(Path::new(PROFILE_DIR)).is_some_and(|dir| {
            canon(target.parent().unwrap_or(Path::new("."))).as_ref() == Some(&dir)
        });
    let shipped_name = target
        .file_stem()
        .is_some_and(|s| BUILTIN_PROFILES.iter().any(|(n, _)| s == *n));
    if in_shipped_dir && shipped_name {
        bail!(
            "--write-profile {} would overwrite a shipped profile in {PROFILE_DIR}/; choose a \
             new file name",
            target.display()
        );
    }
    Ok(())
}

/// Runs the command.
pub fn run(args: &CalibrateArgs) -> Result<ExitCode> {
    crate::commands::preflight::check_hardware_flag(&args.hardware)?;
    let mut profile = HardwareProfile::load_named(&args.hardware, PROFILE_DIR)
        .with_context(|| format!("loading hardware profile '{}'", args.hardware))?;
    let (text, source) = profile_text(&args.hardware)?;
    crate::commands::preflight::ensure_writable_dir(&args.out, "--out")?;
    if let Some(target) = &args.write_profile {
        check_target(target, source.as_deref())?;
    }
    let stem = args
        .write_profile
        .as_ref()
        .and_then(|p| p.file_stem())
        .map_or(args.hardware.clone(), |s| s.to_string_lossy().into_owned());
    let from = apply_tables(&args.from, &mut profile, &format!("{stem}.gemm.csv"))?;
    let set = CalibrationSet::load(Path::new(".")).context(
        "loading the calibration scenarios (run from the repository root: they live in scenarios/paper/)",
    )?;
    let options = LmOptions::default();
    let fit = if args.fit {
        Some(
            fit_joint(&set, &profile, &FIT_PARAMS, |_| true, &options)
                .context("fitting the profile's residual constants")?,
        )
    } else {
        None
    };
    let comparison: Comparison = match &fit {
        Some(f) => f.comparison.clone(),
        None => set
            .compare(&profile)
            .context("simulating the calibration runs")?,
    };
    let checked = check(&comparison, fit.is_some());
    let folds = if args.loo {
        let mut folds =
            leave_one_out(&set, &profile, &FIT_PARAMS, &options).context("leave-one-out")?;
        folds.extend(
            leave_one_run_out(&set, &profile, &FIT_PARAMS, &options)
                .context("leave-one-run-out")?,
        );
        Some(folds)
    } else {
        None
    };
    let extra = report_sections(&from, &profile, &comparison);
    let report = page(
        &comparison.profile,
        &checked,
        fit.as_ref(),
        folds.as_deref(),
        extra,
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json(
                (&checked, &comparison),
                fit.as_ref(),
                folds.as_deref(),
                (&from, &sourced_ranges_table(&profile))
            ))?
        );
    } else {
        print_text(
            (&checked, &comparison),
            fit.as_ref(),
            folds.as_deref(),
            &report.report,
        );
        print_sourced_ranges(&profile);
    }
    write_report(
        &args.out,
        &report,
        &checked,
        fit.as_ref(),
        folds.as_deref(),
        args.json,
    )?;
    if let Some(target) = &args.write_profile {
        write_profile(target, &text, &stem, fit.as_ref(), &from, args.json)?;
    } else if !from.gemm_outputs.is_empty() {
        let written = write_gemm_outputs(&from, &args.out)?;
        eprintln!(
            "wrote {} (pass --write-profile FILE to also write a profile pointing at it)",
            written
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let passed = report.report.verdict.as_ref().is_some_and(|v| v.passed);
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The report's extra sections: the host model per run, the unfitted constants with public
/// ranges, then what `--from` tables gave.
fn report_sections(
    from: &FromTables,
    profile: &HardwareProfile,
    comparison: &Comparison,
) -> Vec<Section> {
    let host = Section {
        heading: "Host model".into(),
        text: "Rank 0's launches by class, the host seconds each class costs at the profile's \
               constants (sim/src/host_cost.rs), and the critical rank's host busy time against \
               the step: a run whose host is busy for most of its step is host-bound."
            .into(),
        table: host_table(comparison),
    };
    let ranges = Section {
        heading: "Unfitted constants with public ranges".into(),
        text: "Constants no held-in figure isolates, so the fit leaves them alone; public \
               measurements confine them (sim/src/calibration/params.rs SOURCED_RANGES)."
            .into(),
        table: sourced_ranges_table(profile),
    };
    [host, ranges]
        .into_iter()
        .chain(sections(from, profile))
        .collect()
}

/// Prints the unfitted constants' public ranges without their sources (the report has them).
fn print_sourced_ranges(profile: &HardwareProfile) {
    let ranges = sourced_ranges_table(profile);
    let cut = |r: &Vec<String>| r[..r.len() - 1].to_vec();
    let brief = Table {
        headers: cut(&ranges.headers),
        rows: ranges.rows.iter().map(cut).collect(),
    };
    println!(
        "unfitted constants with public ranges (sources in the report):\n{}",
        brief.to_markdown()
    );
}

fn print_text(
    (checked, comparison): (&Checked, &Comparison),
    fit: Option<&FitOutcome>,
    folds: Option<&[Fold]>,
    report: &hpfsdp_reports::TableReport,
) {
    if let Some(f) = fit {
        println!(
            "joint fit (MAP): cost {:.4} -> {:.4} (figures {:.4} + priors {:.4}) after {} iterations, {} simulations",
            f.cost_start, f.cost, f.data_cost, f.prior_cost, f.iterations, f.evaluations
        );
        for p in &f.params {
            if p.at_bound.is_some() {
                println!(
                    "FLAG: {} = {:.4} is {} [{}, {}]: {}",
                    p.param.key,
                    p.value,
                    flag(p),
                    p.param.min,
                    p.param.max,
                    p.param
                        .bound_source
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
        println!("{}", without_sources(&params_table(f)).to_markdown());
        println!("starts:\n{}", starts_table(f).to_markdown());
        if let Some(folds) = folds {
            for fold in folds {
                println!(
                    "constants without {} (MAP cost {:.4} = figures {:.4} + priors {:.4}):\n{}",
                    fold.left_out,
                    fold.fit.cost,
                    fold.fit.data_cost,
                    fold.fit.prior_cost,
                    without_sources(&params_table(&fold.fit)).to_markdown()
                );
                println!(
                    "starts without {}:\n{}",
                    fold.left_out,
                    starts_table(&fold.fit).to_markdown()
                );
            }
        }
    }
    println!("{}", figure_table(checked).to_markdown());
    println!(
        "host model (rank 0 launches by class, host seconds at the profile's constants; host busy of the critical rank vs the step):\n{}",
        host_table(comparison).to_markdown()
    );

    if let Some(folds) = folds {
        let (summary, _) = loo_tables(folds);
        println!("leave-one-out:\n{}", summary.to_markdown());
        for fold in folds {
            for r in fold.held_out.rows.iter().filter(|r| r.gating && !r.passed) {
                println!(
                    "  {} left out: {} {} measured {} predicted {} ({})",
                    fold.left_out,
                    r.row.run,
                    label(r.row.figure),
                    value(r.row.figure, r.row.measured),
                    value(r.row.figure, r.row.predicted),
                    r.row
                        .relative_error()
                        .map_or("-".into(), |e| format!("{:+.1}%", e * 100.0)),
                );
            }
        }
    }
    for s in report
        .sections
        .iter()
        .filter(|s| s.heading.starts_with("Tier fits"))
    {
        println!("{}\n{}", s.heading, s.table.to_markdown());
    }
    if let Some(v) = &report.verdict {
        println!("{}: {}", if v.passed { "PASS" } else { "FAIL" }, v.text);
    }
}

/// The constants table without its two source columns (bounds, prior): the terminal view.
fn without_sources(t: &Table) -> Table {
    let cut = |r: &Vec<String>| r[..r.len().saturating_sub(2)].to_vec();
    Table {
        headers: cut(&t.headers),
        rows: t.rows.iter().map(cut).collect(),
    }
}

fn write_report(
    out: &Path,
    report: &hpfsdp_reports::CalibrationPage,
    checked: &Checked,
    fit: Option<&FitOutcome>,
    folds: Option<&[Fold]>,
    quiet: bool,
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut files: Vec<(PathBuf, String)> = vec![
        (out.join("report.html"), report.to_html()),
        (out.join("comparison.csv"), figure_table(checked).to_csv()),
        (out.join("comparison.md"), report.report.to_markdown()),
    ];
    if let Some(f) = fit {
        files.push((out.join("constants.csv"), params_table(f).to_csv()));
    }
    if let Some(folds) = folds {
        let (summary, detail) = loo_tables(folds);
        files.push((out.join("loo.csv"), summary.to_csv()));
        files.push((out.join("loo-figures.csv"), detail.to_csv()));
    }
    for (path, text) in &files {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
    if quiet {
        eprintln!("wrote {}", names.join(", "));
    } else {
        println!("wrote {}", names.join(", "));
    }
    Ok(())
}

fn write_profile(
    target: &Path,
    text: &str,
    stem: &str,
    fit: Option<&FitOutcome>,
    from: &FromTables,
    quiet: bool,
) -> Result<()> {
    let mut edits = vec![Edit {
        key: "name".into(),
        value: EditValue::Text(stem.to_string()),
        comment: "named after its file (hpfsdp --hardware NAME loads NAME.toml)".into(),
    }];
    edits.extend(from.edits.iter().cloned());
    if let Some(f) = fit {
        for p in &f.params {
            edits.push(Edit {
                key: p.param.key.to_string(),
                value: EditValue::Number(p.value),
                comment: format!(
                    "FITTED jointly (MAP) by `hpfsdp calibrate --fit` (prior {} x/ {:.2}, data share {:.2}; bounds [{}, {}]{})",
                    p.param.prior.centre,
                    p.param.prior.log_width.exp(),
                    p.data_share,
                    p.param.min,
                    p.param.max,
                    if p.at_bound.is_some() {
                        "; AT A BOUND"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    let new = apply_edits(text, &target.display().to_string(), &edits)?;
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(target, new).with_context(|| format!("writing {}", target.display()))?;
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let gemm = write_gemm_outputs(from, dir)?;
    let mut names = vec![target.display().to_string()];
    names.extend(gemm.iter().map(|p| p.display().to_string()));
    let line = format!("wrote profile {}", names.join(", "));
    if quiet {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(())
}

fn json(
    (checked, comparison): (&Checked, &Comparison),
    fit: Option<&FitOutcome>,
    folds: Option<&[Fold]>,
    (from, ranges): (&FromTables, &Table),
) -> serde_json::Value {
    use serde_json::json;
    let rows: Vec<_> = checked
        .rows
        .iter()
        .map(|r| {
            json!({
                "experiment": r.row.experiment, "run": r.row.run,
                "figure": format!("{:?}", r.row.figure),
                "measured": r.row.measured, "predicted": finite(r.row.predicted),
                "relative_error": r.row.relative_error().and_then(finite),
                "fitted": r.fitted, "gating": r.gating, "passed": r.passed,
                "tolerance": r.tolerance.label(),
            })
        })
        .collect();
    let params = |f: &FitOutcome| -> Vec<serde_json::Value> {
        f.params
            .iter()
            .map(|p| {
                json!({"key": p.param.key, "start": p.start, "value": p.value,
                       "min": p.param.min, "max": p.param.max, "flag": flag(p),
                       "bound_source": p.param.bound_source,
                       "prior_centre": p.param.prior.centre,
                       "prior_log_width": p.param.prior.log_width,
                       "prior_sigmas": p.prior_sigmas, "data_share": p.data_share,
                       "identified_by_data": p.identified(),
                       "prior_source": p.param.prior.source})
            })
            .collect()
    };
    let tiers: Vec<_> = from
        .collective_fits
        .iter()
        .flat_map(|(file, fits)| fits.tiers.iter().map(move |f| (file, f)))
        .map(|(file, f)| {
            json!({"file": file, "tier": format!("{:?}", f.tier), "latency_us": f.latency_us,
                   "efficiency": f.efficiency, "efficiency_at_bound": f.efficiency_at_bound,
                   "latency_at_bound": f.latency_at_bound,
                   "rms_relative_error": f.rms_relative_error()})
        })
        .collect();
    let unaligned: Vec<_> = from
        .collective_fits
        .iter()
        .filter_map(|(file, fits)| fits.unaligned.as_ref().map(|u| (file, u)))
        .map(|(file, u)| {
            json!({"file": file, "unaligned_bandwidth_factor": u.factor,
                   "at_bound": u.at_bound, "rows": u.rows.len(),
                   "rms_relative_error": u.rms_relative_error()})
        })
        .collect();
    json!({
        "passed": checked.passed && folds.is_none_or(|f| f.iter().all(|f| f.held_out.passed)),
        "exp_b_diff_error_pp": checked.exp_b_diff_error_pp,
        "rows": rows,
        "fit": fit.map(|f| json!({"cost_start": f.cost_start, "cost": f.cost,
                                  "data_cost": f.data_cost, "prior_cost": f.prior_cost,
            "iterations": f.iterations, "evaluations": f.evaluations, "params": params(f),
            "starts": f.starts.iter().map(|s| json!({"label": s.label, "start": s.start,
                "end": s.end, "cost_start": s.cost_start, "cost": s.cost,
                "iterations": s.iterations})).collect::<Vec<_>>()})),
        "loo": folds.map(|folds| folds.iter().map(|f| json!({
            "left_out": f.left_out.to_string(), "left_out_experiment": f.left_out.experiment, "left_out_run": f.left_out.run, "params": params(&f.fit), "passed": f.held_out.passed,
            "rms_log_error": finite(f.rms_log_error()),
        })).collect::<Vec<_>>()),
        "tier_fits": tiers,
        "unaligned_fits": unaligned,
        "sourced_ranges": ranges.rows.iter().map(|r| json!({"key": r[0], "value": r[1].parse::<f64>().ok(),
            "range": r[2], "verdict": r[3], "source": r[4]})).collect::<Vec<_>>(),
        "host": comparison.host.iter().map(|h| {
            let [kernel_s, unmodelled_s, cpu_event_s, collective_s, sync_s, validation_s] =
                h.class_s();
            json!({"experiment": h.experiment, "run": h.run, "kernels": h.totals.kernels,
                "cpu_events": h.totals.cpu_events, "cpu_events_floor": h.totals.floor_events,
                "cpu_event_s": cpu_event_s,
                "collectives": h.totals.collectives, "d2h_syncs": h.totals.d2h_syncs,
                "validation_events": h.totals.validation_events,
                "kernel_launch_s": kernel_s, "unmodelled_per_kernel_s": unmodelled_s,
                "collective_launch_s": collective_s,
                "d2h_sync_s": sync_s, "validation_s": validation_s,
                "host_busy_s": h.host_busy_s, "step_s": h.step_s})
        }).collect::<Vec<_>>(),
    })
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}
