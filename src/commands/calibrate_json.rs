//! `hpfsdp calibrate --json`: the outcome as one JSON document on stdout.

use super::calibrate_report::flag;
use super::calibrate_tables::FromTables;
use hpfsdp_reports::table::Table;
use hpfsdp_sim::calibration::Comparison;
use hpfsdp_sim::calibration::fit::FitOutcome;
use hpfsdp_sim::calibration::loo::Fold;
use hpfsdp_sim::calibration::verdict::Checked;

/// The `--json` document: every checked row, the fit, the folds, the table fits, the sourced
/// ranges and the host model per run; each step-time difference as `<name>_diff_error_pp`.
pub fn json(
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
                json!({"key": &p.param.key, "start": p.start, "value": p.value,
                       "min": p.param.min, "max": p.param.max, "flag": flag(p),
                       "bound_source": &p.param.bound_source,
                       "prior_centre": p.param.prior.centre,
                       "prior_log_width": p.param.prior.log_width,
                       "prior_sigmas": p.prior_sigmas, "data_share": p.data_share,
                       "identified_by_data": p.identified(),
                       "prior_source": &p.param.prior.source})
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
    let mut doc = json!({
        "passed": checked.passed && folds.is_none_or(|f| f.iter().all(|f| f.held_out.passed)),
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
    });
    for d in &checked.differences {
        doc[format!("{}_diff_error_pp", d.difference.name)] = json!(d.error_pp());
    }
    doc
}

/// `v` when finite (JSON has no NaN).
pub fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}
