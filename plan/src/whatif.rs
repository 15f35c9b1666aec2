//! The `[whatif]` section of a scenario file: faults and heterogeneity to simulate.
//!
//! ```toml
//! [whatif]
//! slow_ranks = { "17" = 1.3 }          # rank 17's compute kernels take 1.3x as long
//! degraded_links = [
//!   { tier = "inter-supernode", machines = [0, 3], bandwidth_factor = 0.5 },
//! ]
//! straggler_jitter_pct = 5             # every compute op of every rank x U[0.95, 1.05]
//! seed = 7                             # the jitter's seed (default 0)
//! ```
//!
//! Meaning (the simulator applies it, see `hpfsdp_sim::whatif`):
//! - **slow_ranks** scale the device time of the rank's *compute* kernels (GEMMs, attention,
//!   element-wise, optimizer math): a throttled or weaker device. Copies (HBM/DMA bound),
//!   host launch costs and collectives are not scaled: a slow die does not slow its links.
//!   Factors below 1 model a faster device (heterogeneous clusters).
//! - **degraded_links** multiply a tier's bandwidth on the listed machines (global machine
//!   index = rank / `topology.dies_per_machine`) by `bandwidth_factor`. A collective phase on
//!   that tier runs at the speed of its slowest member link: its transfer time is divided by
//!   the smallest factor over the machines of the group's ranks. Latency is unchanged.
//! - **straggler_jitter_pct** = p multiplies each compute op's device time by an independent
//!   factor drawn uniformly from `[1 - p/100, 1 + p/100]`, a pure function of
//!   `(seed, rank, op index)`, so runs are deterministic for a seed. The mean is unchanged;
//!   the cost comes from collectives waiting for their slowest member.

use crate::error::{PlanError, PlanResult};
use crate::toml_lines::find_key_line;
use crate::topology::{Tier, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest accepted slow-rank factor (a rank 100x slower than its peers is a failed rank,
/// not a straggler; remove it from the job instead).
pub const MAX_SLOW_FACTOR: f64 = 100.0;
/// Smallest accepted slow-rank factor (10x faster than the profile's device).
pub const MIN_SLOW_FACTOR: f64 = 0.1;
/// Smallest accepted bandwidth factor (a link at 0.1% of its bandwidth is down).
pub const MIN_BANDWIDTH_FACTOR: f64 = 0.001;
/// Largest accepted jitter, in percent (at 100% a kernel could take no time).
pub const MAX_JITTER_PCT: f64 = 90.0;

/// `[whatif]`: faults and heterogeneity to simulate (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatIfSection {
    /// Rank (as a string key, TOML keys are strings) → compute slowdown factor.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slow_ranks: BTreeMap<String, f64>,
    /// Degraded links: a tier's bandwidth factor on a set of machines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded_links: Vec<DegradedLinkSpec>,
    /// Per-op compute noise amplitude in percent (0 = none).
    #[serde(default)]
    pub straggler_jitter_pct: f64,
    /// Seed of the jitter.
    #[serde(default)]
    pub seed: u64,
}

/// One `degraded_links` entry as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DegradedLinkSpec {
    /// Tier name: `intra-machine`, `intra-supernode` or `inter-supernode` (`_` accepted).
    pub tier: String,
    /// Global machine indices (rank / dies_per_machine) whose links on `tier` are degraded.
    pub machines: Vec<usize>,
    /// Bandwidth multiplier in `(0, 1]` (0.5 = half the bandwidth).
    pub bandwidth_factor: f64,
}

/// A degraded link, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DegradedLink {
    /// The tier whose bandwidth drops.
    pub tier: Tier,
    /// Global machine indices, ascending, no duplicates.
    pub machines: Vec<usize>,
    /// Bandwidth multiplier in `[MIN_BANDWIDTH_FACTOR, 1]`.
    pub bandwidth_factor: f64,
}

/// The `[whatif]` section validated against the scenario's topology.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WhatIf {
    /// Rank → compute time factor.
    pub slow_ranks: BTreeMap<usize, f64>,
    /// Degraded links.
    pub degraded_links: Vec<DegradedLink>,
    /// Jitter amplitude as a fraction (pct / 100).
    pub jitter_fraction: f64,
    /// Jitter seed.
    pub seed: u64,
}

impl WhatIf {
    /// True when nothing is perturbed (the simulation equals the plain one).
    pub fn is_empty(&self) -> bool {
        self.slow_ranks.is_empty() && self.degraded_links.is_empty() && self.jitter_fraction == 0.0
    }
}

/// One what-if fault of a section, for reports that cost each fault alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhatIfFault {
    /// `slow_ranks`.
    SlowRanks,
    /// `degraded_links`.
    DegradedLinks,
    /// `straggler_jitter_pct`.
    Jitter,
}

impl WhatIfFault {
    /// Every fault, in report order.
    pub const ALL: [WhatIfFault; 3] = [Self::SlowRanks, Self::DegradedLinks, Self::Jitter];

    /// The scenario key of the fault.
    pub fn key(self) -> &'static str {
        match self {
            Self::SlowRanks => "slow_ranks",
            Self::DegradedLinks => "degraded_links",
            Self::Jitter => "straggler_jitter_pct",
        }
    }
}

/// A key-level validation error: the `[whatif]` key at fault and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct WhatIfError {
    /// The key inside `[whatif]`.
    pub key: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

fn parse_tier(name: &str) -> Option<Tier> {
    let norm = name.replace('_', "-");
    Tier::ALL.into_iter().find(|t| t.name() == norm)
}

impl WhatIfSection {
    /// True when the section sets no fault.
    pub fn is_empty(&self) -> bool {
        self.slow_ranks.is_empty()
            && self.degraded_links.is_empty()
            && self.straggler_jitter_pct == 0.0
    }

    /// The section with only `fault` kept (the seed stays), to cost each fault alone.
    pub fn only(&self, fault: WhatIfFault) -> WhatIfSection {
        WhatIfSection {
            slow_ranks: match fault {
                WhatIfFault::SlowRanks => self.slow_ranks.clone(),
                _ => BTreeMap::new(),
            },
            degraded_links: match fault {
                WhatIfFault::DegradedLinks => self.degraded_links.clone(),
                _ => Vec::new(),
            },
            straggler_jitter_pct: match fault {
                WhatIfFault::Jitter => self.straggler_jitter_pct,
                _ => 0.0,
            },
            seed: self.seed,
        }
    }

    /// True when `fault` is set in this section.
    pub fn has(&self, fault: WhatIfFault) -> bool {
        match fault {
            WhatIfFault::SlowRanks => !self.slow_ranks.is_empty(),
            WhatIfFault::DegradedLinks => !self.degraded_links.is_empty(),
            WhatIfFault::Jitter => self.straggler_jitter_pct != 0.0,
        }
    }

    /// Validates the section for a job of `world_size` ranks on `topology`.
    pub fn resolve(&self, topology: &Topology, world_size: usize) -> Result<WhatIf, WhatIfError> {
        let err = |key, message| WhatIfError { key, message };
        let mut slow_ranks = BTreeMap::new();
        for (k, &factor) in &self.slow_ranks {
            let rank: usize = k.trim().parse().map_err(|_| {
                err(
                    "slow_ranks",
                    format!(
                        "slow_ranks key \"{k}\" is not a rank number; write {{ \"17\" = 1.3 }}"
                    ),
                )
            })?;
            if rank >= world_size {
                return Err(err(
                    "slow_ranks",
                    format!(
                        "slow_ranks: rank {rank} does not exist (the job has ranks 0..{}); \
                         name a rank below {world_size}",
                        world_size - 1
                    ),
                ));
            }
            if !factor.is_finite() || !(MIN_SLOW_FACTOR..=MAX_SLOW_FACTOR).contains(&factor) {
                return Err(err(
                    "slow_ranks",
                    format!(
                        "slow_ranks: rank {rank} has factor {factor}; a compute time factor must \
                         lie in [{MIN_SLOW_FACTOR}, {MAX_SLOW_FACTOR}] (1.3 = 30% slower)"
                    ),
                ));
            }
            slow_ranks.insert(rank, factor);
        }
        let machines = world_size.div_ceil(topology.dies_per_machine);
        let mut degraded_links = Vec::new();
        for (i, d) in self.degraded_links.iter().enumerate() {
            degraded_links
                .push(resolve_link(i, d, machines).map_err(|m| err("degraded_links", m))?);
        }
        let pct = self.straggler_jitter_pct;
        if !pct.is_finite() || !(0.0..=MAX_JITTER_PCT).contains(&pct) {
            return Err(err(
                "straggler_jitter_pct",
                format!(
                    "straggler_jitter_pct = {pct}; give a percentage in [0, {MAX_JITTER_PCT}] \
                     (5 = each compute op x U[0.95, 1.05])"
                ),
            ));
        }
        Ok(WhatIf {
            slow_ranks,
            degraded_links,
            jitter_fraction: pct / 100.0,
            seed: self.seed,
        })
    }

    /// [`WhatIfSection::resolve`] with errors naming the scenario file and line.
    pub fn validate(
        &self,
        topology: &Topology,
        world_size: usize,
        text: &str,
        file_label: &str,
    ) -> PlanResult<WhatIf> {
        self.resolve(topology, world_size)
            .map_err(|e| PlanError::Scenario {
                file: file_label.to_string(),
                line: find_key_line(text, "whatif", e.key),
                message: format!("[whatif] {}", e.message),
            })
    }
}

fn resolve_link(i: usize, d: &DegradedLinkSpec, machines: usize) -> Result<DegradedLink, String> {
    let n = i + 1;
    let tier = parse_tier(&d.tier).ok_or_else(|| {
        let known: Vec<&str> = Tier::ALL.iter().map(|t| t.name()).collect();
        format!(
            "degraded_links #{n}: unknown tier '{}'; choose one of {}",
            d.tier,
            known.join(", ")
        )
    })?;
    if d.machines.is_empty() {
        return Err(format!(
            "degraded_links #{n}: machines is empty; list the global machine indices \
             (rank / dies_per_machine) whose links are degraded"
        ));
    }
    if let Some(&m) = d.machines.iter().find(|&&m| m >= machines) {
        return Err(format!(
            "degraded_links #{n}: machine {m} does not exist (the job spans machines 0..{}); \
             a machine index is rank / dies_per_machine",
            machines - 1
        ));
    }
    let f = d.bandwidth_factor;
    if !f.is_finite() || !(MIN_BANDWIDTH_FACTOR..=1.0).contains(&f) {
        return Err(format!(
            "degraded_links #{n}: bandwidth_factor = {f}; give a factor in \
             [{MIN_BANDWIDTH_FACTOR}, 1] (0.5 = half the bandwidth); a faster link needs a \
             different hardware profile"
        ));
    }
    let mut list = d.machines.clone();
    list.sort_unstable();
    list.dedup();
    Ok(DegradedLink {
        tier,
        machines: list,
        bandwidth_factor: f,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        Topology::new(8, 2, 2).unwrap()
    }

    fn section(text: &str) -> WhatIfSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn resolves_a_full_section() {
        let w = section(
            r#"slow_ranks = { "17" = 1.3 }
               degraded_links = [{ tier = "inter_supernode", machines = [3, 0, 3], bandwidth_factor = 0.5 }]
               straggler_jitter_pct = 5
               seed = 9"#,
        )
        .resolve(&topo(), 32)
        .unwrap();
        assert_eq!(w.slow_ranks[&17], 1.3);
        assert_eq!(w.degraded_links[0].tier, Tier::InterSupernode);
        assert_eq!(w.degraded_links[0].machines, vec![0, 3]);
        assert!((w.jitter_fraction - 0.05).abs() < 1e-12);
        assert_eq!(w.seed, 9);
        assert!(!w.is_empty());
    }

    #[test]
    fn bad_values_name_the_key_and_fix() {
        let cases = [
            (
                r#"slow_ranks = { "32" = 1.3 }"#,
                "slow_ranks",
                "does not exist",
            ),
            (
                r#"slow_ranks = { "x" = 1.3 }"#,
                "slow_ranks",
                "not a rank number",
            ),
            (r#"slow_ranks = { "1" = 0.0 }"#, "slow_ranks", "must lie in"),
            (
                r#"slow_ranks = { "1" = 1000.0 }"#,
                "slow_ranks",
                "must lie in",
            ),
            (
                r#"degraded_links = [{ tier = "rack", machines = [0], bandwidth_factor = 0.5 }]"#,
                "degraded_links",
                "unknown tier 'rack'",
            ),
            (
                r#"degraded_links = [{ tier = "intra-machine", machines = [4], bandwidth_factor = 0.5 }]"#,
                "degraded_links",
                "machine 4 does not exist",
            ),
            (
                r#"degraded_links = [{ tier = "intra-machine", machines = [], bandwidth_factor = 0.5 }]"#,
                "degraded_links",
                "machines is empty",
            ),
            (
                r#"degraded_links = [{ tier = "intra-machine", machines = [0], bandwidth_factor = 2.0 }]"#,
                "degraded_links",
                "bandwidth_factor = 2",
            ),
            (
                "straggler_jitter_pct = -1",
                "straggler_jitter_pct",
                "[0, 90]",
            ),
            (
                "straggler_jitter_pct = 95",
                "straggler_jitter_pct",
                "[0, 90]",
            ),
        ];
        for (text, key, needle) in cases {
            let e = section(text).resolve(&topo(), 32).unwrap_err();
            assert_eq!(e.key, key, "{text}");
            assert!(e.message.contains(needle), "{text}: {}", e.message);
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        assert!(toml::from_str::<WhatIfSection>("slow_rank = {}").is_err());
    }

    #[test]
    fn only_keeps_one_fault() {
        let s = section(
            r#"slow_ranks = { "1" = 2.0 }
               straggler_jitter_pct = 5"#,
        );
        let only = s.only(WhatIfFault::Jitter);
        assert!(only.slow_ranks.is_empty());
        assert!(only.has(WhatIfFault::Jitter));
        assert!(
            !s.only(WhatIfFault::DegradedLinks)
                .has(WhatIfFault::DegradedLinks)
        );
    }
}
