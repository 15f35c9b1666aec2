//! `hpfsdp calibrate`: compare the A3 profile's predictions with the held-in measurements
//! (experiment B, experiment A micro batch 2), optionally fit its calibrated constants, and
//! write the comparison report (`reports/calibration/` by default).

use anyhow::{Context, Result};
use hpfsdp_reports::table::{Section, Table, TableReport, Verdict};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::fit::{FIT_TARGETS, get};
use hpfsdp_sim::calibration::{CalibrationSet, Comparison, Figure, fit};
use std::path::Path;
use std::process::ExitCode;

/// Tolerances the calibration test enforces (and this command reports against).
pub const DIFF_TOLERANCE_PP: f64 = 3.0;
/// Largest allowed relative error of either experiment-B step time.
pub const STEP_TIME_TOLERANCE: f64 = 0.10;

/// Runs the command.
pub fn run(hardware: &str, do_fit: bool, out: &Path) -> Result<ExitCode> {
    let profile = HardwareProfile::load_named(hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let set = CalibrationSet::load(Path::new(".")).context(
        "loading the calibration scenarios (run from the repository root: they live in scenarios/paper/)",
    )?;
    let (comparison, fitted) = if do_fit {
        let outcome = fit(&set, &profile, 6).context("fitting the profile")?;
        println!(
            "fit: objective {:.4} -> {:.4} after {} simulations",
            outcome.objective_before, outcome.objective_after, outcome.evaluations
        );
        for t in FIT_TARGETS {
            let p = t.param;
            println!(
                "  {:<45} {:>10.4} -> {:>10.4}   fitted to {:?}",
                p.key,
                get(&profile, p.key).unwrap_or(f64::NAN),
                get(&outcome.profile, p.key).unwrap_or(f64::NAN),
                t.figure
            );
        }
        (outcome.comparison, true)
    } else {
        (
            set.compare(&profile)
                .context("simulating the calibration runs")?,
            false,
        )
    };
    let report = comparison_report(&comparison, fitted);
    let table = &report.sections[0].table;
    println!("{}", table.to_markdown());
    println!(
        "{}",
        report.verdict.as_ref().map_or("", |v| v.text.as_str())
    );
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let html = out.join("report.html");
    std::fs::write(&html, report.to_html())
        .with_context(|| format!("writing {}", html.display()))?;
    let csv = out.join("comparison.csv");
    std::fs::write(&csv, table.to_csv()).with_context(|| format!("writing {}", csv.display()))?;
    let md = out.join("comparison.md");
    std::fs::write(&md, table.to_markdown())
        .with_context(|| format!("writing {}", md.display()))?;
    println!(
        "wrote {}, {}, {}",
        html.display(),
        csv.display(),
        md.display()
    );
    let passed = report.verdict.as_ref().is_some_and(|v| v.passed);
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn value(figure: Figure, v: f64) -> String {
    match figure {
        Figure::AllGathers
        | Figure::ReduceScatters
        | Figure::DeviceKernels
        | Figure::Collectives => format!("{v:.0}"),
        Figure::OverlapRate => format!("{:.2}%", v * 100.0),
        Figure::AllGatherBytes
        | Figure::ReduceScatterBytes
        | Figure::PeakAllocatedBytes
        | Figure::WeightedBandwidth => {
            format!("{:.3}", v / 1e9)
        }
        _ => format!("{v:.4}"),
    }
}

/// The comparison as a table report with a verdict on the experiment-B tolerances.
pub fn comparison_report(c: &Comparison, fitted: bool) -> TableReport {
    let rows = c
        .rows
        .iter()
        .map(|r| {
            vec![
                r.experiment.to_string(),
                r.run.to_string(),
                r.figure.label().to_string(),
                value(r.figure, r.measured),
                value(r.figure, r.predicted),
                r.relative_error()
                    .map_or("-".into(), |e| format!("{:+.1}%", e * 100.0)),
            ]
        })
        .collect();
    let diff_pp = (c.exp_b_predicted_diff - c.exp_b_measured_diff) * 100.0;
    let step_errors: Vec<f64> = ["PyTorch FSDP2", "HyperParallel-FSDP"]
        .iter()
        .filter_map(|run| c.row(run, Figure::StepTimeS))
        .filter_map(|r| r.relative_error())
        .collect();
    let worst_step = step_errors.iter().fold(0.0f64, |a, e| a.max(e.abs()));
    let passed = diff_pp.abs() <= DIFF_TOLERANCE_PP
        && step_errors.len() == 2
        && worst_step <= STEP_TIME_TOLERANCE;
    TableReport {
        title: format!("Calibration of {} against measured runs", c.profile),
        subtitle: format!(
            "Held-in measurements only (shared/calibration/README.md: experiment B, experiment A micro batch 2). {}",
            if fitted {
                "Constants fitted in this run."
            } else {
                "Profile constants as committed."
            }
        ),
        verdict: Some(Verdict {
            passed,
            text: format!(
                "experiment B step-time difference: predicted {:+.1}% vs measured {:+.1}% ({:+.1} pp, tolerance ±{DIFF_TOLERANCE_PP} pp); worst experiment-B step-time error {:.1}% (tolerance {:.0}%): {}",
                c.exp_b_predicted_diff * 100.0,
                c.exp_b_measured_diff * 100.0,
                diff_pp,
                worst_step * 100.0,
                STEP_TIME_TOLERANCE * 100.0,
                if passed { "PASS" } else { "FAIL" }
            ),
        }),
        sections: vec![Section {
            heading: "Predicted vs measured".into(),
            text: "Counts and payloads are derived from the model and plan, never entered; relative error = predicted / measured - 1.".into(),
            table: Table {
                headers: ["experiment", "run", "figure", "measured", "predicted", "error"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                rows,
            },
        }],
    }
}
