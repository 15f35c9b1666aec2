//! Fits the alpha-beta curve of each network tier (`tiers.<tier>.latency_us` and
//! `tiers.<tier>.efficiency`) to a measured collective table, so a user with a real cluster
//! calibrates the profile from their own benchmark.
//!
//! The table is what `hpfsdp collbench` writes, in nccl-tests conventions
//! (shared/reference/notes/backends-hardware.md section 6.4): columns exactly
//! `collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks`, where `size`
//! is the total array in bytes (all-gather output, reduce-scatter input, all-reduce buffer,
//! all-to-all send total), which is the `n` of the simulator's cost formulas
//! ([`crate::cost::formula_bytes`]). Lines starting with `#` are comments.
//!
//! Consistency with prediction: each row's time is modelled with the simulator's own
//! [`crate::cost::collective_phases`] for `ranks` ranks packed contiguously on the profile's
//! topology (hierarchical when the profile decomposes such a group). That time is affine in
//! the tier's latency and in the inverse of its efficiency, `t = t0 + alpha * L + T / eff`
//! (`L`, `T`, `t0` read off the formulas by evaluating them at two latencies and two
//! efficiencies), so the fit is a weighted linear least squares on relative time error, with
//! `alpha >= 0` and `eff <= 1` enforced (a constant pinned there is flagged).
//!
//! Unaligned buffers: HCCL loses bandwidth on buffers whose per-rank sizes are not multiples
//! of 512 bytes (the profile's `calibration.unaligned_bandwidth_factor`, applied to every
//! phase of such a collective). When a tier's table has aligned rows at two or more sizes and
//! bandwidth-bound unaligned rows as well (`hpfsdp collbench --min-bytes` at a size that is
//! not a power of two gives them), the tier is fitted on its other rows and the factor on the
//! bandwidth-bound unaligned rows of every such tier ([`BANDWIDTH_BOUND_SHARE`]): with the tier
//! fixed, such a row's time is affine in `1 / factor` ([`UnalignedFit`]). Latency-bound
//! unaligned rows stay in the tier fit at the profile's factor (they hardly depend on it).
//! Without aligned rows at two sizes, every row enters the tier fit at the profile's factor.

use super::error::CalibrationError;
use crate::cost::collective_phases;
use crate::profile::HardwareProfile;
use crate::shape::GroupShape;
use hpfsdp_plan::{CollectiveKind, Tier};

/// The column names a collective table must have, in order.
pub const COLLECTIVE_COLUMNS: [&str; 12] = [
    "collective",
    "size",
    "count",
    "type",
    "redop",
    "root",
    "time_us",
    "algbw",
    "busbw",
    "#wrong",
    "tier",
    "ranks",
];

/// One measured row of a collective table.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveRow {
    /// 1-based line in the file.
    pub line: usize,
    /// The collective.
    pub kind: CollectiveKind,
    /// nccl-tests `size`: total array bytes.
    pub size_bytes: u64,
    /// Measured time, microseconds.
    pub time_us: f64,
    /// The tier the benchmark ran on.
    pub tier: Tier,
    /// Ranks in the benchmark's group.
    pub ranks: usize,
}

/// The nccl-tests name of a collective (`all_gather`, `reduce_scatter`, ...).
pub fn collective_name(kind: CollectiveKind) -> &'static str {
    match kind {
        CollectiveKind::AllGather => "all_gather",
        CollectiveKind::ReduceScatter => "reduce_scatter",
        CollectiveKind::AllReduce => "all_reduce",
        CollectiveKind::Broadcast => "broadcast",
        CollectiveKind::AllToAll => "alltoall",
        CollectiveKind::AllToAllV => "alltoallv",
        CollectiveKind::SendRecv => "sendrecv",
    }
}

fn parse_kind(s: &str) -> Option<CollectiveKind> {
    let k = s.trim().to_ascii_lowercase().replace(['-', '_'], "");
    Some(match k.as_str() {
        "allgather" => CollectiveKind::AllGather,
        "reducescatter" => CollectiveKind::ReduceScatter,
        "allreduce" => CollectiveKind::AllReduce,
        "broadcast" => CollectiveKind::Broadcast,
        "alltoall" => CollectiveKind::AllToAll,
        "alltoallv" => CollectiveKind::AllToAllV,
        "sendrecv" => CollectiveKind::SendRecv,
        _ => return None,
    })
}

/// The table name of a tier (`intra-machine`, ...).
pub fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::IntraMachine => "intra-machine",
        Tier::IntraSupernode => "intra-supernode",
        Tier::InterSupernode => "inter-supernode",
    }
}

/// The profile key prefix of a tier (`tiers.intra_machine`).
pub fn tier_key(tier: Tier) -> &'static str {
    match tier {
        Tier::IntraMachine => "tiers.intra_machine",
        Tier::IntraSupernode => "tiers.intra_supernode",
        Tier::InterSupernode => "tiers.inter_supernode",
    }
}

fn parse_tier(s: &str) -> Option<Tier> {
    Tier::ALL.into_iter().find(|t| tier_name(*t) == s.trim())
}

/// True when the header is a collective table's (its first column is `collective`).
pub fn is_collective_header(header: &[&str]) -> bool {
    header.first().is_some_and(|h| h.trim() == "collective")
}

/// Parses a collective table; errors name the file, line and column.
pub fn parse_collective_table(
    text: &str,
    file: &str,
) -> Result<Vec<CollectiveRow>, CalibrationError> {
    let bad = |line: usize, column: &str, message: String| CalibrationError::Table {
        file: file.to_string(),
        line,
        column: column.to_string(),
        message,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (hline, header) = lines
        .next()
        .ok_or_else(|| bad(0, "-", "empty table: expected a header line".into()))?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if cols != COLLECTIVE_COLUMNS {
        return Err(bad(
            hline,
            "-",
            format!(
                "header is '{header}'; a collective table needs exactly '{}'",
                COLLECTIVE_COLUMNS.join(",")
            ),
        ));
    }
    let mut rows = Vec::new();
    for (line, l) in lines {
        let cells: Vec<&str> = l.split(',').map(str::trim).collect();
        if cells.len() != COLLECTIVE_COLUMNS.len() {
            return Err(bad(
                line,
                "-",
                format!(
                    "{} cells, expected {}",
                    cells.len(),
                    COLLECTIVE_COLUMNS.len()
                ),
            ));
        }
        let kind = parse_kind(cells[0]).ok_or_else(|| {
            bad(
                line,
                "collective",
                format!(
                    "unknown collective '{}'; use all_gather, reduce_scatter, all_reduce, \
                     broadcast, alltoall or sendrecv",
                    cells[0]
                ),
            )
        })?;
        let size_bytes: u64 = cells[1]
            .parse()
            .map_err(|_| bad(line, "size", format!("'{}' is not a byte count", cells[1])))?;
        let time_us: f64 = cells[6]
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t > 0.0)
            .ok_or_else(|| {
                bad(
                    line,
                    "time_us",
                    format!("'{}' is not a positive time in microseconds", cells[6]),
                )
            })?;
        let tier = parse_tier(cells[10]).ok_or_else(|| {
            bad(
                line,
                "tier",
                format!(
                    "unknown tier '{}'; use intra-machine, intra-supernode or inter-supernode",
                    cells[10]
                ),
            )
        })?;
        let ranks: usize = cells[11].parse().ok().filter(|r| *r >= 2).ok_or_else(|| {
            bad(
                line,
                "ranks",
                format!("'{}' is not a count >= 2", cells[11]),
            )
        })?;
        if cells[9] != "0" && cells[9] != "N/A" && !cells[9].is_empty() {
            return Err(bad(
                line,
                "#wrong",
                format!(
                    "{} wrong elements: the benchmark's results were incorrect; rerun it and \
                     drop this row",
                    cells[9]
                ),
            ));
        }
        rows.push(CollectiveRow {
            line,
            kind,
            size_bytes,
            time_us,
            tier,
            ranks,
        });
    }
    if rows.is_empty() {
        return Err(bad(0, "-", "the table has a header but no rows".into()));
    }
    Ok(rows)
}

/// Per-rank send and receive bytes of a collective whose nccl-tests `size` is `n`.
fn buffers(kind: CollectiveKind, n: u64, p: usize) -> (u64, u64) {
    let shard = n / p as u64;
    match kind {
        CollectiveKind::AllGather => (shard, n),
        CollectiveKind::ReduceScatter => (n, shard),
        _ => (n, n),
    }
}

/// Whether both per-rank buffers of a row are multiples of 512 bytes (HCCL's fast path; the
/// simulator's `aligned_512`).
pub fn is_aligned(row: &CollectiveRow) -> bool {
    let (input, output) = buffers(row.kind, row.size_bytes, row.ranks);
    input % 512 == 0 && output % 512 == 0
}

/// The simulator's predicted time (seconds) of a row with the profile as given.
pub fn predicted_s(row: &CollectiveRow, profile: &HardwareProfile) -> f64 {
    let topology = profile.topology_for(row.ranks);
    let ranks: Vec<usize> = (0..row.ranks).collect();
    let shape = GroupShape::of(&ranks, &topology);
    let (input, output) = buffers(row.kind, row.size_bytes, row.ranks);
    collective_phases(row.kind, &shape, input, output, is_aligned(row), profile)
        .iter()
        .map(|p| p.cost.total_s())
        .sum()
}

/// The fit's per-row terms: `t = t0 + alpha_us * l + t_inv_eff / eff`, seconds.
fn affine_terms(row: &CollectiveRow, profile: &HardwareProfile) -> (f64, f64, f64) {
    let at = |latency_us: f64, efficiency: f64| {
        let mut p = profile.clone();
        let spec = tier_spec_mut(&mut p, row.tier);
        spec.latency_us = latency_us;
        spec.efficiency = efficiency;
        predicted_s(row, &p)
    };
    let base = at(0.0, 1.0);
    let transfer = at(0.0, 0.5) - base;
    let latency = at(1.0, 1.0) - base;
    (base - transfer, latency, transfer)
}

fn tier_spec_mut(profile: &mut HardwareProfile, tier: Tier) -> &mut crate::profile::TierSpec {
    match tier {
        Tier::IntraMachine => &mut profile.tiers.intra_machine,
        Tier::IntraSupernode => &mut profile.tiers.intra_supernode,
        Tier::InterSupernode => &mut profile.tiers.inter_supernode,
    }
}

/// One row of a tier fit.
#[derive(Debug, Clone, PartialEq)]
pub struct RowFit {
    /// The measured row.
    pub row: CollectiveRow,
    /// Time predicted with the fitted tier, microseconds.
    pub predicted_us: f64,
}

impl RowFit {
    /// `predicted / measured - 1`.
    pub fn relative_error(&self) -> f64 {
        self.predicted_us / self.row.time_us - 1.0
    }
}

/// The fitted alpha-beta curve of one tier.
#[derive(Debug, Clone, PartialEq)]
pub struct TierFit {
    /// The tier.
    pub tier: Tier,
    /// Fitted `tiers.<tier>.latency_us`.
    pub latency_us: f64,
    /// Fitted `tiers.<tier>.efficiency` (of the tier's nominal bandwidth).
    pub efficiency: f64,
    /// The latency was pinned at 0 (the data wanted a negative one).
    pub latency_at_bound: bool,
    /// The efficiency was pinned at 1 (the data wanted more than the nominal bandwidth:
    /// check the profile's `bandwidth_bytes_per_s`).
    pub efficiency_at_bound: bool,
    /// Every row with its prediction.
    pub rows: Vec<RowFit>,
}

impl TierFit {
    /// Root mean square relative error of the rows.
    pub fn rms_relative_error(&self) -> f64 {
        rms(&self.rows)
    }
}

/// Weighted least squares of `y = a x1 + b x2` with weights `w`; `None` when singular.
fn lsq2(points: &[(f64, f64, f64, f64)]) -> Option<(f64, f64)> {
    let (mut s11, mut s12, mut s22, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x1, x2, y, w) in points {
        s11 += w * x1 * x1;
        s12 += w * x1 * x2;
        s22 += w * x2 * x2;
        s1y += w * x1 * y;
        s2y += w * x2 * y;
    }
    let det = s11 * s22 - s12 * s12;
    if det.abs() <= 1e-12 * (s11 * s22).abs() || det == 0.0 {
        return None;
    }
    Some(((s1y * s22 - s2y * s12) / det, (s11 * s2y - s12 * s1y) / det))
}

/// Weighted least squares of `y = b x` alone.
fn lsq1(points: impl Iterator<Item = (f64, f64, f64)>) -> f64 {
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for (x, y, w) in points {
        sxx += w * x * x;
        sxy += w * x * y;
    }
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// Fits one tier's latency and efficiency to its rows (at least two sizes needed).
pub fn fit_tier(
    tier: Tier,
    rows: &[CollectiveRow],
    profile: &HardwareProfile,
    file: &str,
) -> Result<TierFit, CalibrationError> {
    // Per row: (L, T, y = t_measured - t0, weight = 1 / t_measured^2): relative error.
    let pts: Vec<(f64, f64, f64, f64)> = rows
        .iter()
        .map(|r| {
            let (t0, l, t) = affine_terms(r, profile);
            let m = r.time_us * 1e-6;
            (l, t, m - t0, 1.0 / (m * m))
        })
        .collect();
    let single_size = rows.iter().all(|r| r.size_bytes == rows[0].size_bytes);
    let solved = if single_size { None } else { lsq2(&pts) };
    let (mut alpha, mut inv_eff) = solved.ok_or_else(|| CalibrationError::Table {
        file: file.to_string(),
        line: 0,
        column: "size".into(),
        message: format!(
            "the {} rows cannot separate latency from bandwidth: measure at least two \
             different sizes (a small one, latency-bound, and a large one)",
            tier_name(tier)
        ),
    })?;
    let mut latency_at_bound = false;
    let mut efficiency_at_bound = false;
    if alpha < 0.0 {
        alpha = 0.0;
        latency_at_bound = true;
        inv_eff = lsq1(pts.iter().map(|&(_, t, y, w)| (t, y, w)));
    }
    if inv_eff < 1.0 {
        inv_eff = 1.0;
        efficiency_at_bound = true;
        alpha = lsq1(pts.iter().map(|&(l, t, y, w)| (l, y - t, w))).max(0.0);
        latency_at_bound = alpha == 0.0;
    }
    let mut fitted = profile.clone();
    let spec = tier_spec_mut(&mut fitted, tier);
    spec.latency_us = alpha;
    spec.efficiency = 1.0 / inv_eff;
    let rows = rows
        .iter()
        .map(|r| RowFit {
            row: r.clone(),
            predicted_us: predicted_s(r, &fitted) * 1e6,
        })
        .collect();
    Ok(TierFit {
        tier,
        latency_us: alpha,
        efficiency: 1.0 / inv_eff,
        latency_at_bound,
        efficiency_at_bound,
        rows,
    })
}

/// The unaligned-buffer factor fitted from a table's unaligned rows.
#[derive(Debug, Clone, PartialEq)]
pub struct UnalignedFit {
    /// Fitted `calibration.unaligned_bandwidth_factor` (bandwidth on unaligned buffers over
    /// aligned ones).
    pub factor: f64,
    /// The factor was pinned at 1 (the unaligned rows were no slower than the aligned fit).
    pub at_bound: bool,
    /// Every unaligned row with its prediction at the fitted factor and tiers.
    pub rows: Vec<RowFit>,
}

impl UnalignedFit {
    /// Root mean square relative error of the rows.
    pub fn rms_relative_error(&self) -> f64 {
        rms(&self.rows)
    }
}

/// Everything one collective table fits.
#[derive(Debug, Clone, PartialEq)]
pub struct TableFit {
    /// One alpha-beta fit per tier with rows, fastest tier first.
    pub tiers: Vec<TierFit>,
    /// The unaligned-buffer factor, when some tier has aligned rows at two sizes and
    /// unaligned rows as well.
    pub unaligned: Option<UnalignedFit>,
}

fn rms(rows: &[RowFit]) -> f64 {
    let n = rows.len().max(1) as f64;
    (rows.iter().map(|r| r.relative_error().powi(2)).sum::<f64>() / n).sqrt()
}

/// Fits every tier that has rows in the table, fastest tier first, then the unaligned-buffer
/// factor (see the module documentation for which rows fit what).
pub fn fit_collective_table(
    rows: &[CollectiveRow],
    profile: &HardwareProfile,
    file: &str,
) -> Result<TableFit, CalibrationError> {
    for r in rows {
        let topology = profile.topology_for(r.ranks);
        let ranks: Vec<usize> = (0..r.ranks).collect();
        let actual = topology.tier_of(&ranks);
        if actual != r.tier {
            return Err(CalibrationError::Table {
                file: file.to_string(),
                line: r.line,
                column: "tier".into(),
                message: format!(
                    "{} ranks packed contiguously on profile '{}' ({} dies per machine, {} \
                     machines per supernode) span {}, not {}: fix the tier or the profile",
                    r.ranks,
                    profile.name,
                    profile.topology.dies_per_machine,
                    profile.topology.machines_per_supernode,
                    tier_name(actual),
                    tier_name(r.tier)
                ),
            });
        }
    }
    let mut tiers = Vec::new();
    let mut unaligned_rows = Vec::new();
    for tier in Tier::ALL {
        let mine: Vec<CollectiveRow> = rows.iter().filter(|r| r.tier == tier).cloned().collect();
        if mine.is_empty() {
            continue;
        }
        let (for_factor, rest): (Vec<_>, Vec<_>) = mine
            .iter()
            .cloned()
            .partition(|r| !is_aligned(r) && transfer_share(r, profile) >= BANDWIDTH_BOUND_SHARE);
        let aligned: Vec<CollectiveRow> = rest.iter().filter(|r| is_aligned(r)).cloned().collect();
        let sizes = |rows: &[CollectiveRow]| {
            let mut s: Vec<u64> = rows.iter().map(|r| r.size_bytes).collect();
            s.sort_unstable();
            s.dedup();
            s.len()
        };
        if !for_factor.is_empty() && sizes(&aligned) >= 2 {
            tiers.push(fit_tier(tier, &rest, profile, file)?);
            unaligned_rows.extend(for_factor);
        } else {
            tiers.push(fit_tier(tier, &mine, profile, file)?);
        }
    }
    let unaligned = (!unaligned_rows.is_empty())
        .then(|| fit_unaligned(&unaligned_rows, &with_tier_fits(profile, &tiers)));
    Ok(TableFit { tiers, unaligned })
}

/// An unaligned row fits the unaligned-buffer factor only when at least this share of its
/// time is transfer (at factor 1 with the starting profile): a latency-bound row hardly
/// depends on the factor, so its model error would land in it.
pub const BANDWIDTH_BOUND_SHARE: f64 = 0.5;

/// The share of a row's predicted time that is transfer, at unaligned factor 1.
fn transfer_share(row: &CollectiveRow, profile: &HardwareProfile) -> f64 {
    let at = |factor: f64| predicted_s(row, &with_unaligned_factor(profile, factor));
    let t1 = at(1.0);
    if t1 > 0.0 { (at(0.5) - t1) / t1 } else { 0.0 }
}

/// `profile` with its unaligned-buffer factor set to `factor`.
fn with_unaligned_factor(profile: &HardwareProfile, factor: f64) -> HardwareProfile {
    let mut p = profile.clone();
    p.calibration.unaligned_bandwidth_factor = factor;
    p
}

/// `profile` with every tier fit's latency and efficiency.
pub fn with_tier_fits(profile: &HardwareProfile, tiers: &[TierFit]) -> HardwareProfile {
    let mut p = profile.clone();
    for f in tiers {
        let spec = tier_spec_mut(&mut p, f.tier);
        spec.latency_us = f.latency_us;
        spec.efficiency = f.efficiency;
    }
    p
}

/// Fits the unaligned-buffer factor to `rows` (all unaligned) with the tiers of `fitted`
/// fixed: each row's time is `t_lat + T / factor` (`T` its transfer time at factor 1, read
/// off two evaluations), a weighted least squares in `1 / factor` on relative error, with
/// `factor <= 1` enforced.
fn fit_unaligned(rows: &[CollectiveRow], fitted: &HardwareProfile) -> UnalignedFit {
    let at = |factor: f64| with_unaligned_factor(fitted, factor);
    let (full, half) = (at(1.0), at(0.5));
    let points = rows.iter().map(|r| {
        let t1 = predicted_s(r, &full);
        let transfer = predicted_s(r, &half) - t1;
        let m = r.time_us * 1e-6;
        (transfer, m - (t1 - transfer), 1.0 / (m * m))
    });
    let inv = lsq1(points);
    let at_bound = inv < 1.0;
    let factor = 1.0 / inv.max(1.0);
    let profile = at(factor);
    UnalignedFit {
        factor,
        at_bound,
        rows: rows
            .iter()
            .map(|r| RowFit {
                row: r.clone(),
                predicted_us: predicted_s(r, &profile) * 1e6,
            })
            .collect(),
    }
}

/// nccl-tests algorithm and bus bandwidth (bytes per second) of `size` bytes in `time_s` on
/// `p` ranks (busbw factors of section 6.4).
pub fn algbw_busbw(kind: CollectiveKind, size_bytes: u64, time_s: f64, p: usize) -> (f64, f64) {
    let algbw = size_bytes as f64 / time_s;
    let n = p as f64;
    let factor = match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveKind::AllGather
        | CollectiveKind::ReduceScatter
        | CollectiveKind::AllToAll
        | CollectiveKind::AllToAllV => (n - 1.0) / n,
        CollectiveKind::Broadcast | CollectiveKind::SendRecv => 1.0,
    };
    (algbw, algbw * factor)
}
