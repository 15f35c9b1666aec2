//! The calibration report of `hpfsdp calibrate`: fitted constants with bounds and at-bound
//! flags, every figure's residual with its tolerance and pass/fail (fitted rows marked
//! "fitted", derived rows "predicted"), the leave-one-out table, the predicted-vs-measured
//! chart, and a banner that is green only when every gating row passes (in-sample and, with
//! `--loo`, in every left-out experiment).

use super::calibrate_tables::strings;
use hpfsdp_reports::CalibrationPage;
use hpfsdp_reports::calibration_chart::ErrorBar;
use hpfsdp_reports::table::{Section, Table, TableReport, Verdict};
use hpfsdp_reports::units::BYTES_PER_GIB;
use hpfsdp_sim::calibration::Figure;
use hpfsdp_sim::calibration::fit::{AtBound, FitOutcome, FittedParam, is_fitted_row, log_residual};
use hpfsdp_sim::calibration::gates::Tolerance;
use hpfsdp_sim::calibration::loo::Fold;
use hpfsdp_sim::calibration::verdict::{Checked, CheckedRow};

/// A figure value in the unit its [`label`] names: sizes in GiB (binary, the reports'
/// convention, `hpfsdp_reports::units`), bandwidth in GB/s (decimal, as link data sheets
/// quote it).
pub fn value(figure: Figure, v: f64) -> String {
    if !figure.modelled() && v.is_nan() {
        return NOT_MODELLED.into();
    }
    match figure {
        Figure::AllGathers
        | Figure::ReduceScatters
        | Figure::DeviceKernels
        | Figure::Collectives
        | Figure::ValidationCpuEvents => format!("{v:.0}"),
        Figure::OverlapRate => format!("{:.2}%", v * 100.0),
        Figure::AllGatherBytes
        | Figure::ReduceScatterBytes
        | Figure::PeakAllocatedBytes
        | Figure::PeakReservedBytes => {
            format!("{:.3}", v / BYTES_PER_GIB)
        }
        Figure::WeightedBandwidth => format!("{:.3}", v / 1e9),
        _ => format!("{v:.4}"),
    }
}

/// A figure's label with the unit [`value`] prints: the simulator's size labels say `(GB)`;
/// sizes are shown in GiB here, so the label says `(GiB)`.
pub fn label(figure: Figure) -> String {
    figure.label().replace("(GB)", "(GiB)")
}

/// The at-bound / identification flag of a fitted constant ("-" when none).
pub fn flag(p: &FittedParam) -> &'static str {
    match (p.at_bound, p.unidentified) {
        (Some(AtBound::Lower), _) => "AT LOWER BOUND",
        (Some(AtBound::Upper), _) => "AT UPPER BOUND",
        (None, true) => "no figure depends on it (prior)",
        (None, false) => "-",
    }
}

/// What a report shows for a figure the simulator does not predict.
pub const NOT_MODELLED: &str = "not modelled";

fn result_word(r: &CheckedRow) -> &'static str {
    if !r.row.figure.modelled() {
        return NOT_MODELLED;
    }
    match (r.passed, r.gating) {
        (true, _) => "pass",
        (false, true) => "FAIL",
        (false, false) => "out (not gating)",
    }
}

/// The host model's figures of every run: rank 0's launches by class, the host seconds each
/// class costs, and host busy time against the step (host-bound when they are close).
/// Columns: device kernels; production CPU operator events (`cpu events`; the JSON output
/// also gives how many come from ops without a census, one per kernel); collective calls; device -> host
/// syncs (`syncs`); validation-mode events; then seconds per class: kernel launches, the unmodelled
/// residual per kernel, production events, collective launches, syncs, validation events.
pub fn host_table(c: &hpfsdp_sim::calibration::Comparison) -> Table {
    let headers = [
        "experiment",
        "run",
        "kernels",
        "cpu events",
        "collectives",
        "syncs",
        "val. events",
        "launch (s)",
        "unmodelled (s)",
        "cpu events (s)",
        "coll. launch (s)",
        "sync (s)",
        "val. (s)",
        "host busy (s)",
        "step (s)",
    ]
    .map(String::from)
    .to_vec();
    let rows = c
        .host
        .iter()
        .map(|h| {
            let t = &h.totals;
            let mut row = vec![
                h.experiment.to_string(),
                h.run.to_string(),
                t.kernels.to_string(),
                t.cpu_events.to_string(),
                t.collectives.to_string(),
                t.d2h_syncs.to_string(),
                t.validation_events.to_string(),
            ];
            row.extend(h.class_s().iter().map(|s| format!("{s:.4}")));
            row.push(format!("{:.4}", h.host_busy_s));
            row.push(format!("{:.4}", h.step_s));
            row
        })
        .collect();
    Table { headers, rows }
}

/// One row per start of the joint fit: its cost before and after, its iterations and the
/// constants it ended at (the kept start is marked).
pub fn starts_table(fit: &FitOutcome) -> Table {
    let best = fit
        .starts
        .iter()
        .position(|s| s.cost == fit.cost)
        .unwrap_or(0);
    let mut header = vec![
        "start".to_string(),
        "cost before".into(),
        "cost after".into(),
        "iterations".into(),
    ];
    header.extend(fit.params.iter().map(|p| p.param.key.to_string()));
    let rows = fit
        .starts
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut row = vec![
                if i == best {
                    format!("{} (kept)", s.label)
                } else {
                    s.label.to_string()
                },
                format!("{:.4}", s.cost_start),
                format!("{:.4}", s.cost),
                s.iterations.to_string(),
            ];
            row.extend(
                s.start
                    .iter()
                    .zip(&s.end)
                    .map(|(a, b)| format!("{a:.4} -> {b:.4}")),
            );
            row
        })
        .collect();
    Table {
        headers: header,
        rows,
    }
}

/// The relative error of a row as a report shows it (`+2.6%`; `-` when the measurement is
/// zero or the figure is not predicted).
pub fn error_cell(row: &hpfsdp_sim::calibration::FigureRow) -> String {
    match row.relative_error() {
        Some(e) if e.is_finite() => format!("{:+.1}%", e * 100.0),
        Some(e) if row.figure.modelled() => format!("{:+.1}%", e * 100.0),
        _ => "-".into(),
    }
}

/// Every figure row: role, measured, predicted, error, log residual, tolerance, result.
pub fn figure_table(checked: &Checked) -> Table {
    let rows = checked
        .rows
        .iter()
        .map(|r| {
            let row = &r.row;
            vec![
                row.experiment.to_string(),
                row.run.to_string(),
                label(row.figure),
                if r.fitted { "fitted" } else { "predicted" }.to_string(),
                value(row.figure, row.measured),
                value(row.figure, row.predicted),
                error_cell(row),
                if is_fitted_row(row) {
                    format!("{:+.4}", log_residual(row))
                } else {
                    "-".into()
                },
                r.tolerance.label(),
                if r.gating { "gate" } else { "info" }.to_string(),
                result_word(r).to_string(),
            ]
        })
        .collect();
    Table {
        headers: strings(&[
            "experiment",
            "run",
            "figure",
            "row",
            "measured",
            "predicted",
            "error",
            "log residual",
            "tolerance",
            "gating",
            "result",
        ]),
        rows,
    }
}

/// The fitted constants: start, fitted, bounds, prior (centre and one-sigma factor), the
/// fitted value's distance from the prior in sigmas, the data share (fraction of the prior
/// variance the figures removed) and who sets the value (the figures or the prior), the
/// bound flag, then the sources of the bounds and of the prior (the last two columns).
pub fn params_table(fit: &FitOutcome) -> Table {
    let rows = fit
        .params
        .iter()
        .map(|p| {
            let prior = &p.param.prior;
            vec![
                p.param.key.to_string(),
                format!("{:.4}", p.start),
                format!("{:.4}", p.value),
                format!("{:.4}", p.param.min),
                format!("{:.4}", p.param.max),
                format!("{:.4} x/ {:.2}", prior.centre, prior.log_width.exp()),
                format!("{:+.2}", p.prior_sigmas),
                format!("{:.2}", p.data_share),
                if p.identified() { "data" } else { "prior" }.to_string(),
                flag(p).to_string(),
                one_line(&p.param.bound_source),
                one_line(&prior.source),
            ]
        })
        .collect();
    Table {
        headers: strings(&[
            "constant",
            "start",
            "fitted",
            "min",
            "max",
            "prior (centre x/ one-sigma factor)",
            "fitted vs prior (sigmas)",
            "data share",
            "set by",
            "flag",
            "bound source",
            "prior source",
        ]),
        rows,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The profile constants measured on a fold's left-out experiment, with the blind value the
/// fold used instead, or "-".
fn blinded(fold: &Fold) -> String {
    if fold.blinded.is_empty() {
        return "-".into();
    }
    fold.blinded
        .iter()
        .map(|m| {
            let key = m.key.rsplit('.').next().unwrap_or(&m.key);
            format!("{key}={}", m.blind_value)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The keys (last segment) of the constants the data did not identify (data share below
/// one half), or "-".
fn prior_dominated(fit: &FitOutcome) -> String {
    let keys: Vec<&str> = fit
        .params
        .iter()
        .filter(|p| !p.identified())
        .map(|p| p.param.key.rsplit('.').next().unwrap_or(&p.param.key))
        .collect();
    if keys.is_empty() {
        "-".into()
    } else {
        keys.join(", ")
    }
}

fn compact_params(fit: &FitOutcome) -> String {
    fit.params
        .iter()
        .map(|p| {
            let key = p.param.key.rsplit('.').next().unwrap_or(&p.param.key);
            let mark = match p.at_bound {
                Some(_) => "*",
                None => "",
            };
            format!("{key}={:.4}{mark}", p.value)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Leave-one-out: one summary row per fold, then every left-out figure.
pub fn loo_tables(folds: &[Fold]) -> (Table, Table) {
    let summary = folds
        .iter()
        .map(|f| {
            let gating: Vec<_> = f.held_out.rows.iter().filter(|r| r.gating).collect();
            let passed = gating.iter().filter(|r| r.passed).count();
            vec![
                f.left_out.to_string(),
                compact_params(&f.fit),
                prior_dominated(&f.fit),
                blinded(f),
                format!(
                    "{:.4} ({:.4} + {:.4})",
                    f.fit.cost, f.fit.data_cost, f.fit.prior_cost
                ),
                format!("{:.3}", f.rms_log_error()),
                format!("{passed} / {}", gating.len()),
                if f.held_out.passed { "pass" } else { "FAIL" }.to_string(),
            ]
        })
        .collect();
    let detail = folds
        .iter()
        .flat_map(|f| f.held_out.rows.iter().map(move |r| (&f.left_out, r)))
        .map(|(left_out, r)| {
            vec![
                left_out.to_string(),
                r.row.run.to_string(),
                label(r.row.figure),
                value(r.row.figure, r.row.measured),
                value(r.row.figure, r.row.predicted),
                error_cell(&r.row),
                r.tolerance.label(),
                result_word(r).to_string(),
            ]
        })
        .collect();
    (
        Table {
            headers: strings(&[
                "left out",
                "constants fitted without it (* = at a bound)",
                "left at their prior (data share < 0.5)",
                "measured constants replaced (blind value)",
                "fit cost (figures + priors)",
                "rms ln(predicted / measured) of the left-out fitted figures",
                "gating rows within tolerance",
                "result",
            ]),
            rows: summary,
        },
        Table {
            headers: strings(&[
                "left out",
                "run",
                "figure",
                "measured",
                "predicted",
                "error",
                "tolerance",
                "result",
            ]),
            rows: detail,
        },
    )
}

/// The verdict: passed only when every gating row passes in-sample and in every fold.
pub fn verdict(checked: &Checked, folds: Option<&[Fold]>) -> Verdict {
    let gating = checked.rows.iter().filter(|r| r.gating).count();
    let failures: Vec<String> = checked
        .failures()
        .map(|r| format!("{} {}", r.row.run, label(r.row.figure)))
        .collect();
    let mut text = format!(
        "{} of {gating} gating figures within tolerance",
        gating - failures.len()
    );
    for d in &checked.differences {
        if let Some(e) = d.error_pp() {
            text.push_str(&format!(
                "; {} off by {e:+.1} pp (tolerance ±{} pp)",
                d.difference.label, d.difference.tolerance_pp
            ));
        }
    }
    if !failures.is_empty() {
        text.push_str(&format!("; out of tolerance: {}", failures.join(", ")));
    }
    let mut passed = checked.passed;
    if let Some(folds) = folds {
        let failed: Vec<String> = folds
            .iter()
            .filter(|f| !f.held_out.passed)
            .map(|f| f.left_out.to_string())
            .collect();
        passed &= failed.is_empty();
        if failed.is_empty() {
            text.push_str("; leave-one-out: every left-out experiment and run within tolerance");
        } else {
            text.push_str(&format!(
                "; leave-one-out: out of tolerance when left out: {}",
                failed.join(", ")
            ));
        }
    }
    Verdict { passed, text }
}

/// Chart bars of every row with a non-zero measurement.
pub fn bars(checked: &Checked) -> Vec<ErrorBar> {
    checked
        .rows
        .iter()
        .filter(|r| r.row.measured != 0.0 && r.row.figure.modelled())
        .map(|r| ErrorBar {
            label: format!("{}: {}", r.row.run, label(r.row.figure)),
            relative_error: r.row.relative_error().unwrap_or(f64::NAN),
            tolerance: Some(match r.tolerance {
                Tolerance::Relative(t) => t,
                Tolerance::AbsoluteFraction(t) => t / r.row.measured.abs(),
            }),
            passed: r.passed,
        })
        .collect()
}

/// The whole page.
pub fn page(
    profile: &str,
    description: &str,
    checked: &Checked,
    fit: Option<&FitOutcome>,
    folds: Option<&[Fold]>,
    extra: Vec<Section>,
) -> CalibrationPage {
    let mut sections = Vec::new();
    if let Some(fit) = fit {
        sections.push(Section {
            heading: "Fitted constants".into(),
            text: format!(
                "Joint bounded MAP fit on the log residuals of every fitted figure plus one \
                 prior residual per constant (the runs files' [[fit]] entries): \
                 cost {:.4} -> {:.4} (figures {:.4} + priors {:.4}) in {} iterations ({} \
                 simulations of the measured runs). Data share: the fraction of a constant's \
                 prior variance the figures removed; below 0.5 the prior sets it. A constant \
                 at a bound means the measurements want a value its bound's measurement rules \
                 out: a modelling gap, not a constant to move.",
                fit.cost_start,
                fit.cost,
                fit.data_cost,
                fit.prior_cost,
                fit.iterations,
                fit.evaluations
            ),
            table: params_table(fit),
        });
        sections.push(Section {
            heading: "Fit starts".into(),
            text: "Every start of the joint fit (the profile's values, the log-midpoint of every \
                   bound, the host-bound start with the unmodelled host work at 90% of its \
                   bound, and the priors), its cost before and after and the constants it ended \
                   at; the lowest final cost is kept."
                .into(),
            table: starts_table(fit),
        });
    }
    sections.push(Section {
        heading: "Every figure".into(),
        text: "fitted = in the least squares; predicted = derived (counts, payloads, memory) \
               or not fitted in this run; not modelled = measured, but the simulator has no \
               model of it. Tolerances and gating: each figure's default rule \
               (sim/src/calibration/gates.rs) unless its runs file overrides it."
            .into(),
        table: figure_table(checked),
    });
    if let Some(folds) = folds {
        let (summary, detail) = loo_tables(folds);
        sections.push(Section {
            heading: "Leave-one-out".into(),
            text: "Each experiment left out in turn, then each run of an experiment with \
                   several runs (`B / PyTorch FSDP2`: fitted on its sibling run and the other \
                   experiments, the question a plan change asks): the constants are refitted \
                   (MAP) on the rest, starting from the priors, the bound midpoints and the \
                   host-bound start, never from the profile's fitted values, with bounds and \
                   measured constants that use none of the left-out experiment's \
                   measurements; what was left out is predicted with them."
                .into(),
            table: summary,
        });
        sections.push(Section {
            heading: "Leave-one-out: every left-out figure".into(),
            text: String::new(),
            table: detail,
        });
        for fold in folds {
            sections.push(Section {
                heading: format!("Leave-one-out: constants fitted without {}", fold.left_out),
                text: format!(
                    "MAP cost {:.4} (figures {:.4} + priors {:.4}); set by = who sets each \
                     constant in this fold.",
                    fold.fit.cost, fold.fit.data_cost, fold.fit.prior_cost
                ),
                table: params_table(&fold.fit),
            });
        }
    }
    sections.extend(extra);
    CalibrationPage {
        report: TableReport {
            title: format!("Calibration of {profile} against measured runs"),
            subtitle: format!(
                "{description} {} Sizes in GiB (2^30 B), bandwidth in GB/s (10^9 B/s).",
                if fit.is_some() {
                    "Constants fitted in this run."
                } else {
                    "Profile constants as committed."
                }
            ),
            verdict: Some(verdict(checked, folds)),
            sections,
        },
        bars: bars(checked),
    }
}
