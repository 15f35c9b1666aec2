//! Measured runs as data: the runs file (TOML) that `hpfsdp calibrate --runs FILE` reads.
//!
//! ```toml
//! hardware = "nvidia-h200-hgx"     # the profile the runs were measured on (its `name`)
//! description = "..."              # shown under the report's title
//!
//! [[run]]
//! experiment = "B"                 # leave-one-out leaves experiments out as a whole
//! label = "PyTorch FSDP2"          # unique over every runs file given together
//! scenario = "../paper/exp-b.toml" # relative to this file
//! strategy = "fsdp2"               # hyperparallel | fsdp2 | megatron-ddp
//! optimizer = "adamw"              # optional: the scenario's default otherwise
//! mode = "production"              # or "validation" (default production)
//! resident = { bytes = "15.64 GiB", source = "..." }  # optional: memory held outside the step
//! [run.figures]
//! step_time_s = { value = 3.720, source = "paper Table 5" }
//! peak_allocated_bytes = { value = "51.035 GB", source = "...", tolerance = "5%", gating = true }
//! # loo_tolerance = "10%": the tolerance when the run is left out (default: tolerance)
//!
//! [[difference]]                   # run / baseline - 1 of the step times, in pp
//! name = "exp_b"
//! label = "experiment-B step-time difference"
//! experiment = "B"
//! run = "HyperParallel-FSDP"
//! baseline = "PyTorch FSDP2"
//! tolerance_pp = 3.0
//! source = "..."
//!
//! [[fit]]                          # a constant the fit may move
//! key = "calibration.copy_efficiency"
//! min = 0.1
//! max = 1.0
//! bound_source = "..."
//! max_from_model_launches = "production mode"   # optional (see params::MaxFrom)
//! prior = { centre = 0.6, log_width = 0.405, source = "..." }
//! blind = { experiments = ["B"], runs = ["PyTorch FSDP2"], min = 0.05, max = 1.0, source = "..." }
//!
//! [[measured_constant]]            # a profile constant measured on one run (blinded by LOO)
//! key = "calibration.unaligned_bandwidth_factor"
//! experiment = "B"
//! runs = ["PyTorch FSDP2"]
//! blind_value = 1.0
//! blind_source = "..."
//!
//! [[sourced_range]]                # a constant the fit leaves alone, with its public range
//! key = "calibration.host_d2h_sync_us"
//! min = 8.6
//! max = 130.1
//! source = "..."
//! ```
//!
//! A figure's `value` is a number in the figure's base unit or a string with a unit
//! ([`super::quantity`]: `"305.6 ms"`, `"78.27 GiB"`); `source` is required; `tolerance`
//! (`"10%"`, `"5 pp"`), `loo_tolerance` (the tolerance a left-out run's figure is checked
//! against in leave-one-out; default `tolerance`), `weight` (its weight in the fit; 0 = predicted, not fitted) and
//! `gating` override the figure's default rule ([`super::gates::FIGURE_RULES`]). Figure keys
//! are [`Figure::key`]s. `validation_overhead_s` is never entered: it is derived for every
//! validation-mode run whose production twin (same experiment, scenario, strategy and
//! optimizer) is in the file, as the difference of their step times. Every error names the
//! file, the line and the key, and what to write instead.

use super::difference::Difference;
use super::error::CalibrationError;
use super::figure::Figure;
use super::gates::rule_of;
use super::measured::{MeasuredFigure, MeasuredRun, ResidentMemory};
use super::params::{BlindBounds, FitParam, KEYS, MaxFrom, MeasuredConstant, SourcedRange};
use super::prior::Prior;
use super::quantity::{parse_tolerance, parse_value};
use hpfsdp_program::strategy::StrategyKind;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Where the shipped runs files live, relative to the repository root.
pub const RUNS_DIR: &str = "scenarios/runs";

/// The shipped runs file of the paper's held-in experiments (profile `ascend-910c-a3`),
/// relative to the repository root.
pub const PAPER_A3_RUNS: &str = "scenarios/runs/paper-a3.toml";

/// One runs file, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RunsFile {
    /// The file.
    pub path: PathBuf,
    /// The hardware profile the runs were measured on (a profile `name`).
    pub hardware: String,
    /// What the runs are, for the report.
    pub description: String,
    /// The measured runs, in file order.
    pub runs: Vec<MeasuredRun>,
    /// Step-time differences between runs.
    pub differences: Vec<Difference>,
    /// The constants a fit on these runs may move.
    pub fit: Vec<FitParam>,
    /// Profile constants measured on one of these runs.
    pub measured_constants: Vec<MeasuredConstant>,
    /// Constants the fit leaves alone, with their public ranges.
    pub sourced_ranges: Vec<SourcedRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    hardware: Spanned<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    run: Vec<RawRun>,
    #[serde(default)]
    difference: Vec<RawDifference>,
    #[serde(default)]
    fit: Vec<RawFit>,
    #[serde(default)]
    measured_constant: Vec<RawMeasuredConstant>,
    #[serde(default)]
    sourced_range: Vec<RawRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRun {
    experiment: Spanned<String>,
    label: Spanned<String>,
    scenario: Spanned<String>,
    strategy: Spanned<String>,
    #[serde(default)]
    optimizer: Option<Spanned<String>>,
    #[serde(default)]
    mode: Option<Spanned<String>>,
    #[serde(default)]
    resident: Option<Spanned<RawResident>>,
    figures: Spanned<BTreeMap<Spanned<String>, Spanned<RawFigure>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResident {
    bytes: Spanned<RawValue>,
    source: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFigure {
    value: Option<Spanned<RawValue>>,
    source: Option<String>,
    tolerance: Option<Spanned<String>>,
    loo_tolerance: Option<Spanned<String>>,
    weight: Option<Spanned<f64>>,
    gating: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawValue {
    Number(f64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDifference {
    name: Spanned<String>,
    label: String,
    experiment: Spanned<String>,
    run: Spanned<String>,
    baseline: Spanned<String>,
    tolerance_pp: Spanned<f64>,
    source: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFit {
    key: Spanned<String>,
    min: f64,
    max: f64,
    bound_source: Spanned<String>,
    #[serde(default)]
    max_from_model_launches: Option<Spanned<String>>,
    prior: Spanned<RawPrior>,
    #[serde(default)]
    blind: Option<Spanned<RawBlind>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrior {
    centre: f64,
    log_width: f64,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBlind {
    experiments: Vec<String>,
    #[serde(default)]
    runs: Vec<String>,
    min: f64,
    max: f64,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeasuredConstant {
    key: Spanned<String>,
    experiment: Spanned<String>,
    #[serde(default)]
    runs: Vec<String>,
    blind_value: f64,
    blind_source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    key: Spanned<String>,
    min: f64,
    max: f64,
    source: String,
}

/// Builds errors that name the file, the line of a span and a key.
struct Errors<'a> {
    file: &'a str,
    text: &'a str,
}

impl Errors<'_> {
    fn at(&self, span: std::ops::Range<usize>, key: &str, message: String) -> CalibrationError {
        let before = self.text.get(..span.start).unwrap_or(self.text);
        CalibrationError::RunsFile {
            file: self.file.to_string(),
            line: before.matches('\n').count() + 1,
            key: key.to_string(),
            message,
        }
    }
}

impl RunsFile {
    /// Reads and checks a runs file.
    pub fn load(path: &Path) -> Result<RunsFile, CalibrationError> {
        let text = std::fs::read_to_string(path).map_err(|e| CalibrationError::Io {
            path: path.display().to_string(),
            message: format!("cannot read the runs file: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks runs-file text; `path` names it in errors and anchors its relative
    /// scenario paths.
    pub fn parse(text: &str, path: &Path) -> Result<RunsFile, CalibrationError> {
        let file = path.display().to_string();
        let errors = Errors { file: &file, text };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            errors.at(span, "-", e.message().trim().to_string())
        })?;
        if raw.hardware.get_ref().trim().is_empty() {
            return Err(errors.at(
                raw.hardware.span(),
                "hardware",
                "name the hardware profile the runs were measured on".into(),
            ));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut runs = Vec::with_capacity(raw.run.len());
        for r in &raw.run {
            let run = run(&errors, r, dir, path)?;
            if let Some(other) = runs.iter().find(|o: &&MeasuredRun| o.label == run.label) {
                return Err(errors.at(
                    r.label.span(),
                    "run.label",
                    format!(
                        "run label '{}' is used twice (experiment '{}' and '{}'); labels must \
                         be unique",
                        run.label, other.experiment, run.experiment
                    ),
                ));
            }
            runs.push(run);
        }
        derive_validation_overheads(&mut runs);
        let differences = raw
            .difference
            .iter()
            .map(|d| difference(&errors, d, &runs))
            .collect::<Result<_, _>>()?;
        let fit = raw
            .fit
            .iter()
            .map(|f| fit_param(&errors, f, &runs))
            .collect::<Result<Vec<_>, _>>()?;
        unique_fit_keys(&errors, &raw.fit)?;
        let measured_constants = raw
            .measured_constant
            .iter()
            .map(|m| measured_constant(&errors, m, &runs))
            .collect::<Result<_, _>>()?;
        let sourced_ranges = raw
            .sourced_range
            .iter()
            .map(|r| sourced_range(&errors, r))
            .collect::<Result<_, _>>()?;
        Ok(RunsFile {
            path: path.to_path_buf(),
            hardware: raw.hardware.into_inner(),
            description: raw.description,
            runs,
            differences,
            fit,
            measured_constants,
            sourced_ranges,
        })
    }
}

/// Refuses a key with two `[[fit]]` entries.
fn unique_fit_keys(errors: &Errors, fit: &[RawFit]) -> Result<(), CalibrationError> {
    for (i, f) in fit.iter().enumerate() {
        if fit[..i].iter().any(|o| o.key.get_ref() == f.key.get_ref()) {
            return Err(errors.at(
                f.key.span(),
                "fit.key",
                format!("'{}' has two [[fit]] entries; keep one", f.key.get_ref()),
            ));
        }
    }
    Ok(())
}

/// A dotted profile key this calibration can read and write, or an error listing them.
fn known_key(
    errors: &Errors,
    key: &Spanned<String>,
    what: &str,
) -> Result<String, CalibrationError> {
    if KEYS.contains(&key.get_ref().as_str()) {
        Ok(key.get_ref().clone())
    } else {
        Err(errors.at(
            key.span(),
            what,
            format!(
                "unknown profile key '{}'; calibration reads and writes: {}",
                key.get_ref(),
                KEYS.join(", ")
            ),
        ))
    }
}

/// A non-empty string or an error naming `key`.
fn non_empty(
    errors: &Errors,
    s: &Spanned<String>,
    key: &str,
    what: &str,
) -> Result<String, CalibrationError> {
    let v = s.get_ref().trim();
    if v.is_empty() {
        Err(errors.at(s.span(), key, format!("must not be empty: {what}")))
    } else {
        Ok(v.to_string())
    }
}

fn run(
    errors: &Errors,
    r: &RawRun,
    dir: &Path,
    file: &Path,
) -> Result<MeasuredRun, CalibrationError> {
    let experiment = non_empty(
        errors,
        &r.experiment,
        "run.experiment",
        "name the experiment",
    )?;
    let label = non_empty(errors, &r.label, "run.label", "name the run")?;
    let strategy = non_empty(errors, &r.strategy, "run.strategy", "name the strategy")?;
    StrategyKind::parse(&strategy)
        .map_err(|e| errors.at(r.strategy.span(), "run.strategy", e.to_string()))?;
    let scenario = dir.join(r.scenario.get_ref());
    if !scenario.is_file() {
        return Err(errors.at(
            r.scenario.span(),
            "run.scenario",
            format!(
                "scenario '{}' not found (looked for {}; paths are relative to the runs file)",
                r.scenario.get_ref(),
                scenario.display()
            ),
        ));
    }
    let validation_mode = match r.mode.as_ref().map(|m| m.get_ref().as_str()) {
        None | Some("production") => false,
        Some("validation") => true,
        Some(other) => {
            return Err(errors.at(
                r.mode.as_ref().map_or(0..0, |m| m.span()),
                "run.mode",
                format!("mode '{other}': write \"production\" or \"validation\""),
            ));
        }
    };
    if r.figures.get_ref().is_empty() {
        return Err(errors.at(
            r.figures.span(),
            "run.figures",
            format!("run '{label}' has no figures; give at least step_time_s"),
        ));
    }
    let mut figures = Vec::new();
    for (key, raw) in r.figures.get_ref() {
        figures.push(figure(errors, key, raw, &label)?);
    }
    figures.sort_by_key(|m| m.figure);
    let resident = r
        .resident
        .as_ref()
        .map(|raw| resident(errors, raw))
        .transpose()?;
    Ok(MeasuredRun {
        experiment,
        label,
        scenario,
        strategy,
        optimizer: r.optimizer.as_ref().map(|o| o.get_ref().clone()),
        validation_mode,
        figures,
        resident,
        file: file.to_path_buf(),
    })
}

/// A value written as a number or a `"number unit"` string ([`parse_value`]), finite and >= 0.
fn non_negative(raw: &RawValue) -> Result<f64, String> {
    let n = match raw {
        RawValue::Number(n) => *n,
        RawValue::Text(t) => parse_value(t)?,
    };
    if n.is_finite() && n >= 0.0 {
        Ok(n)
    } else {
        Err(format!("value {n} must be a finite number >= 0"))
    }
}

/// A run's `resident = { bytes, source }`: a finite byte count >= 0 and a non-empty source.
fn resident(
    errors: &Errors,
    raw: &Spanned<RawResident>,
) -> Result<ResidentMemory, CalibrationError> {
    let r = raw.get_ref();
    let bytes = non_negative(r.bytes.get_ref())
        .map_err(|m| errors.at(r.bytes.span(), "run.resident.bytes", m))?;
    let source = r.source.as_deref().map(str::trim).unwrap_or("");
    if source.is_empty() {
        return Err(errors.at(
            raw.span(),
            "run.resident.source",
            "no source: say what holds the memory and how its size was derived".into(),
        ));
    }
    Ok(ResidentMemory {
        bytes,
        source: source.to_string(),
    })
}

fn figure(
    errors: &Errors,
    key: &Spanned<String>,
    raw: &Spanned<RawFigure>,
    run: &str,
) -> Result<MeasuredFigure, CalibrationError> {
    let name = format!("run.figures.{}", key.get_ref());
    let figure = Figure::from_key(key.get_ref()).ok_or_else(|| {
        let known: Vec<&str> = Figure::ALL
            .iter()
            .filter(|f| !f.derived())
            .map(|f| f.key())
            .collect();
        errors.at(
            key.span(),
            &name,
            format!(
                "unknown figure '{}' in run '{run}'; known figures: {}",
                key.get_ref(),
                known.join(", ")
            ),
        )
    })?;
    if figure.derived() {
        return Err(errors.at(
            key.span(),
            &name,
            format!(
                "'{}' is derived from the step times of a validation-mode run and its \
                 production twin; give both runs' step_time_s instead",
                key.get_ref()
            ),
        ));
    }
    let f = raw.get_ref();
    let value = match &f.value {
        None => {
            return Err(errors.at(
                raw.span(),
                &name,
                "no value: write value = <number or \"number unit\">".into(),
            ));
        }
        Some(v) => non_negative(v.get_ref())
            .map_err(|m| errors.at(v.span(), &format!("{name}.value"), m))?,
    };
    let source = f.source.as_deref().map(str::trim).unwrap_or("");
    if source.is_empty() {
        return Err(errors.at(
            raw.span(),
            &format!("{name}.source"),
            "no source: say where the number comes from (a table, a log, a file and field)".into(),
        ));
    }
    let mut rule = *rule_of(figure);
    if let Some(t) = &f.tolerance {
        rule.tolerance = parse_tolerance(t.get_ref())
            .map_err(|m| errors.at(t.span(), &format!("{name}.tolerance"), m))?;
    }
    if let Some(t) = &f.loo_tolerance {
        rule.loo_tolerance = Some(
            parse_tolerance(t.get_ref())
                .map_err(|m| errors.at(t.span(), &format!("{name}.loo_tolerance"), m))?,
        );
    }
    if let Some(w) = &f.weight {
        let w_ok = w.get_ref().is_finite() && *w.get_ref() >= 0.0;
        if !w_ok || (*w.get_ref() > 0.0 && !figure.modelled()) {
            return Err(errors.at(
                w.span(),
                &format!("{name}.weight"),
                format!(
                    "weight {} must be >= 0, and 0 for a figure the simulator does not model",
                    w.get_ref()
                ),
            ));
        }
        rule.fit_weight = *w.get_ref();
    }
    if let Some(g) = f.gating {
        if g && !figure.modelled() {
            return Err(errors.at(
                raw.span(),
                &format!("{name}.gating"),
                format!("'{}' is not modelled and cannot gate", key.get_ref()),
            ));
        }
        rule.gating = g;
    }
    Ok(MeasuredFigure {
        figure,
        value,
        source: source.to_string(),
        rule,
    })
}

/// Adds `validation_overhead_s` to every validation-mode run whose production twin (same
/// experiment, scenario, strategy and optimizer) has a step time: the difference of the two.
fn derive_validation_overheads(runs: &mut [MeasuredRun]) {
    let twins: Vec<Option<(String, f64)>> = runs
        .iter()
        .map(|v| {
            let step = v.value(Figure::StepTimeS)?;
            let twin = runs.iter().find(|p| {
                v.validation_mode
                    && !p.validation_mode
                    && p.experiment == v.experiment
                    && p.scenario == v.scenario
                    && p.strategy == v.strategy
                    && p.optimizer == v.optimizer
            })?;
            Some((twin.label.clone(), step - twin.value(Figure::StepTimeS)?))
        })
        .collect();
    for (run, twin) in runs.iter_mut().zip(twins) {
        if let Some((twin, value)) = twin {
            run.figures.push(MeasuredFigure {
                figure: Figure::ValidationOverheadS,
                value,
                source: format!(
                    "derived: step_time_s of '{}' minus step_time_s of '{twin}'",
                    run.label
                ),
                rule: *rule_of(Figure::ValidationOverheadS),
            });
            run.figures.sort_by_key(|m| m.figure);
        }
    }
}

/// The run labelled `label` in experiment `experiment`, or an error naming `key`.
fn find_run<'a>(
    errors: &Errors,
    runs: &'a [MeasuredRun],
    experiment: &str,
    label: &Spanned<String>,
    key: &str,
) -> Result<&'a MeasuredRun, CalibrationError> {
    runs.iter()
        .find(|r| r.experiment == experiment && r.label == *label.get_ref())
        .ok_or_else(|| {
            let known: Vec<&str> = runs
                .iter()
                .filter(|r| r.experiment == experiment)
                .map(|r| r.label.as_str())
                .collect();
            errors.at(
                label.span(),
                key,
                format!(
                    "no run '{}' in experiment '{experiment}' of this file (its runs: {})",
                    label.get_ref(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
}

fn difference(
    errors: &Errors,
    d: &RawDifference,
    runs: &[MeasuredRun],
) -> Result<Difference, CalibrationError> {
    let experiment = d.experiment.get_ref();
    let run = find_run(errors, runs, experiment, &d.run, "difference.run")?;
    let baseline = find_run(errors, runs, experiment, &d.baseline, "difference.baseline")?;
    let step = |r: &MeasuredRun, s: &Spanned<String>, key: &str| {
        r.value(Figure::StepTimeS).ok_or_else(|| {
            errors.at(
                s.span(),
                key,
                format!("run '{}' has no step_time_s to compare", r.label),
            )
        })
    };
    let (a, b) = (
        step(run, &d.run, "difference.run")?,
        step(baseline, &d.baseline, "difference.baseline")?,
    );
    let tol = *d.tolerance_pp.get_ref();
    if !(tol.is_finite() && tol > 0.0) {
        return Err(errors.at(
            d.tolerance_pp.span(),
            "difference.tolerance_pp",
            format!("{tol} must be a positive number of percentage points"),
        ));
    }
    Ok(Difference {
        name: non_empty(
            errors,
            &d.name,
            "difference.name",
            "a short name for the JSON output",
        )?,
        label: d.label.clone(),
        experiment: experiment.clone(),
        run: run.label.clone(),
        baseline: baseline.label.clone(),
        measured: a / b - 1.0,
        tolerance_pp: tol,
        source: non_empty(
            errors,
            &d.source,
            "difference.source",
            "say where the comparison comes from",
        )?,
    })
}

/// Checks a range `min < max`, both positive and finite.
fn range_ok(min: f64, max: f64) -> bool {
    min.is_finite() && max.is_finite() && min > 0.0 && min < max
}

fn fit_param(
    errors: &Errors,
    f: &RawFit,
    runs: &[MeasuredRun],
) -> Result<FitParam, CalibrationError> {
    let key = known_key(errors, &f.key, "fit.key")?;
    if !range_ok(f.min, f.max) {
        return Err(errors.at(f.key.span(), "fit.min", format!("'{key}': min {} and max {} must be positive with min < max (the fit works on logarithms)", f.min, f.max)));
    }
    let bound_source = non_empty(
        errors,
        &f.bound_source,
        "fit.bound_source",
        "say where min and max come from",
    )?;
    let max_from = match &f.max_from_model_launches {
        None => MaxFrom::Fixed,
        Some(label) => {
            let run = runs
                .iter()
                .find(|r| r.label == *label.get_ref())
                .ok_or_else(|| {
                    errors.at(
                        label.span(),
                        "fit.max_from_model_launches",
                        format!("no run '{}' in this file", label.get_ref()),
                    )
                })?;
            let step_s = run.value(Figure::StepTimeS).ok_or_else(|| {
                errors.at(
                    label.span(),
                    "fit.max_from_model_launches",
                    format!("run '{}' has no step_time_s", run.label),
                )
            })?;
            MaxFrom::ModelLaunches {
                run: run.label.clone(),
                step_s,
            }
        }
    };
    let p = f.prior.get_ref();
    if !(p.centre.is_finite() && p.centre > 0.0 && p.log_width.is_finite() && p.log_width > 0.0)
        || p.source.trim().is_empty()
    {
        return Err(errors.at(
            f.prior.span(),
            "fit.prior",
            format!("'{key}': the prior needs centre > 0, log_width > 0 and a source"),
        ));
    }
    let blind = match &f.blind {
        None => None,
        Some(b) => Some(blind(errors, b, runs, &key)?),
    };
    Ok(FitParam {
        key,
        min: f.min,
        max: f.max,
        bound_source,
        max_from,
        blind,
        prior: Prior {
            centre: p.centre,
            log_width: p.log_width,
            source: p.source.clone(),
        },
    })
}

fn blind(
    errors: &Errors,
    b: &Spanned<RawBlind>,
    runs: &[MeasuredRun],
    key: &str,
) -> Result<BlindBounds, CalibrationError> {
    let raw = b.get_ref();
    let bad = |m: String| errors.at(b.span(), "fit.blind", format!("'{key}': {m}"));
    if raw.experiments.is_empty() {
        return Err(bad(
            "name the experiments whose measurements the bounds use".into(),
        ));
    }
    for e in &raw.experiments {
        if !runs.iter().any(|r| &r.experiment == e) {
            return Err(bad(format!("no experiment '{e}' in this file")));
        }
    }
    for r in &raw.runs {
        if !runs
            .iter()
            .any(|m| &m.label == r && raw.experiments.contains(&m.experiment))
        {
            return Err(bad(format!(
                "no run '{r}' in experiments {:?}",
                raw.experiments
            )));
        }
    }
    if !range_ok(raw.min, raw.max) || raw.source.trim().is_empty() {
        return Err(bad("blind bounds need 0 < min < max and a source".into()));
    }
    Ok(BlindBounds {
        experiments: raw.experiments.clone(),
        runs: raw.runs.clone(),
        min: raw.min,
        max: raw.max,
        source: raw.source.clone(),
    })
}

fn measured_constant(
    errors: &Errors,
    m: &RawMeasuredConstant,
    runs: &[MeasuredRun],
) -> Result<MeasuredConstant, CalibrationError> {
    let key = known_key(errors, &m.key, "measured_constant.key")?;
    let experiment = m.experiment.get_ref();
    let bad = |msg: String| {
        errors.at(
            m.experiment.span(),
            "measured_constant.experiment",
            format!("'{key}': {msg}"),
        )
    };
    if !runs.iter().any(|r| &r.experiment == experiment) {
        return Err(bad(format!("no experiment '{experiment}' in this file")));
    }
    for r in &m.runs {
        if !runs
            .iter()
            .any(|x| &x.label == r && &x.experiment == experiment)
        {
            return Err(bad(format!("no run '{r}' in experiment '{experiment}'")));
        }
    }
    if !m.blind_value.is_finite() || m.blind_source.trim().is_empty() {
        return Err(bad("needs a finite blind_value and a blind_source".into()));
    }
    Ok(MeasuredConstant {
        key,
        experiment: experiment.clone(),
        runs: m.runs.clone(),
        blind_value: m.blind_value,
        blind_source: m.blind_source.clone(),
    })
}

fn sourced_range(errors: &Errors, r: &RawRange) -> Result<SourcedRange, CalibrationError> {
    let key = known_key(errors, &r.key, "sourced_range.key")?;
    if !range_ok(r.min, r.max) || r.source.trim().is_empty() {
        return Err(errors.at(
            r.key.span(),
            "sourced_range",
            format!("'{key}': needs 0 < min < max and a source"),
        ));
    }
    Ok(SourcedRange {
        key,
        min: r.min,
        max: r.max,
        source: r.source.clone(),
    })
}
