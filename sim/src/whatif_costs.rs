//! How much of the step each what-if fault costs: the scenario simulated without any fault,
//! with each fault of its `[whatif]` section alone, then with all of them.

use crate::error::SimError;
use crate::profile::HardwareProfile;
use crate::scenario_run::{RunOptions, ScenarioPlans, simulate_strategy};
use hpfsdp_plan::whatif::{WhatIfFault, WhatIfSection};
use serde::{Deserialize, Serialize};

/// One row of the what-if cost table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhatIfCost {
    /// `baseline`, a fault's scenario key (`slow_ranks`, `degraded_links`,
    /// `straggler_jitter_pct`) or `all`.
    pub fault: String,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Step time minus the baseline's, seconds.
    pub delta_s: f64,
    /// `delta_s` as a percentage of the baseline step time.
    pub delta_pct: f64,
    /// The rank that finished last.
    pub critical_rank: usize,
}

/// The variants to simulate: `(label, section)`; empty when the scenario sets no fault.
/// `all` is listed only when more than one fault is set (otherwise it is that fault's row).
pub fn variants(section: Option<&WhatIfSection>) -> Vec<(String, Option<WhatIfSection>)> {
    let Some(section) = section.filter(|s| !s.is_empty()) else {
        return Vec::new();
    };
    let mut out = vec![("baseline".to_string(), None)];
    let faults: Vec<WhatIfFault> = WhatIfFault::ALL
        .into_iter()
        .filter(|&f| section.has(f))
        .collect();
    for &f in &faults {
        out.push((f.key().to_string(), Some(section.only(f))));
    }
    if faults.len() > 1 {
        out.push(("all".to_string(), Some(section.clone())));
    }
    out
}

/// Simulates `strategy` on the scenario without faults, with each fault alone and with all
/// (see [`variants`]); empty when the scenario has no `[whatif]` fault. Timelines are not
/// recorded (only step times are kept).
pub fn whatif_costs(
    plans: &ScenarioPlans,
    strategy: &str,
    profile: &HardwareProfile,
    options: &RunOptions,
) -> Result<Vec<WhatIfCost>, SimError> {
    let options = RunOptions {
        record_timeline: false,
        ..options.clone()
    };
    let mut rows: Vec<WhatIfCost> = Vec::new();
    for (label, section) in variants(plans.scenario.file.whatif.as_ref()) {
        let mut variant = plans.clone();
        variant.scenario.file.whatif = section;
        let run = simulate_strategy(&variant, strategy, profile, &options)?;
        let step_time_s = run.result.step_time_s();
        let base_s = rows.first().map_or(step_time_s, |b| b.step_time_s);
        rows.push(WhatIfCost {
            fault: label,
            step_time_s,
            delta_s: step_time_s - base_s,
            delta_pct: if base_s > 0.0 {
                100.0 * (step_time_s - base_s) / base_s
            } else {
                0.0
            },
            critical_rank: run.result.critical_rank,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_list_each_set_fault_then_all() {
        assert!(variants(None).is_empty());
        assert!(variants(Some(&WhatIfSection::default())).is_empty());
        let one: WhatIfSection = toml::from_str("straggler_jitter_pct = 5").unwrap();
        let labels: Vec<String> = variants(Some(&one)).into_iter().map(|v| v.0).collect();
        assert_eq!(labels, ["baseline", "straggler_jitter_pct"]);
        let two: WhatIfSection =
            toml::from_str("straggler_jitter_pct = 5\nslow_ranks = { \"1\" = 1.2 }").unwrap();
        let labels: Vec<String> = variants(Some(&two)).into_iter().map(|v| v.0).collect();
        assert_eq!(
            labels,
            ["baseline", "slow_ranks", "straggler_jitter_pct", "all"]
        );
    }
}
