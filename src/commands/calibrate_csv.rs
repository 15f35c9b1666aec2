//! The CSV files of `hpfsdp calibrate` (`comparison.csv`, `constants.csv`, `loo.csv`,
//! `loo-figures.csv`): plain numbers in base units (seconds, bytes, counts, fractions; a
//! fitted constant in the unit its key names), the unit in the header or in a `unit`
//! column, `true`/`false` for flags and an empty cell for a value that does not exist (a
//! figure not predicted, a relative error of a zero measurement). The Markdown and HTML
//! report show the same rows as display strings.

use hpfsdp_reports::table::Table;
use hpfsdp_sim::calibration::FigureRow;
use hpfsdp_sim::calibration::fit::{AtBound, FitOutcome, is_fitted_row, log_residual};
use hpfsdp_sim::calibration::gates::Tolerance;
use hpfsdp_sim::calibration::loo::Fold;
use hpfsdp_sim::calibration::verdict::{Checked, CheckedRow};

/// A number as a CSV cell: shortest round-trip text, empty when not finite.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        String::new()
    }
}

/// An optional number as a CSV cell.
fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), num)
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|v| v.to_string()).collect()
}

/// The tolerance as (limit as a fraction, kind): `relative` limits `|predicted / measured -
/// 1|`, `absolute` limits `|predicted - measured|` of a fraction.
fn tolerance(t: Tolerance) -> [String; 2] {
    match t {
        Tolerance::Relative(l) => [num(l), "relative".into()],
        Tolerance::AbsoluteFraction(l) => [num(l), "absolute".into()],
    }
}

/// The cells every figure row shares: figure key, unit, measured, predicted, relative error,
/// tolerance and its kind, gating, passed.
fn figure_cells(row: &FigureRow, r: &CheckedRow) -> Vec<String> {
    let mut cells = vec![
        row.figure.key().to_string(),
        row.figure.unit().to_string(),
        num(row.measured),
        num(row.predicted),
        opt(row.relative_error()),
    ];
    cells.extend(tolerance(r.tolerance));
    cells.push(r.gating.to_string());
    cells.push((row.figure.modelled() && r.passed).to_string());
    cells
}

/// `comparison.csv`: every figure row of every run.
pub fn comparison(checked: &Checked) -> Table {
    let rows = checked
        .rows
        .iter()
        .map(|r| {
            let row = &r.row;
            let mut cells = vec![row.experiment.clone(), row.run.clone()];
            cells.extend(figure_cells(row, r));
            cells.push(r.fitted.to_string());
            cells.push(if is_fitted_row(row) {
                num(log_residual(row))
            } else {
                String::new()
            });
            cells.push(row.source.clone());
            cells
        })
        .collect();
    Table {
        headers: strings(&[
            "experiment",
            "run",
            "figure",
            "unit",
            "measured (unit)",
            "predicted (unit)",
            "relative error (fraction)",
            "tolerance (fraction)",
            "tolerance kind",
            "gating",
            "passed",
            "fitted",
            "weighted log residual (ln)",
            "source",
        ]),
        rows,
    }
}

/// `constants.csv`: every fitted constant (values in the unit its key names).
pub fn constants(fit: &FitOutcome) -> Table {
    let rows = fit
        .params
        .iter()
        .map(|p| {
            vec![
                p.param.key.clone(),
                num(p.start),
                num(p.value),
                num(p.param.min),
                num(p.param.max),
                num(p.param.prior.centre),
                num(p.param.prior.log_width),
                num(p.prior_sigmas),
                num(p.data_share),
                p.identified().to_string(),
                match p.at_bound {
                    Some(AtBound::Lower) => "lower".into(),
                    Some(AtBound::Upper) => "upper".into(),
                    None => String::new(),
                },
                p.unidentified.to_string(),
                one_line(&p.param.bound_source),
                one_line(&p.param.prior.source),
            ]
        })
        .collect();
    Table {
        headers: strings(&[
            "constant",
            "start (key unit)",
            "fitted (key unit)",
            "min (key unit)",
            "max (key unit)",
            "prior centre (key unit)",
            "prior log width (ln)",
            "fitted vs prior (sigmas)",
            "data share (fraction)",
            "set by data",
            "at bound",
            "no figure depends on it",
            "bound source",
            "prior source",
        ]),
        rows,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `loo.csv`: one row per fold, its fit's costs, the left-out figures' error, the gating
/// rows within tolerance, and each constant fitted without what it leaves out (one column
/// per constant key, in the fit's order).
pub fn loo(folds: &[Fold]) -> Table {
    let keys: Vec<String> = folds.first().map_or(Vec::new(), |f| {
        f.fit.params.iter().map(|p| p.param.key.clone()).collect()
    });
    let mut headers = strings(&[
        "left out",
        "experiment",
        "run",
        "fit cost",
        "fit cost of the figures",
        "fit cost of the priors",
        "rms ln(predicted / measured)",
        "gating rows passed (count)",
        "gating rows (count)",
        "passed",
        "left at their prior",
        "measured constants replaced",
    ]);
    headers.extend(keys.iter().map(|k| format!("{k} (fitted)")));
    let rows = folds
        .iter()
        .map(|f| {
            let gating: Vec<_> = f.held_out.rows.iter().filter(|r| r.gating).collect();
            let mut cells = vec![
                f.left_out.to_string(),
                f.left_out.experiment.clone(),
                f.left_out.run.clone().unwrap_or_default(),
                num(f.fit.cost),
                num(f.fit.data_cost),
                num(f.fit.prior_cost),
                num(f.rms_log_error()),
                gating.iter().filter(|r| r.passed).count().to_string(),
                gating.len().to_string(),
                f.held_out.passed.to_string(),
                f.fit
                    .params
                    .iter()
                    .filter(|p| !p.identified())
                    .map(|p| p.param.key.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                f.blinded
                    .iter()
                    .map(|m| format!("{}={}", m.key, m.blind_value))
                    .collect::<Vec<_>>()
                    .join(" "),
            ];
            cells.extend(keys.iter().map(|k| {
                opt(f
                    .fit
                    .params
                    .iter()
                    .find(|p| &p.param.key == k)
                    .map(|p| p.value))
            }));
            cells
        })
        .collect();
    Table { headers, rows }
}

/// `loo-figures.csv`: every left-out figure of every fold.
pub fn loo_figures(folds: &[Fold]) -> Table {
    let rows = folds
        .iter()
        .flat_map(|f| f.held_out.rows.iter().map(move |r| (f, r)))
        .map(|(f, r)| {
            let mut cells = vec![f.left_out.to_string(), r.row.run.clone()];
            cells.extend(figure_cells(&r.row, r));
            cells
        })
        .collect();
    Table {
        headers: strings(&[
            "left out",
            "run",
            "figure",
            "unit",
            "measured (unit)",
            "predicted (unit)",
            "relative error (fraction)",
            "tolerance (fraction)",
            "tolerance kind",
            "gating",
            "passed",
        ]),
        rows,
    }
}
