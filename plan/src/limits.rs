//! Explicit numeric limits on scenario and model inputs, and checked arithmetic for the sizes
//! derived from them.
//!
//! Every integer a scenario (or the model file it names) feeds into the planner, the simulator
//! or the reference executor is bounded here, so that no product of them overflows 64 bits, no
//! loop runs for hours and no buffer grows past a machine's memory. The bounds sit far above
//! every real training setup (the largest published models and clusters) and far below the
//! points where the arithmetic breaks; [`markdown_table`] renders them for the
//! docs/scenario-format.md "Limits" section so the documentation and the code cannot disagree.

/// An inclusive integer range one scenario or model key must lie in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Where the key is written (`[train] seq_len`, `HF config num_hidden_layers`, or a derived
    /// quantity such as `micro_batch x seq_len`).
    pub key: &'static str,
    /// Smallest accepted value.
    pub min: u64,
    /// Largest accepted value.
    pub max: u64,
    /// Why the bound is there (shown in errors and in the README table).
    pub why: &'static str,
}

impl Limit {
    /// Checks `value` against the range; the error names the key, the value, the range and
    /// the reason.
    pub fn check(&self, value: u64) -> Result<u64, String> {
        self.check_as(self.key, value)
    }

    /// [`Limit::check`] for a limit shared by several keys (the mesh degrees): the error names
    /// `key`, the key actually written.
    pub fn check_as(&self, key: &str, value: u64) -> Result<u64, String> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{key} = {value} is outside the accepted range {}..={} ({}); see \
                 docs/scenario-format.md (\"Limits\") for the limits",
                group(self.min),
                group(self.max),
                self.why
            ))
        }
    }

    /// Checks a command-line count: the error names `flag` (`--jobs 5000`), the range and the
    /// reason.
    pub fn check_flag(&self, flag: &str, value: u64) -> Result<u64, String> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{flag} {value} is outside the accepted range {}..={} ({})",
                group(self.min),
                group(self.max),
                self.why
            ))
        }
    }

    /// Checks a `usize` value (mesh degrees, layer counts).
    pub fn check_usize(&self, value: usize) -> Result<usize, String> {
        self.check(value as u64).map(|_| value)
    }
}

/// Sequence length in tokens (`[train] seq_len`).
pub const SEQ_LEN: Limit = Limit {
    key: "[train] seq_len",
    min: 1,
    max: 1 << 20,
    why: "1 Mi tokens, the longest published training context",
};

/// Global batch in sequences (`[train] global_batch`).
pub const GLOBAL_BATCH: Limit = Limit {
    key: "[train] global_batch",
    min: 1,
    max: 1 << 24,
    why: "16 Mi sequences per optimizer step",
};

/// Micro batch in sequences per data-parallel rank (`[train] micro_batch`).
pub const MICRO_BATCH: Limit = Limit {
    key: "[train] micro_batch",
    min: 1,
    max: 1 << 16,
    why: "64 Ki sequences per rank and micro-batch",
};

/// Tokens of one micro-batch on one rank (`micro_batch x seq_len`).
pub const MICRO_BATCH_TOKENS: Limit = Limit {
    key: "[train] micro_batch x seq_len",
    min: 1,
    max: 1 << 24,
    why: "16 Mi tokens per rank and micro-batch keeps activation sizes inside 64 bits",
};

/// Tokens of one optimizer step (`global_batch x seq_len`).
pub const TOKENS_PER_STEP: Limit = Limit {
    key: "[train] global_batch x seq_len",
    min: 1,
    max: 1 << 40,
    why: "1 Ti tokens per optimizer step",
};

/// Gradient-accumulation steps (`global_batch / (micro_batch x dp_replicate x dp_shard)`).
pub const GRAD_ACCUM_STEPS: Limit = Limit {
    key: "[train] global_batch / (micro_batch x data-parallel ranks)",
    min: 1,
    max: 1024,
    why: "micro-batches per step; every one is simulated op by op",
};

/// Micro-batch layer passes of one step (gradient-accumulation steps x decoder layers): the
/// length of the step program the simulator generates and runs.
pub const STEP_LAYER_PASSES: Limit = Limit {
    key: "gradient-accumulation steps x decoder layers",
    min: 1,
    max: 1 << 15,
    why: "bounds the simulated step program to seconds of work",
};

/// One parallel degree of `[mesh]` (`dp_replicate`, `dp_shard`, `cp`, `tp`, `ep`, `etp`,
/// `edp_replicate`, `edp_shard`).
pub const MESH_DEGREE: Limit = Limit {
    key: "[mesh] degree",
    min: 1,
    max: 1 << 21,
    why: "2 Mi ranks",
};

/// Ranks of the dense mesh (`dp_replicate x dp_shard x cp x tp`).
pub const WORLD_SIZE: Limit = Limit {
    key: "[mesh] dp_replicate x dp_shard x cp x tp",
    min: 1,
    max: 1 << 21,
    why: "2 Mi ranks, above the largest announced training clusters (about 1 M accelerators)",
};

/// Dies per machine (`[topology] dies_per_machine`).
pub const DIES_PER_MACHINE: Limit = Limit {
    key: "[topology] dies_per_machine",
    min: 1,
    max: 1024,
    why: "accelerator dies sharing one host",
};

/// Machines per supernode (`[topology] machines_per_supernode`).
pub const MACHINES_PER_SUPERNODE: Limit = Limit {
    key: "[topology] machines_per_supernode",
    min: 1,
    max: 1 << 16,
    why: "machines in one scale-up domain",
};

/// Supernodes (`[topology] supernodes`).
pub const SUPERNODES: Limit = Limit {
    key: "[topology] supernodes",
    min: 1,
    max: 1 << 16,
    why: "scale-up domains in the cluster",
};

/// FSDP units prefetched ahead (`[fsdp] prefetch_depth`, also per variant).
pub const PREFETCH_DEPTH: Limit = Limit {
    key: "[fsdp] prefetch_depth",
    min: 0,
    max: 64,
    why: "units gathered ahead; more than the model's units means all of them",
};

/// Gradient bucket size of megatron-ddp in bytes (`[fsdp.variant.*] bucket_bytes`).
pub const BUCKET_BYTES: Limit = Limit {
    key: "[fsdp.variant] bucket_bytes",
    min: 1,
    max: 1 << 40,
    why: "1 TiB per gradient bucket",
};

/// Chunks of a fused TP collective + GEMM pair (`[train] tp_comm_overlap_chunks`).
pub const TP_COMM_OVERLAP_CHUNKS: Limit = Limit {
    key: "[train] tp_comm_overlap_chunks",
    min: 1,
    max: 1024,
    why: "pipelined chunks of one fused pair",
};

/// Newton-Schulz iterations (`[optimizer.muon] ns_steps`).
pub const NS_STEPS: Limit = Limit {
    key: "[optimizer.muon] ns_steps",
    min: 1,
    max: 100,
    why: "Newton-Schulz iterations per step (5 in practice)",
};

/// Coefficient triples of a custom Muon preset (`[optimizer.muon] coefficients`).
pub const NS_COEFFICIENT_STEPS: Limit = Limit {
    key: "[optimizer.muon] coefficients (entries)",
    min: 1,
    max: 100,
    why: "one (a, b, c) triple per Newton-Schulz iteration",
};

/// Decoder layers of a model, main plus multi-token-prediction (`num_hidden_layers` +
/// `num_nextn_predict_layers` of the model file).
pub const MODEL_LAYERS: Limit = Limit {
    key: "model num_hidden_layers + mtp layers",
    min: 1,
    max: 1024,
    why: "8x the deepest published models; the planner enumerates every layer's parameters",
};

/// One dimension of a model file (`hidden_size`, `intermediate_size`, head counts and sizes,
/// `vocab_size`, expert counts, MLA ranks); the model checks which must be at least 1.
pub const MODEL_DIM: Limit = Limit {
    key: "model dimension (hidden_size, vocab_size, num_experts, ...)",
    min: 0,
    max: 1 << 31,
    why: "keeps every derived shape entry (a product of two dimensions) inside 64 bits",
};

/// Parameter entries the model IR enumerates (layers x parameters per layer, x experts for
/// the per-expert layout).
pub const MODEL_PARAM_ENTRIES: Limit = Limit {
    key: "model parameter entries",
    min: 1,
    max: 20_000_000,
    why: "the planner lists every parameter; per-expert layouts multiply the count",
};

/// `[[plan.override]]` entries of one scenario.
pub const PLAN_OVERRIDES: Limit = Limit {
    key: "[[plan.override]] entries",
    min: 0,
    max: 4096,
    why: "each override is matched against every parameter of the model",
};

/// Largest `routing_skew` (`[train] routing_skew`, a float >= 1.0).
pub const MAX_ROUTING_SKEW: f64 = 64.0;

/// Every integer limit, in README order.
pub const ALL: &[Limit] = &[
    SEQ_LEN,
    GLOBAL_BATCH,
    MICRO_BATCH,
    MICRO_BATCH_TOKENS,
    TOKENS_PER_STEP,
    GRAD_ACCUM_STEPS,
    STEP_LAYER_PASSES,
    MESH_DEGREE,
    WORLD_SIZE,
    DIES_PER_MACHINE,
    MACHINES_PER_SUPERNODE,
    SUPERNODES,
    PREFETCH_DEPTH,
    BUCKET_BYTES,
    TP_COMM_OVERLAP_CHUNKS,
    NS_STEPS,
    NS_COEFFICIENT_STEPS,
    MODEL_LAYERS,
    MODEL_DIM,
    MODEL_PARAM_ENTRIES,
    PLAN_OVERRIDES,
];

/// Command-line counts checked by this crate's users (README "Command-line limits").
pub const CLI: &[Limit] = &[SWEEP_POINTS, SWEEP_JOBS];

/// The byte cap and description of one kind of input file, read by
/// [`crate::input_file::read_text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// Name of the limit in errors and in the README table (`scenario file`).
    pub key: &'static str,
    /// What the file is for, in errors (`scenario file`, `GEMM table`).
    pub what: &'static str,
    /// Largest accepted size in bytes.
    pub max_bytes: u64,
    /// Why the cap is there.
    pub why: &'static str,
    /// What the user should give instead (`a scenario .toml file`), completing "give the path
    /// of ...".
    pub expect: &'static str,
}

/// Scenario files (`hpfsdp plan|simulate|verify|... SCENARIO.toml`, gate inputs).
pub const SCENARIO_FILE: FileLimit = FileLimit {
    key: "scenario file size",
    what: "scenario file",
    max_bytes: 4 << 20,
    why: "real scenarios are a few KiB",
    expect: "a scenario .toml file",
};

/// Model files a scenario names (`hf_config` JSON or `compact` TOML).
pub const MODEL_FILE: FileLimit = FileLimit {
    key: "model file size",
    what: "model file",
    max_bytes: 16 << 20,
    why: "real HF config.json files are a few KiB",
    expect: "an HF config.json or a compact model .toml file",
};

/// Hardware profiles (`scenarios/hardware/NAME.toml`).
pub const PROFILE_FILE: FileLimit = FileLimit {
    key: "hardware profile size",
    what: "hardware profile",
    max_bytes: 4 << 20,
    why: "the shipped profiles are a few KiB",
    expect: "a hardware profile .toml file",
};

/// Measured tables: a profile's GEMM table and `calibrate --from` tables (GEMM or collective
/// CSV, `hpfsdp collbench` / nccl-tests columns).
pub const TABLE_FILE: FileLimit = FileLimit {
    key: "measured table size",
    what: "measured table",
    max_bytes: 64 << 20,
    why: "about a million rows",
    expect: "a measured .csv table (thin out or split a larger one)",
};

/// Gate lock files (`hpfsdp gate --lock FILE`).
pub const LOCK_FILE: FileLimit = FileLimit {
    key: "gate lock size",
    what: "lock file",
    max_bytes: 64 << 20,
    why: "the shipped lock of eight scenarios is 8 KiB",
    expect: "a lock file written by `hpfsdp gate ... --update`",
};

/// Largest runs file (`calibrate --runs`, `scenarios/runs/*.toml`).
pub const RUNS_FILE: FileLimit = FileLimit {
    key: "runs file size",
    what: "runs file",
    max_bytes: 4 << 20,
    why: "the shipped runs files are a few KiB",
    expect: "a runs .toml file (docs/calibration.md)",
};

/// Every file-size limit, in README order.
pub const ALL_FILES: &[FileLimit] = &[
    SCENARIO_FILE,
    MODEL_FILE,
    PROFILE_FILE,
    TABLE_FILE,
    LOCK_FILE,
    RUNS_FILE,
];

/// Points of one `hpfsdp sweep` (the product of every `--vary` key's value count), checked
/// before the points are built.
pub const SWEEP_POINTS: Limit = Limit {
    key: "sweep --vary points (product of the value counts)",
    min: 1,
    max: 1 << 16,
    why: "64 Ki points; every point is a full simulation, so more would run for days",
};

/// Worker threads of one `hpfsdp sweep` (`--jobs`).
pub const SWEEP_JOBS: Limit = Limit {
    key: "sweep --jobs",
    min: 1,
    max: 1024,
    why: "threads simulating at once; each holds a whole simulation in memory",
};

/// `verify --timeout-s`, seconds (a float, checked with [`check_f64`]).
pub const MAX_COLLECTIVE_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// The product of `factors` (each `(name, value)`) checked against `limit`: an error naming
/// every factor when it overflows 64 bits or leaves the range.
pub fn checked_product(limit: &Limit, factors: &[(&str, u64)]) -> Result<u64, String> {
    let product = factors
        .iter()
        .try_fold(1u64, |acc, &(_, v)| acc.checked_mul(v));
    let written = factors
        .iter()
        .map(|(n, v)| format!("{n} {v}"))
        .collect::<Vec<_>>()
        .join(" x ");
    match product {
        Some(p) => limit.check(p).map_err(|e| format!("{written}: {e}")),
        None => Err(format!(
            "{written} overflows 64 bits; {} must stay within {}..={} ({})",
            limit.key,
            group(limit.min),
            group(limit.max),
            limit.why
        )),
    }
}

/// Checks a float that must be finite and within `min..=max`; `key` names it in the error.
pub fn check_f64(key: &str, value: f64, min: f64, max: f64) -> Result<f64, String> {
    if value.is_finite() && value >= min && value <= max {
        Ok(value)
    } else {
        Err(format!(
            "{key} = {value} must be a finite number in {min}..={max}"
        ))
    }
}

/// One Markdown row per limit: key, accepted range, why.
fn push_limit_rows(out: &mut String, limits: &[Limit]) {
    for l in limits {
        out.push_str(&format!(
            "| `{}` | {}..={} | {} |\n",
            l.key,
            group(l.min),
            group(l.max),
            l.why
        ));
    }
}

/// The limits as the Markdown table of docs/scenario-format.md ("Limits").
pub fn markdown_table() -> String {
    let mut out = String::from("| key | accepted range | why |\n|---|---|---|\n");
    push_limit_rows(&mut out, ALL);
    out.push_str(&format!(
        "| `[train] routing_skew` | 1.0..={MAX_ROUTING_SKEW} (finite) | busiest expert-parallel rank's token factor |\n"
    ));
    out
}

/// The file-size caps and command-line counts as a Markdown table (README "Input limits").
pub fn inputs_markdown_table() -> String {
    let mut out = String::from("| input | largest accepted | why |\n|---|---|---|\n");
    for f in ALL_FILES {
        out.push_str(&format!(
            "| {} | {} bytes ({} MiB); devices, FIFOs, sockets and directories are refused, symlinks are followed | {} |\n",
            f.what,
            group(f.max_bytes),
            f.max_bytes >> 20,
            f.why
        ));
    }
    push_limit_rows(&mut out, CLI);
    out.push_str(&format!(
        "| `verify --timeout-s` | above 0, up to {MAX_COLLECTIVE_TIMEOUT_S} (7 days) | bound on one collective wait under MPI |\n"
    ));
    out
}

/// `1048576` as `1,048,576`.
pub(crate) fn group(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_outside_the_range_names_key_value_and_range() {
        let e = SEQ_LEN.check(1 << 21).unwrap_err();
        assert!(e.contains("[train] seq_len = 2097152"), "{e}");
        assert!(e.contains("1..=1,048,576"), "{e}");
        assert_eq!(SEQ_LEN.check(4096), Ok(4096));
        assert!(SEQ_LEN.check(0).is_err());
        assert_eq!(PREFETCH_DEPTH.check(0), Ok(0));
    }

    #[test]
    fn an_overflowing_product_is_an_error_not_a_wrap() {
        let e = checked_product(
            &TOKENS_PER_STEP,
            &[("global_batch", u64::MAX / 2), ("seq_len", 4)],
        )
        .unwrap_err();
        assert!(e.contains("overflows 64 bits"), "{e}");
        assert_eq!(
            checked_product(&TOKENS_PER_STEP, &[("a", 1024), ("b", 4096)]),
            Ok(1 << 22)
        );
        assert!(checked_product(&TOKENS_PER_STEP, &[("a", 1 << 30), ("b", 1 << 20)]).is_err());
    }

    #[test]
    fn floats_must_be_finite_and_in_range() {
        assert!(check_f64("k", f64::NAN, 0.0, 1.0).is_err());
        assert!(check_f64("k", f64::INFINITY, 0.0, f64::MAX).is_err());
        assert!(check_f64("k", -0.5, 0.0, 1.0).is_err());
        assert_eq!(check_f64("k", 0.5, 0.0, 1.0), Ok(0.5));
    }

    #[test]
    fn the_readme_table_lists_every_limit() {
        let t = markdown_table();
        for l in ALL {
            assert!(t.contains(l.key), "{} missing", l.key);
        }
        assert!(t.contains("1,048,576"));
    }

    #[test]
    fn the_inputs_table_lists_every_file_cap_and_flag() {
        let t = inputs_markdown_table();
        for f in ALL_FILES {
            assert!(t.contains(f.what), "{} missing", f.what);
        }
        for l in CLI {
            assert!(t.contains(l.key), "{} missing", l.key);
        }
        assert!(t.contains("4,194,304 bytes (4 MiB)"), "{t}");
    }
}
