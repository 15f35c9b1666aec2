//! Canonical display order of category, stream, tier and memory-tag names.
//!
//! Names in the report model are strings; this module sorts them the way the plan model
//! enumerates them (known names first, in enum order, then unknown names alphabetically), so
//! tables, CSV columns and charts list them in the same, deterministic order.

use hpfsdp_plan::Tier;
use hpfsdp_program::step::{Category, MemTag, Stream};
use std::collections::BTreeSet;

/// Sort key of a name: its position among `known` names, else after all of them by name.
fn key<'a>(known: &[String], name: &'a str) -> (usize, &'a str) {
    match known.iter().position(|k| k == name) {
        Some(i) => (i, ""),
        None => (known.len(), name),
    }
}

/// Sorts and deduplicates `names` with `known` names first (in that order).
fn sorted<'a, I>(known: &[String], names: I) -> Vec<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let unique: BTreeSet<&str> = names.into_iter().collect();
    let mut out: Vec<&str> = unique.into_iter().collect();
    out.sort_by(|a, b| key(known, a).cmp(&key(known, b)));
    out.into_iter().map(str::to_string).collect()
}

/// Category names in [`Category::ALL`] order, unknown ones last.
pub fn categories<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Vec<String> {
    let known: Vec<String> = Category::ALL.iter().map(|c| c.name().to_string()).collect();
    sorted(&known, names)
}

/// Stream names in the plan's stream order (compute, copy, all-gather, ..., aux0..aux255,
/// host), unknown ones last.
pub fn streams<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Vec<String> {
    let mut known: Vec<String> = [
        Stream::Compute,
        Stream::Copy,
        Stream::AllGather,
        Stream::ReduceScatter,
        Stream::AllReduce,
        Stream::Parallel,
        Stream::Optimizer,
    ]
    .iter()
    .map(|s| s.name())
    .collect();
    known.extend((0..=u8::MAX).map(|n| Stream::Aux(n).name()));
    known.push(Stream::Host.name());
    sorted(&known, names)
}

/// What a numbered stream lane carries, for chart legends (the named lanes say it
/// themselves): `aux0` is the Muon replica broadcasts' stream (`REPLICA_STREAM` of the
/// HyperParallel Muon strategy, the replicate process group's stream), `aux1` the expert
/// shard group's stream, which runs its all-gathers and reduce-scatters (`EXPERT_SHARD_STREAM`
/// of the step emitter; c10d runs each process group's collectives on its own stream).
pub fn stream_note(name: &str) -> Option<&'static str> {
    match name {
        "aux0" => Some("Muon replica broadcasts"),
        "aux1" => Some("expert shard group AG/RS"),
        _ => None,
    }
}

/// Tier names from the fastest to the slowest tier, unknown ones last.
pub fn tiers<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Vec<String> {
    let known: Vec<String> = Tier::ALL.iter().map(|t| t.name().to_string()).collect();
    sorted(&known, names)
}

/// Memory tag names in [`MemTag::ALL`] order, unknown ones last.
pub fn mem_tags<'a, I: IntoIterator<Item = &'a str>>(names: I) -> Vec<String> {
    let known: Vec<String> = MemTag::ALL.iter().map(|t| t.name().to_string()).collect();
    sorted(&known, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_first_in_enum_order() {
        assert_eq!(
            categories(["zz", "tp", "compute", "fsdp-ag", "tp"]),
            ["fsdp-ag", "tp", "compute", "zz"]
        );
        assert_eq!(
            streams(["host", "aux10", "aux2", "compute", "weird"]),
            ["compute", "aux2", "aux10", "host", "weird"]
        );
        assert_eq!(
            tiers(["inter-supernode", "intra-machine"]),
            ["intra-machine", "inter-supernode"]
        );
    }

    #[test]
    fn the_replica_stream_note_names_the_programs_stream() {
        let replica = hpfsdp_program::strategy::muon::hyperparallel::REPLICA_STREAM.name();
        assert_eq!(stream_note(&replica), Some("Muon replica broadcasts"));
        assert_eq!(stream_note("compute"), None);
    }
}
