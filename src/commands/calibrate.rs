//! `hpfsdp calibrate`: compare a hardware profile's predictions with measured runs given as
//! data (runs files: `--runs FILE`..., or every shipped runs file of `scenarios/runs/`
//! measured on the profile; the paper's held-in experiments for `ascend-910c-a3`); with `--fit`
//! fit the constants the runs files name jointly, with `--loo` also refit without each
//! experiment and each run; with `--from` fit its curves from measured tables first; write
//! the calibration report (`out/calibration/` by default) and, with `--write-profile`, a
//! new profile file with the fitted values. Without runs for the profile nothing is compared
//! (exit 0, said on stderr) unless `--fit` or `--loo` asked for it (an error).

use super::calibrate_csv as csv;
use super::calibrate_json::json;
use super::calibrate_report::{
    figure_table, flag, host_table, label, loo_tables, page, params_table, starts_table, value,
};
use super::calibrate_runs::{
    PROFILE_DIR, load_profile, nothing_compared, progress, runs_files, scope_line,
};
use super::calibrate_tables::{
    FromTables, apply_tables, sections, sourced_ranges_table, write_gemm_outputs,
};
use anyhow::{Context, Result, bail};
use hpfsdp_reports::table::{Section, Table};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::fit::{FitOutcome, fit_joint};
use hpfsdp_sim::calibration::lm::LmOptions;
use hpfsdp_sim::calibration::loo::{Fold, experiment_holdouts, fold, run_holdouts};
use hpfsdp_sim::calibration::params::SourcedRange;
use hpfsdp_sim::calibration::profile_edit::{Edit, EditValue, apply_edits};
use hpfsdp_sim::calibration::verdict::{Checked, check};
use hpfsdp_sim::calibration::{CalibrationSet, Comparison};
use hpfsdp_sim::profile::BUILTIN_PROFILES;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The command's arguments.
#[derive(Debug, Clone)]
pub struct CalibrateArgs {
    /// Hardware profile: a shipped name or the path of a profile file.
    pub hardware: String,
    /// Runs files to compare with (empty: the shipped ones measured on the profile).
    pub runs: Vec<PathBuf>,
    /// Compare `--runs` files measured on another profile.
    pub any_hardware: bool,
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
    crate::heap::keep_freed_memory();
    let loaded = load_profile(&args.hardware)?;
    let mut profile = loaded.profile;
    crate::commands::preflight::ensure_writable_dir(&args.out, "--out")?;
    if let Some(target) = &args.write_profile {
        check_target(target, loaded.source.as_deref())?;
    }
    let stem = args
        .write_profile
        .as_ref()
        .and_then(|p| p.file_stem())
        .map_or(profile.name.clone(), |s| s.to_string_lossy().into_owned());
    let from = apply_tables(&args.from, &mut profile, &format!("{stem}.gemm.csv"))?;
    let runs = runs_files(&args.runs, &profile.name, args.any_hardware)?;
    if runs.files.is_empty() {
        if args.fit || args.loo {
            bail!(
                "--fit/--loo need measured runs: {}",
                nothing_compared(&profile.name)
            );
        }
        write_outputs(args, &loaded.text, &stem, None, &from)?;
        eprintln!("{}", nothing_compared(&profile.name));
        return Ok(ExitCode::SUCCESS);
    }
    let mut set = CalibrationSet::new(runs.files).context(if runs.explicit {
        "loading the scenarios of the --runs files"
    } else {
        "loading the calibration scenarios (run from the repository root: the shipped runs \
         files in scenarios/runs/ name scenarios beside them)"
    })?;
    let bar = progress(&mut set);
    bar.set_message("simulating the measured runs");
    let options = LmOptions::default();
    let fit = if args.fit {
        bar.set_message("joint fit");
        Some(
            fit_joint(&set, &profile, set.fit_params(), |_| true, &options)
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
        Some(leave_out(&set, &profile, &options, &bar)?)
    } else {
        None
    };
    bar.finish_and_clear();
    let outcome = Outcome {
        set: &set,
        profile: &profile,
        checked: &checked,
        comparison: &comparison,
        fit: fit.as_ref(),
        folds: folds.as_deref(),
        from: &from,
    };
    let passed = report(args, &outcome)?;
    write_outputs(args, &loaded.text, &stem, fit.as_ref(), &from)?;
    eprintln!("{}", scope_line(&profile.name, &set));
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Everything one calibration produced.
struct Outcome<'a> {
    set: &'a CalibrationSet,
    profile: &'a HardwareProfile,
    checked: &'a Checked,
    comparison: &'a Comparison,
    fit: Option<&'a FitOutcome>,
    folds: Option<&'a [Fold]>,
    from: &'a FromTables,
}

/// Every leave-one-out fold: each experiment, then each run of a multi-run experiment, with
/// the fold named on the progress bar.
fn leave_out(
    set: &CalibrationSet,
    profile: &HardwareProfile,
    options: &LmOptions,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Fold>> {
    let holdouts: Vec<_> = experiment_holdouts(set)
        .into_iter()
        .chain(run_holdouts(set))
        .collect();
    let n = holdouts.len();
    let mut folds = Vec::with_capacity(n);
    for (i, left_out) in holdouts.into_iter().enumerate() {
        bar.set_message(format!("leave-one-out {}/{n}: without {left_out}", i + 1));
        let what = if left_out.run.is_some() {
            "leave-one-run-out"
        } else {
            "leave-one-out"
        };
        folds.push(fold(set, profile, set.fit_params(), options, left_out).context(what)?);
    }
    Ok(folds)
}

/// Prints the outcome (tables or JSON) and writes the report; returns the verdict.
fn report(args: &CalibrateArgs, o: &Outcome) -> Result<bool> {
    let ranges = o.set.sourced_ranges();
    let extra = report_sections(o.from, o.profile, o.comparison, ranges);
    let description: Vec<&str> = o
        .set
        .files()
        .iter()
        .map(|f| f.description.trim())
        .filter(|d| !d.is_empty())
        .collect();
    let report = page(
        &o.comparison.profile,
        &description.join(" "),
        o.checked,
        o.fit,
        o.folds,
        extra,
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json(
                (o.checked, o.comparison),
                o.fit,
                o.folds,
                (o.from, &sourced_ranges_table(ranges, o.profile))
            ))?
        );
    } else {
        print_text((o.checked, o.comparison), o.fit, o.folds, &report.report);
        print_sourced_ranges(ranges, o.profile);
    }
    write_report(&args.out, &report, o.checked, o.fit, o.folds, args.json)?;
    Ok(report.report.verdict.as_ref().is_some_and(|v| v.passed))
}

/// Writes the profile with the fitted values (`--write-profile`), or else the GEMM tables
/// `--from` produced beside the report.
fn write_outputs(
    args: &CalibrateArgs,
    text: &str,
    stem: &str,
    fit: Option<&FitOutcome>,
    from: &FromTables,
) -> Result<()> {
    if let Some(target) = &args.write_profile {
        write_profile(target, text, stem, fit, from, args.json)?;
    } else if !from.gemm_outputs.is_empty() {
        let written = write_gemm_outputs(from, &args.out)?;
        eprintln!(
            "wrote {} (pass --write-profile FILE to also write a profile pointing at it)",
            written
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// The report's extra sections: the host model per run, the unfitted constants with public
/// ranges, then what `--from` tables gave.
fn report_sections(
    from: &FromTables,
    profile: &HardwareProfile,
    comparison: &Comparison,
    ranges: &[SourcedRange],
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
               measurements confine them (the runs files' [[sourced_range]] entries)."
            .into(),
        table: sourced_ranges_table(ranges, profile),
    };
    let ranges = (!ranges.table.rows.is_empty()).then_some(ranges);
    std::iter::once(host)
        .chain(ranges)
        .chain(sections(from, profile))
        .collect()
}

/// Prints the unfitted constants' public ranges without their sources (the report has them).
fn print_sourced_ranges(ranges: &[SourcedRange], profile: &HardwareProfile) {
    if ranges.is_empty() {
        return;
    }
    let ranges = sourced_ranges_table(ranges, profile);
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
                    &p.param.key,
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
                    &r.row.run,
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
        (
            out.join("comparison.csv"),
            csv::comparison(checked).to_csv(),
        ),
        (out.join("comparison.md"), report.report.to_markdown()),
    ];
    if let Some(f) = fit {
        files.push((out.join("constants.csv"), csv::constants(f).to_csv()));
    }
    if let Some(folds) = folds {
        files.push((out.join("loo.csv"), csv::loo(folds).to_csv()));
        files.push((
            out.join("loo-figures.csv"),
            csv::loo_figures(folds).to_csv(),
        ));
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
