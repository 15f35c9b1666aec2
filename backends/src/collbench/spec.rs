//! Parsing collbench's command-line values: byte sizes (`8`, `64K`, `256M`, `1G`), the
//! collective list and the group layout.

use crate::group::Group;

/// A collective collbench can sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BenchKind {
    /// All-gather (size = the gathered output per rank).
    AllGather,
    /// Reduce-scatter (size = the input per rank).
    ReduceScatter,
    /// All-reduce (size = the buffer).
    AllReduce,
    /// Broadcast from the group's first rank (size = the buffer).
    Broadcast,
    /// All-to-all (size = the send buffer per rank).
    AllToAll,
}

impl BenchKind {
    /// Every kind, in sweep order.
    pub const ALL: [BenchKind; 5] = [
        BenchKind::AllGather,
        BenchKind::ReduceScatter,
        BenchKind::AllReduce,
        BenchKind::Broadcast,
        BenchKind::AllToAll,
    ];

    /// The name (the plan's kebab-case collective names).
    pub fn name(self) -> &'static str {
        match self {
            BenchKind::AllGather => "all-gather",
            BenchKind::ReduceScatter => "reduce-scatter",
            BenchKind::AllReduce => "all-reduce",
            BenchKind::Broadcast => "broadcast",
            BenchKind::AllToAll => "all-to-all",
        }
    }

    /// nccl-tests' bus-bandwidth factor for a group of `n` ranks (doc/PERFORMANCE.md):
    /// all-reduce `2(n-1)/n`, all-gather, reduce-scatter and all-to-all `(n-1)/n`,
    /// broadcast 1.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            BenchKind::AllReduce => 2.0 * (n - 1.0) / n,
            BenchKind::AllGather | BenchKind::ReduceScatter | BenchKind::AllToAll => (n - 1.0) / n,
            BenchKind::Broadcast => 1.0,
        }
    }

    /// Whether `size` is split into one chunk per rank (count = size / (n x element)).
    pub fn chunked(self) -> bool {
        matches!(
            self,
            BenchKind::AllGather | BenchKind::ReduceScatter | BenchKind::AllToAll
        )
    }
}

/// Parses a comma-separated list of kinds (`all` = every kind).
pub fn parse_kinds(text: &str) -> Result<Vec<BenchKind>, String> {
    if text.trim() == "all" {
        return Ok(BenchKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let k = BenchKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                format!(
                    "--kinds: unknown collective '{name}'; choose from {} (or all)",
                    BenchKind::ALL.map(BenchKind::name).join(", ")
                )
            })?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err("--kinds: no collective given".into());
    }
    Ok(out)
}

/// Parses a byte size: digits with an optional `K`, `M` or `G` suffix (powers of 1024, as
/// nccl-tests' `-b`/`-e`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("'{text}' is not a byte size; use e.g. 8, 64K, 256M or 1G"))
}

/// How ranks are grouped: `world` (one group of every rank), `size:K` (contiguous blocks of
/// K ranks, run concurrently) or explicit groups `0,1;2,3` / `0-3;4-7` (ranks in no group
/// only take part in the timing).
pub fn parse_groups(text: &str, world_size: usize) -> Result<Vec<Group>, String> {
    let t = text.trim();
    let bad = |why: String| format!("--groups '{text}': {why}");
    if t == "world" {
        return Group::world(world_size)
            .map(|g| vec![g])
            .map_err(|e| bad(e.to_string()));
    }
    if let Some(k) = t.strip_prefix("size:") {
        let k: usize = k
            .parse()
            .map_err(|_| bad(format!("'{k}' is not a group size")))?;
        if k == 0 || !world_size.is_multiple_of(k) {
            return Err(bad(format!(
                "group size {k} does not divide the {world_size} ranks"
            )));
        }
        return (0..world_size / k)
            .map(|b| Group::new(format!("size{k}.{b}"), (b * k..(b + 1) * k).collect()))
            .collect::<Result<_, _>>()
            .map_err(|e| bad(e.to_string()));
    }
    let mut groups = Vec::new();
    let mut used = vec![false; world_size];
    for (gi, part) in t.split(';').enumerate() {
        let mut ranks = Vec::new();
        for item in part.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (item, item),
            };
            let (a, b): (usize, usize) = match (a.parse(), b.parse()) {
                (Ok(a), Ok(b)) if a <= b => (a, b),
                _ => return Err(bad(format!("'{item}' is not a rank or a range a-b"))),
            };
            ranks.extend(a..=b);
        }
        ranks.sort_unstable();
        for &r in &ranks {
            if r >= world_size {
                return Err(bad(format!("rank {r} is outside the {world_size} ranks")));
            }
            if used[r] {
                return Err(bad(format!("rank {r} is in two groups")));
            }
            used[r] = true;
        }
        groups.push(Group::new(format!("g{gi}"), ranks).map_err(|e| bad(e.to_string()))?);
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_kinds_and_groups() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("256M").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert!(parse_bytes("12X").is_err());
        assert_eq!(parse_kinds("all").unwrap().len(), 5);
        assert_eq!(
            parse_kinds("all-reduce,broadcast").unwrap(),
            vec![BenchKind::AllReduce, BenchKind::Broadcast]
        );
        assert!(
            parse_kinds("gather")
                .unwrap_err()
                .contains("unknown collective")
        );
        assert_eq!(parse_groups("size:2", 4).unwrap().len(), 2);
        assert!(parse_groups("size:3", 4).is_err());
        let g = parse_groups("0-1;2,3", 4).unwrap();
        assert_eq!(g[1].ranks(), &[2, 3]);
        assert!(
            parse_groups("0,1;1,2", 4)
                .unwrap_err()
                .contains("two groups")
        );
        assert!((BenchKind::AllReduce.busbw_factor(4) - 1.5).abs() < 1e-12);
        assert!((BenchKind::AllGather.busbw_factor(4) - 0.75).abs() < 1e-12);
        assert_eq!(BenchKind::Broadcast.busbw_factor(4), 1.0);
    }
}
