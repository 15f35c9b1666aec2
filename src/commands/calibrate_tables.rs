//! `hpfsdp calibrate --from TABLE.csv`: fit the profile's curves from a user's own measured
//! tables. A collective table (nccl-tests / `hpfsdp collbench` columns) refits each measured
//! tier's latency and efficiency; a GEMM table (`m,n,k,dtype,time_us`) becomes the profile's
//! GEMM efficiency table. The fitted values go into the profile used for the comparison that
//! follows and into the edits `--write-profile` applies.

use anyhow::{Context, Result, bail};
use hpfsdp_reports::table::{Section, Table};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::coll_table::{
    CollectiveRow, RowFit, TableFit, algbw_busbw, collective_name, fit_collective_table,
    is_collective_header, parse_collective_table, tier_key, tier_name,
};
use hpfsdp_sim::calibration::gemm_table::{
    GemmRow, efficiency_text, gemm_table_csv, is_gemm_header, parse_gemm_table,
};
use hpfsdp_sim::calibration::params::{SourcedRange, get, outside_sourced_ranges, set};
use hpfsdp_sim::calibration::profile_edit::{Edit, EditValue};
use std::path::{Path, PathBuf};

/// What the measured tables gave.
#[derive(Debug, Default)]
pub struct FromTables {
    /// Per collective table: its path and its fits (tiers, unaligned-buffer factor).
    pub collective_fits: Vec<(String, TableFit)>,
    /// Per GEMM table: its path and its rows.
    pub gemm_tables: Vec<(String, Vec<GemmRow>)>,
    /// Profile edits for `--write-profile`.
    pub edits: Vec<Edit>,
    /// GEMM table files to write beside the written profile: (file name, CSV text).
    pub gemm_outputs: Vec<(String, String)>,
}

fn first_header_cells(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(',').map(str::trim).collect())
        .unwrap_or_default()
}

/// Reads every `--from` table, fits it, applies the collective fits to `profile` and returns
/// the fits and the profile edits. `gemm_name` names the profile's GEMM table file.
pub fn apply_tables(
    files: &[PathBuf],
    profile: &mut HardwareProfile,
    gemm_name: &str,
) -> Result<FromTables> {
    let mut out = FromTables::default();
    for path in files {
        let file = path.display().to_string();
        let text = hpfsdp_plan::input_file::read_text(path, &hpfsdp_plan::limits::TABLE_FILE)
            .context("--from")?;
        let header = first_header_cells(&text);
        if is_collective_header(&header) {
            let rows: Vec<CollectiveRow> = parse_collective_table(&text, &file)?;
            let fits = fit_collective_table(&rows, profile, &file)?;
            for f in &fits.tiers {
                for (field, value) in [("latency_us", f.latency_us), ("efficiency", f.efficiency)] {
                    let key = format!("{}.{field}", tier_key(f.tier));
                    set(profile, &key, value);
                    out.edits.push(Edit {
                        key,
                        value: EditValue::Number(value),
                        comment: format!(
                            "FITTED by `hpfsdp calibrate --from {file}` ({} rows, rms error {:.1}%)",
                            f.rows.len(),
                            f.rms_relative_error() * 100.0
                        ),
                    });
                }
            }
            if let Some(u) = &fits.unaligned {
                let key = "calibration.unaligned_bandwidth_factor".to_string();
                set(profile, &key, u.factor);
                out.edits.push(Edit {
                    key,
                    value: EditValue::Number(u.factor),
                    comment: format!(
                        "FITTED by `hpfsdp calibrate --from {file}` ({} rows not 512-byte aligned \
                         against the tiers fitted on the aligned rows, rms error {:.1}%{})",
                        u.rows.len(),
                        u.rms_relative_error() * 100.0,
                        if u.at_bound { ", AT BOUND 1.0" } else { "" }
                    ),
                });
            }
            out.collective_fits.push((file, fits));
        } else if is_gemm_header(&header) {
            let rows = parse_gemm_table(&text, &file, profile)?;
            out.gemm_outputs
                .push((gemm_name.to_string(), gemm_table_csv(&rows, profile, &file)));
            out.edits.push(Edit {
                key: "compute.gemm_table".into(),
                value: EditValue::Text(gemm_name.to_string()),
                comment: format!("MEASURED by `hpfsdp calibrate --from {file}`"),
            });
            out.gemm_tables.push((file, rows));
        } else {
            bail!(
                "{file}: header '{}' is neither a collective table \
                 (collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks) \
                 nor a GEMM table (m,n,k,dtype,time_us)",
                header.join(",")
            );
        }
    }
    if out.gemm_outputs.len() > 1 {
        bail!("more than one GEMM table given with --from; merge them into one file");
    }
    Ok(out)
}

/// Report sections of the table fits: per collective table a summary of its fits and every
/// row, then per GEMM table its efficiencies.
pub fn sections(from: &FromTables, profile: &HardwareProfile) -> Vec<Section> {
    let mut out = Vec::new();
    for (file, fits) in &from.collective_fits {
        out.extend(collective_sections(file, fits));
    }
    for (file, rows) in &from.gemm_tables {
        out.push(gemm_section(file, rows, profile));
    }
    out
}

/// The summary of one collective table's fits (tiers, unaligned factor) and its residual per
/// row.
fn collective_sections(file: &str, fits: &TableFit) -> Vec<Section> {
    let mut out = Vec::new();
    let mut summary: Vec<Vec<String>> = fits
        .tiers
        .iter()
        .map(|f| {
            vec![
                tier_name(f.tier).to_string(),
                format!("{:.3}", f.latency_us),
                format!(
                    "{:.4}{}",
                    f.efficiency,
                    if f.efficiency_at_bound {
                        " (AT BOUND 1.0)"
                    } else {
                        ""
                    }
                ),
                format!("{}", f.rows.len()),
                format!("{:.2}%", f.rms_relative_error() * 100.0),
            ]
        })
        .collect();
    if let Some(u) = &fits.unaligned {
        summary.push(vec![
            "unaligned buffers (all tiers)".into(),
            "-".into(),
            format!(
                "unaligned_bandwidth_factor {:.4}{}",
                u.factor,
                if u.at_bound { " (AT BOUND 1.0)" } else { "" }
            ),
            format!("{}", u.rows.len()),
            format!("{:.2}%", u.rms_relative_error() * 100.0),
        ]);
    }
    out.push(Section {
        heading: format!("Tier fits from {file}"),
        text: "Alpha-beta fit per tier with the simulator's own collective formulas \
               (weighted least squares on relative time error). A tier with aligned rows \
               at two sizes and rows not 512-byte aligned is fitted on the aligned rows; \
               the unaligned rows then fit the unaligned-buffer factor."
            .into(),
        table: Table {
            headers: strings(&[
                "tier",
                "latency_us (fitted)",
                "efficiency (fitted)",
                "rows",
                "rms error",
            ]),
            rows: summary,
        },
    });
    let unaligned: &[RowFit] = fits.unaligned.as_ref().map_or(&[], |u| &u.rows);
    let rows = fits
        .tiers
        .iter()
        .flat_map(|f| f.rows.iter())
        .chain(unaligned)
        .map(|r| {
            let (_, busbw) = algbw_busbw(
                r.row.kind,
                r.row.size_bytes,
                r.row.time_us * 1e-6,
                r.row.ranks,
            );
            vec![
                format!("{}", r.row.line),
                collective_name(r.row.kind).to_string(),
                tier_name(r.row.tier).to_string(),
                format!("{}", r.row.ranks),
                format!("{}", r.row.size_bytes),
                format!("{:.2}", r.row.time_us),
                format!("{:.2}", r.predicted_us),
                format!("{:+.2}%", r.relative_error() * 100.0),
                format!("{:.2}", busbw / 1e9),
            ]
        })
        .collect();
    out.push(Section {
        heading: format!("Residual per row of {file}"),
        text: String::new(),
        table: Table {
            headers: strings(&[
                "line",
                "collective",
                "tier",
                "ranks",
                "size (B)",
                "measured (us)",
                "fitted (us)",
                "error",
                "measured busbw (GB/s)",
            ]),
            rows,
        },
    });
    out
}

/// One GEMM table's efficiencies.
fn gemm_section(file: &str, rows: &[GemmRow], profile: &HardwareProfile) -> Section {
    let table = rows
        .iter()
        .map(|r| {
            vec![
                format!("{}", r.line),
                format!("{}", r.m),
                format!("{}", r.n),
                format!("{}", r.k),
                r.dtype.clone(),
                format!("{:.2}", r.time_us),
                efficiency_text(r.efficiency(profile)),
            ]
        })
        .collect();
    Section {
        heading: format!("GEMM efficiency table from {file}"),
        text: "efficiency = 2 m n k / time / the profile's BF16 peak.".into(),
        table: Table {
            headers: strings(&["line", "m", "n", "k", "dtype", "time (us)", "efficiency"]),
            rows: table,
        },
    }
}

/// Owned strings of `s`.
pub fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|v| v.to_string()).collect()
}

/// Writes the GEMM tables beside `dir` (the written profile's directory or the report's).
pub fn write_gemm_outputs(from: &FromTables, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (name, text) in &from.gemm_outputs {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The unfitted constants with public ranges (the runs files' `[[sourced_range]]` entries):
/// each one's value in `profile`, its range, whether it lies inside, and the measurements
/// behind the range, so a profile edited by hand (or a `--write-profile` from someone's
/// tables) that leaves a public range is visible in every `calibrate` run, not only in a
/// unit test.
pub fn sourced_ranges_table(ranges: &[SourcedRange], profile: &HardwareProfile) -> Table {
    let outside = outside_sourced_ranges(ranges, profile);
    let rows = ranges
        .iter()
        .map(|r| {
            let value = get(profile, &r.key);
            let verdict = match value {
                None => "not in profile".to_string(),
                Some(_) if outside.iter().any(|(o, _)| o.key == r.key) => {
                    "OUTSIDE its public range".to_string()
                }
                Some(_) => "inside".to_string(),
            };
            vec![
                r.key.clone(),
                value.map_or("-".to_string(), |v| format!("{v:.3}")),
                format!("[{}, {}]", r.min, r.max),
                verdict,
                r.source.split_whitespace().collect::<Vec<_>>().join(" "),
            ]
        })
        .collect();
    Table {
        headers: strings(&["constant", "value", "public range", "verdict", "source"]),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a3() -> HardwareProfile {
        HardwareProfile::load(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hardware/ascend-910c-a3.toml"),
        )
        .unwrap()
    }

    fn paper_ranges() -> Vec<SourcedRange> {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(hpfsdp_sim::calibration::PAPER_A3_RUNS);
        hpfsdp_sim::calibration::RunsFile::load(&path)
            .unwrap()
            .sourced_ranges
    }

    #[test]
    fn the_shipped_profile_is_inside_every_public_range_and_an_edit_outside_is_named() {
        let ranges = paper_ranges();
        assert!(!ranges.is_empty());
        let verdicts = |p: &HardwareProfile| -> Vec<String> {
            sourced_ranges_table(&ranges, p)
                .rows
                .iter()
                .map(|r| r[3].clone())
                .collect()
        };
        let mut profile = a3();
        assert_eq!(verdicts(&profile), vec!["inside"; ranges.len()]);
        for range in &ranges {
            assert!(
                set(&mut profile, &range.key, range.max * 2.0),
                "{}",
                range.key
            );
        }
        let table = sourced_ranges_table(&ranges, &profile);
        for (row, range) in table.rows.iter().zip(&ranges) {
            assert_eq!(row[0], range.key);
            assert_eq!(row[3], "OUTSIDE its public range", "{row:?}");
            assert!(
                row[4].contains("github.com"),
                "the source is printed: {row:?}"
            );
        }
    }
}
