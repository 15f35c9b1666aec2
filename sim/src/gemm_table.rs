//! Measured GEMM efficiency tables: `m,n,k,dtype,efficiency,source` CSV files next to a
//! hardware profile (`[compute] gemm_table`), interpolated in log space over (m, n, k).
//!
//! - `efficiency` is achieved FLOP/s over the device's dense BF16 peak, in (0, 1];
//! - `source` names where the point comes from (a measurement, a paper, a vendor table);
//! - the rows of one dtype must form a full grid over their distinct m, n and k values (the
//!   file `hpfsdp calibrate --from gemm.csv` writes from a sweep is one): interpolation is
//!   trilinear in (ln m, ln n, ln k), so it is exact on every table point and monotone along
//!   each axis wherever the points are;
//! - outside the grid the nearest grid value is scaled by the profile's shape model (the
//!   ratio of the model at the shape and at the clamped shape), see
//!   [`crate::compute_cost`].

use crate::profile_values::ProfileError;
use std::collections::BTreeMap;

/// The CSV header, exactly.
pub const GEMM_TABLE_HEADER: &str = "m,n,k,dtype,efficiency,source";

/// Element types a table row may name.
pub const GEMM_TABLE_DTYPES: [&str; 3] = ["bf16", "fp16", "fp32"];

/// Parsed rows of one dtype: (m, n, k) -> (efficiency, 1-based line).
type Points = BTreeMap<(u64, u64, u64), (f64, usize)>;

/// One dtype's grid of measured efficiencies.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmGrid {
    /// Distinct m values, ascending.
    pub ms: Vec<u64>,
    /// Distinct n values, ascending.
    pub ns: Vec<u64>,
    /// Distinct k values, ascending.
    pub ks: Vec<u64>,
    /// Efficiency at `(ms[i], ns[j], ks[l])`, index `(i * ns.len() + j) * ks.len() + l`.
    pub efficiency: Vec<f64>,
}

/// A parsed table: one grid per dtype named in it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GemmTable {
    /// Grids by dtype (`bf16`, ...).
    pub grids: BTreeMap<String, GemmGrid>,
}

impl GemmTable {
    /// Parses CSV `text`; `file` names it in errors (file, 1-based line, column).
    pub fn parse(text: &str, file: &str) -> Result<Self, ProfileError> {
        let err = |line: usize, key: &str, message: String| ProfileError {
            file: file.to_string(),
            line,
            key: key.to_string(),
            message,
        };
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        match lines.next() {
            Some((_, h)) if h.trim() == GEMM_TABLE_HEADER => {}
            Some((i, h)) => {
                return Err(err(
                    i + 1,
                    "header",
                    format!(
                        "header is '{}'; it must be exactly '{GEMM_TABLE_HEADER}'",
                        h.trim()
                    ),
                ));
            }
            None => {
                return Err(err(
                    0,
                    "header",
                    format!(
                        "empty table; write the header '{GEMM_TABLE_HEADER}' and one row per measured shape"
                    ),
                ));
            }
        }
        let mut points: BTreeMap<String, Points> = BTreeMap::new();
        for (i, row) in lines {
            let line = i + 1;
            let cols: Vec<&str> = row.splitn(6, ',').map(str::trim).collect();
            if cols.len() != 6 {
                return Err(err(
                    line,
                    "row",
                    format!("has {} columns; rows are '{GEMM_TABLE_HEADER}'", cols.len()),
                ));
            }
            let dim = |idx: usize, key: &str| -> Result<u64, ProfileError> {
                cols[idx]
                    .parse::<u64>()
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or_else(|| {
                        err(
                            line,
                            key,
                            format!("'{}' is not a positive whole number", cols[idx]),
                        )
                    })
            };
            let (m, n, k) = (dim(0, "m")?, dim(1, "n")?, dim(2, "k")?);
            let dtype = cols[3].to_ascii_lowercase();
            if !GEMM_TABLE_DTYPES.contains(&dtype.as_str()) {
                return Err(err(
                    line,
                    "dtype",
                    format!(
                        "'{}' is not one of {}",
                        cols[3],
                        GEMM_TABLE_DTYPES.join(", ")
                    ),
                ));
            }
            let eff: f64 = cols[4]
                .parse()
                .map_err(|_| err(line, "efficiency", format!("'{}' is not a number", cols[4])))?;
            if !(eff.is_finite() && eff > 0.0 && eff <= 1.0) {
                return Err(err(
                    line,
                    "efficiency",
                    format!(
                        "{eff} is not in (0, 1]: efficiency is achieved FLOP/s over the dense BF16 peak"
                    ),
                ));
            }
            if cols[5].is_empty() {
                return Err(err(
                    line,
                    "source",
                    "is empty; name where the point comes from (measurement, paper, vendor table)"
                        .into(),
                ));
            }
            let grid = points.entry(dtype).or_default();
            if let Some((_, first)) = grid.insert((m, n, k), (eff, line)) {
                return Err(err(
                    line,
                    "m",
                    format!(
                        "shape ({m}, {n}, {k}) already given on line {first}; keep one row per shape and dtype"
                    ),
                ));
            }
        }
        let mut grids = BTreeMap::new();
        for (dtype, pts) in points {
            grids.insert(
                dtype.clone(),
                grid_of(&pts).map_err(|msg| err(0, "row", format!("{dtype} rows: {msg}")))?,
            );
        }
        Ok(Self { grids })
    }

    /// The grid used for BF16 compute, if the table has one.
    pub fn bf16(&self) -> Option<&GemmGrid> {
        self.grids.get("bf16")
    }
}

fn grid_of(pts: &Points) -> Result<GemmGrid, String> {
    let axis = |f: fn(&(u64, u64, u64)) -> u64| {
        let mut v: Vec<u64> = pts.keys().map(f).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (ms, ns, ks) = (axis(|p| p.0), axis(|p| p.1), axis(|p| p.2));
    let mut efficiency = Vec::with_capacity(ms.len() * ns.len() * ks.len());
    for &m in &ms {
        for &n in &ns {
            for &k in &ks {
                let (e, _) = pts.get(&(m, n, k)).ok_or_else(|| {
                    format!(
                        "no row for m={m}, n={n}, k={k}: the rows must form a full grid over their m, n and k values (add the missing shape or drop the values it needs)"
                    )
                })?;
                efficiency.push(*e);
            }
        }
    }
    Ok(GemmGrid {
        ms,
        ns,
        ks,
        efficiency,
    })
}

/// Position of `x` on `axis` in log space: (lower index, fraction to the next), clamped.
fn bracket(axis: &[u64], x: f64) -> (usize, f64) {
    let last = axis.len() - 1;
    if axis.len() == 1 || x <= axis[0] as f64 {
        return (0, 0.0);
    }
    if x >= axis[last] as f64 {
        return (last, 0.0);
    }
    let i = axis.partition_point(|&a| (a as f64) <= x) - 1;
    let (lo, hi) = ((axis[i] as f64).ln(), (axis[i + 1] as f64).ln());
    (i, (x.ln() - lo) / (hi - lo))
}

impl GemmGrid {
    /// Clamps a shape into the grid's range.
    pub fn clamp(&self, m: f64, n: f64, k: f64) -> (f64, f64, f64) {
        let c = |axis: &[u64], x: f64| x.clamp(axis[0] as f64, axis[axis.len() - 1] as f64);
        (c(&self.ms, m), c(&self.ns, n), c(&self.ks, k))
    }

    /// Trilinear interpolation in (ln m, ln n, ln k), clamped to the grid.
    pub fn interpolate(&self, m: f64, n: f64, k: f64) -> f64 {
        let (im, tm) = bracket(&self.ms, m);
        let (in_, tn) = bracket(&self.ns, n);
        let (ik, tk) = bracket(&self.ks, k);
        let at = |a: usize, b: usize, c: usize| {
            let a = a.min(self.ms.len() - 1);
            let b = b.min(self.ns.len() - 1);
            let c = c.min(self.ks.len() - 1);
            self.efficiency[(a * self.ns.len() + b) * self.ks.len() + c]
        };
        let mut sum = 0.0;
        for (da, wa) in [(0, 1.0 - tm), (1, tm)] {
            for (db, wb) in [(0, 1.0 - tn), (1, tn)] {
                for (dc, wc) in [(0, 1.0 - tk), (1, tk)] {
                    let w = wa * wb * wc;
                    if w > 0.0 {
                        sum += w * at(im + da, in_ + db, ik + dc);
                    }
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: &str = "m,n,k,dtype,efficiency,source\n\
        128,1024,1024,bf16,0.30,test\n128,1024,4096,bf16,0.40,test\n\
        128,4096,1024,bf16,0.35,test\n128,4096,4096,bf16,0.45,test\n\
        2048,1024,1024,bf16,0.60,test\n2048,1024,4096,bf16,0.70,test\n\
        2048,4096,1024,bf16,0.65,test\n2048,4096,4096,bf16,0.80,test, with a comma\n";

    #[test]
    fn interpolation_is_exact_on_points_and_monotone_between() {
        let t = GemmTable::parse(GRID, "t.csv").unwrap();
        let g = t.bf16().unwrap();
        assert_eq!(g.interpolate(128.0, 1024.0, 1024.0), 0.30);
        assert_eq!(g.interpolate(2048.0, 4096.0, 4096.0), 0.80);
        assert_eq!(g.interpolate(2048.0, 1024.0, 4096.0), 0.70);
        // Halfway in log space between m = 128 and 2048 is m = 512.
        assert!((g.interpolate(512.0, 1024.0, 1024.0) - 0.45).abs() < 1e-12);
        let mut last = 0.0;
        for m in [128.0, 200.0, 300.0, 512.0, 900.0, 1500.0, 2048.0] {
            let e = g.interpolate(m, 3000.0, 2000.0);
            assert!(e >= last, "monotone in m: {e} after {last}");
            last = e;
        }
        // Clamped outside.
        assert_eq!(g.interpolate(64.0, 1024.0, 1024.0), 0.30);
    }

    #[test]
    fn bad_rows_name_file_line_and_column() {
        let e = GemmTable::parse("m,n,k,dtype,time_us\n", "g.csv").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.key.as_str()),
            ("g.csv", 1, "header")
        );
        let bad = format!("{GRID}64,1024,x,bf16,0.2,test\n");
        let e = GemmTable::parse(&bad, "g.csv").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (10, "k"));
        let bad = format!("{GRID}64,1024,1024,bf16,1.5,test\n");
        assert_eq!(
            GemmTable::parse(&bad, "g.csv").unwrap_err().key,
            "efficiency"
        );
        let bad = format!("{GRID}64,1024,1024,int8,0.5,test\n");
        assert_eq!(GemmTable::parse(&bad, "g.csv").unwrap_err().key, "dtype");
        let bad = format!("{GRID}64,1024,1024,bf16,0.5,\n");
        assert_eq!(GemmTable::parse(&bad, "g.csv").unwrap_err().key, "source");
        let dup = format!("{GRID}128,1024,1024,bf16,0.5,again\n");
        let e = GemmTable::parse(&dup, "g.csv").unwrap_err();
        assert!(e.message.contains("line 2"), "{e}");
        // A row off the grid leaves holes: named with the missing shape.
        let holes = format!("{GRID}64,1024,1024,bf16,0.2,test\n");
        let e = GemmTable::parse(&holes, "g.csv").unwrap_err();
        assert!(
            e.message.contains("m=64") && e.message.contains("full grid"),
            "{e}"
        );
    }
}
