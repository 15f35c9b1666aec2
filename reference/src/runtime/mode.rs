//! The one mode flag of the dual-mode runtime, and the dispatch counters both modes keep.

use serde::Serialize;

/// How a sharding plan is executed. This flag is the only fork between the two modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Parameters are plain local shards; only the plan's precompiled boundary transitions
    /// communicate; no layout is tracked.
    Production,
    /// Tensors carry layouts; every op infers its output layout from the rule table (cached by
    /// op and input layouts), runs locally and checks its output; every module boundary checks
    /// its contracts and fails fast naming the module.
    Validation,
}

impl ExecMode {
    /// `production` or `validation`.
    pub fn name(self) -> &'static str {
        match self {
            ExecMode::Production => "production",
            ExecMode::Validation => "validation",
        }
    }

    /// Whether layouts are tracked and checked.
    pub fn validates(self) -> bool {
        self == ExecMode::Validation
    }
}

/// Host-side dispatch events of one rank (the CPU analogue of kernel/host launches).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DispatchStats {
    /// Local kernel launches (both modes).
    pub ops: u64,
    /// Boundary transition steps executed (both modes; identities excluded).
    pub transitions: u64,
    /// Layout rule lookups (validation only).
    pub rule_lookups: u64,
    /// Lookups answered by the rule cache (validation only).
    pub rule_cache_hits: u64,
    /// Output layout checks (validation only).
    pub output_checks: u64,
    /// Boundary contract checks (validation only).
    pub contract_checks: u64,
    /// Host time spent in validation-only work (rule lookups, output and contract checks,
    /// layout propagation), nanoseconds. Not an event count.
    pub validation_host_ns: u64,
}

impl DispatchStats {
    /// Every event counted.
    pub fn total(&self) -> u64 {
        self.ops + self.transitions + self.rule_lookups + self.output_checks + self.contract_checks
    }

    /// Element-wise sum.
    pub fn add(&mut self, other: &DispatchStats) {
        self.ops += other.ops;
        self.transitions += other.transitions;
        self.rule_lookups += other.rule_lookups;
        self.rule_cache_hits += other.rule_cache_hits;
        self.output_checks += other.output_checks;
        self.contract_checks += other.contract_checks;
        self.validation_host_ns += other.validation_host_ns;
    }
}
