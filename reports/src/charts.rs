//! Inline SVG charts of a [`SimReport`], drawn with plotters' SVG backend into strings.
//!
//! Every bar is drawn as a `Rectangle` (plotters' `Histogram` orders its bars through a hash
//! map, so its output changes between runs); legends are drawn by hand in a strip at the
//! right; all inputs are iterated in a fixed order. The same report therefore always gives the
//! same SVG bytes. Text is emitted as SVG `<text>` with a generic font family, so no font file
//! is read at build or run time. Non-finite or negative inputs are clamped, never panicked on.

use crate::model::{SimReport, StrategyRun};
use crate::{order, palette};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::collections::BTreeMap;
use thiserror::Error;

/// Width of every chart, pixels.
pub(crate) const WIDTH_PX: u32 = 1100;
/// Width of the legend strip at the right of a chart, pixels.
pub(crate) const LEGEND_PX: u32 = 190;
/// Font family of chart text (generic, resolved by the viewer; no font file needed).
pub(crate) const FONT: &str = "sans-serif";
/// Longest strategy or stream label drawn on an axis, characters.
const MAX_LABEL_CHARS: usize = 32;

/// A chart could not be drawn (a plotters drawing error, as text).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("chart drawing failed: {0}")]
pub struct ChartError(String);

/// Converts any plotters error into a [`ChartError`].
pub(crate) fn err<E: std::fmt::Display>(e: E) -> ChartError {
    ChartError(e.to_string())
}

pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A rank's stream timeline as an SVG, with how many spans it shows and how many rectangles
/// they were merged into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineSvg {
    /// The SVG document.
    pub svg: String,
    /// Spans in the timeline.
    pub spans: usize,
    /// Rectangles drawn (spans merged per pixel column and category).
    pub rectangles: usize,
}

/// `v` if finite and positive, else 0.
fn nonneg(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 { v } else { 0.0 }
}

/// Shortens a label to [`MAX_LABEL_CHARS`] characters.
pub(crate) fn short(label: &str) -> String {
    short_to(label, MAX_LABEL_CHARS)
}

/// Shortens a label to `max_chars` characters (at least 2), ending in `…` when cut.
pub(crate) fn short_to(label: &str, max_chars: usize) -> String {
    let max_chars = max_chars.max(2);
    if label.chars().count() <= max_chars {
        label.to_string()
    } else {
        let mut s: String = label.chars().take(max_chars - 1).collect();
        s.push('…');
        s
    }
}

/// Pixels reserved for labels of the longest of `labels` (crude: 7 px per character).
pub(crate) fn label_area_px(labels: &[String]) -> u32 {
    label_area_px_to(labels, MAX_LABEL_CHARS)
}

/// Pixels reserved for labels of the longest of `labels`, at most `max_chars` characters.
pub(crate) fn label_area_px_to(labels: &[String], max_chars: usize) -> u32 {
    let chars = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    (chars as u32 * 7 + 16).clamp(60, 7 * max_chars as u32 + 16)
}

/// Number of decimals that resolves ticks on an axis spanning `0..max`.
pub(crate) fn decimals(max: f64) -> usize {
    if !(max.is_finite() && max > 0.0) {
        return 0;
    }
    (1 - max.log10().floor() as i64).clamp(0, 6) as usize
}

/// A time unit that keeps `max_ns` readable: (name, nanoseconds per unit).
fn time_unit(max_ns: f64) -> (&'static str, f64) {
    if max_ns < 1e6 {
        ("µs", 1e3)
    } else if max_ns < 1e10 {
        ("ms", 1e6)
    } else {
        ("s", 1e9)
    }
}

/// A byte unit that keeps `max_bytes` readable: (name, bytes per unit).
pub(crate) fn byte_unit(max_bytes: f64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 5] = [
        ("TiB", 1_099_511_627_776.0),
        ("GiB", 1_073_741_824.0),
        ("MiB", 1_048_576.0),
        ("KiB", 1024.0),
        ("B", 1.0),
    ];
    UNITS
        .iter()
        .copied()
        .find(|(_, scale)| max_bytes >= *scale)
        .unwrap_or(("B", 1.0))
}

/// A y axis of `n` equal rows over `0..n` whose key points (ticks and labels) are the row
/// centres. (plotters' `with_key_points` on an `f64` range cannot take a custom label
/// formatter, hence this small axis type.)
pub(crate) struct RowAxis {
    inner: RangedCoordf64,
    n: usize,
}

impl RowAxis {
    pub(crate) fn new(n: usize) -> Self {
        RowAxis {
            inner: (0.0..n.max(1) as f64).into(),
            n,
        }
    }
}

impl Ranged for RowAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.n).map(|i| row_centre(i, self.n)).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// Row `i` of `n` counted from the top, as the y value of its centre (y grows upwards).
pub(crate) fn row_centre(i: usize, n: usize) -> f64 {
    n as f64 - i as f64 - 0.5
}

/// The row whose centre is `y`, if any.
pub(crate) fn row_at(y: f64, n: usize) -> Option<usize> {
    (0..n).find(|&i| (row_centre(i, n) - y).abs() < 1e-6)
}

/// Draws `entries` (label, colour) as a vertical legend into `area`.
pub(crate) fn draw_legend(
    area: &Area<'_>,
    entries: &[(String, RGBColor)],
) -> Result<(), ChartError> {
    for (k, (label, color)) in entries.iter().enumerate() {
        let y = 24 + 20 * k as i32;
        area.draw(&Rectangle::new([(8, y), (20, y + 12)], color.filled()))
            .map_err(err)?;
        area.draw(&Text::new(
            short(label),
            (26, y),
            (FONT, 13).into_font().color(&BLACK),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// Draws `lines` of text under a legend of `after_entries` entries in `area` (the lane notes
/// of a timeline).
pub(crate) fn draw_notes(
    area: &Area<'_>,
    after_entries: usize,
    lines: &[String],
) -> Result<(), ChartError> {
    for (k, line) in lines.iter().enumerate() {
        let y = 24 + 20 * (after_entries + k) as i32 + 6;
        area.draw(&Text::new(
            short_to(line, 30),
            (8, y),
            (FONT, 12).into_font().color(&BLACK),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// Height that fits `rows` bars of `row_px` and a legend of `legend_entries`, pixels.
pub(crate) fn chart_height(rows: usize, row_px: u32, legend_entries: usize) -> u32 {
    let plot = 90 + rows as u32 * row_px;
    let legend = 40 + legend_entries as u32 * 20;
    plot.max(legend).max(160)
}

/// Renders `draw` into a fresh SVG string of the given size.
pub(crate) fn render<F>(height_px: u32, draw: F) -> Result<String, ChartError>
where
    F: FnOnce(&Area<'_>) -> Result<(), ChartError>,
{
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, height_px)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A chart that only says `message` (used when there is nothing to plot).
pub(crate) fn message_svg(title: &str, message: &str) -> Result<String, ChartError> {
    render(120, |root| {
        root.draw(&Text::new(
            title.to_string(),
            (12, 12),
            (FONT, 18).into_font().color(&BLACK),
        ))
        .map_err(err)?;
        root.draw(&Text::new(
            message.to_string(),
            (12, 56),
            (FONT, 14).into_font().color(&BLACK),
        ))
        .map_err(err)
    })
}

/// One stacked segment of a step-time bar.
struct Segment {
    label: String,
    seconds: f64,
    color: RGBColor,
}

/// The step-time segments of one run: compute, copy not hidden under compute, exposed
/// communication per category, idle. They add up to the step time when the inputs are
/// consistent (`|compute ∪ copy| + exposed + idle = step`).
fn segments(run: &StrategyRun) -> Vec<Segment> {
    let step = nonneg(run.step_time_s);
    let compute = nonneg(run.compute_s);
    let exposed = nonneg(run.exposed_comm_s);
    let idle = nonneg(run.idle_s);
    let copy_visible = nonneg(step - exposed - idle - compute).min(nonneg(run.copy_s));
    let mut out = vec![
        Segment {
            label: "compute".into(),
            seconds: compute,
            color: palette::category("compute"),
        },
        Segment {
            label: "copy (not under compute)".into(),
            seconds: copy_visible,
            color: palette::category("copy"),
        },
    ];
    let cats = order::categories(run.exposed_comm_by_category_s.keys().map(String::as_str));
    let mut charged = 0.0;
    for cat in cats {
        let s = nonneg(
            run.exposed_comm_by_category_s
                .get(&cat)
                .copied()
                .unwrap_or(0.0),
        );
        charged += s;
        out.push(Segment {
            label: format!("exposed {cat}"),
            seconds: s,
            color: palette::category(&cat),
        });
    }
    let rest = exposed - charged;
    if rest > 1e-9 * step.max(1e-9) {
        out.push(Segment {
            label: "exposed other".into(),
            seconds: rest,
            color: RGBColor(0x55, 0x55, 0x55),
        });
    }
    out.push(Segment {
        label: "idle".into(),
        seconds: idle,
        color: palette::IDLE,
    });
    out
}

/// Stacked horizontal bars of each strategy's step time: compute, copy, exposed
/// communication per category and idle, with a tick at the step time.
pub fn step_breakdown_svg(report: &SimReport) -> Result<String, ChartError> {
    const TITLE: &str = "Step-time breakdown";
    let n = report.runs.len();
    if n == 0 {
        return message_svg(TITLE, "no strategies");
    }
    let per_run: Vec<Vec<Segment>> = report.runs.iter().map(segments).collect();
    // Legend: every segment kind that has time somewhere, in first-seen order.
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    for seg in per_run.iter().flatten() {
        if seg.seconds > 0.0 && !legend.iter().any(|(l, _)| *l == seg.label) {
            legend.push((seg.label.clone(), seg.color));
        }
    }
    let max_s = per_run
        .iter()
        .zip(&report.runs)
        .map(|(segs, run)| {
            let total: f64 = segs.iter().map(|s| s.seconds).sum();
            total.max(nonneg(run.step_time_s))
        })
        .fold(0.0, f64::max);
    let (unit, unit_ns) = time_unit(max_s * 1e9);
    let per_s = 1e9 / unit_ns;
    let x_max = if max_s > 0.0 {
        max_s * per_s * 1.05
    } else {
        1.0
    };
    let names: Vec<String> = report.runs.iter().map(|r| short(&r.strategy)).collect();
    let height = chart_height(n, 40, legend.len());
    render(height, |root| {
        let (plot, legend_area) = root.split_horizontally(WIDTH_PX - LEGEND_PX);
        let mut chart = ChartBuilder::on(&plot)
            .caption(TITLE, (FONT, 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(label_area_px(&names))
            .build_cartesian_2d(0.0..x_max, RowAxis::new(n))
            .map_err(err)?;
        let dec = decimals(x_max);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(unit)
            .label_style((FONT, 12))
            .x_label_formatter(&|v| format!("{v:.dec$}"))
            .y_label_formatter(&|v| row_at(*v, n).map_or_else(String::new, |i| names[i].clone()))
            .draw()
            .map_err(err)?;
        for (i, (segs, run)) in per_run.iter().zip(&report.runs).enumerate() {
            let y = row_centre(i, n);
            let mut x = 0.0;
            for seg in segs.iter().filter(|s| s.seconds > 0.0) {
                let w = seg.seconds * per_s;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x, y - 0.35), (x + w, y + 0.35)],
                        seg.color.filled(),
                    )))
                    .map_err(err)?;
                x += w;
            }
            let step_x = nonneg(run.step_time_s) * per_s;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(step_x, y - 0.45), (step_x, y + 0.45)],
                    BLACK.stroke_width(2),
                )))
                .map_err(err)?;
        }
        draw_legend(&legend_area, &legend)
    })
}

/// Grouped horizontal bars of collective bytes per tier, one group per strategy.
pub fn tier_traffic_svg(report: &SimReport) -> Result<String, ChartError> {
    const TITLE: &str = "Collective traffic per tier";
    let tiers = order::tiers(
        report
            .runs
            .iter()
            .flat_map(|r| r.tier_bytes.iter().map(|t| t.tier.as_str())),
    );
    let n = report.runs.len();
    if n == 0 || tiers.is_empty() {
        return message_svg(TITLE, "no collective traffic");
    }
    // bytes[run][tier], summing duplicate tier rows.
    let bytes: Vec<Vec<f64>> = report
        .runs
        .iter()
        .map(|run| {
            tiers
                .iter()
                .map(|tier| {
                    run.tier_bytes
                        .iter()
                        .filter(|t| t.tier == *tier)
                        .map(|t| t.bytes as f64)
                        .sum()
                })
                .collect()
        })
        .collect();
    let max_bytes = bytes.iter().flatten().copied().fold(0.0, f64::max);
    let (unit, scale) = byte_unit(max_bytes);
    let x_max = if max_bytes > 0.0 {
        max_bytes / scale * 1.05
    } else {
        1.0
    };
    let names: Vec<String> = report.runs.iter().map(|r| short(&r.strategy)).collect();
    let legend: Vec<(String, RGBColor)> = tiers
        .iter()
        .enumerate()
        .map(|(j, t)| (t.clone(), palette::series(j)))
        .collect();
    let row_px = (16 * tiers.len() as u32 + 16).max(36);
    let height = chart_height(n, row_px, legend.len());
    render(height, |root| {
        let (plot, legend_area) = root.split_horizontally(WIDTH_PX - LEGEND_PX);
        let mut chart = ChartBuilder::on(&plot)
            .caption(TITLE, (FONT, 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(label_area_px(&names))
            .build_cartesian_2d(0.0..x_max, RowAxis::new(n))
            .map_err(err)?;
        let dec = decimals(x_max);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(unit)
            .label_style((FONT, 12))
            .x_label_formatter(&|v| format!("{v:.dec$}"))
            .y_label_formatter(&|v| row_at(*v, n).map_or_else(String::new, |i| names[i].clone()))
            .draw()
            .map_err(err)?;
        let band = 0.8 / tiers.len() as f64;
        for (i, row) in bytes.iter().enumerate() {
            let top = row_centre(i, n) + 0.4;
            for (j, b) in row.iter().enumerate() {
                let y1 = top - band * j as f64;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y1 - band * 0.9), (b / scale, y1)],
                        palette::series(j).filled(),
                    )))
                    .map_err(err)?;
            }
        }
        draw_legend(&legend_area, &legend)
    })
}

/// Colour of the device-capacity line on the memory chart.
pub(crate) const CAPACITY: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// The memory chart's y axis reaches the device capacity when the highest sample is at least
/// this fraction of it; below, the series would be a flat line at the bottom, so the axis
/// follows the series and the legend says how far below capacity it stays.
pub(crate) const CAPACITY_ON_AXIS_FRACTION: f64 = 0.125;

/// Live memory over the step, one line per strategy (a step function, downsampled to the
/// per-pixel maximum for long series so peaks stay visible), with the device capacity as a
/// dashed line when the report knows it: the y axis reaches the capacity (so a plan that does
/// not fit shows its series crossing the line) unless the series stay below
/// [`CAPACITY_ON_AXIS_FRACTION`] of it, in which case the legend gives the capacity and the
/// highest sample's share of it instead.
pub fn memory_svg(report: &SimReport) -> Result<String, ChartError> {
    const TITLE: &str = "Live device memory over the step";
    let with_series: Vec<(usize, &StrategyRun)> = report
        .runs
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.memory_series.is_empty())
        .collect();
    if with_series.is_empty() {
        return message_svg(TITLE, "no memory series recorded");
    }
    let t_max_ns = with_series
        .iter()
        .flat_map(|(_, r)| r.memory_series.iter().map(|p| p.0))
        .chain(
            with_series
                .iter()
                .map(|(_, r)| (nonneg(r.step_time_s) * 1e9) as u64),
        )
        .max()
        .unwrap_or(0);
    let capacity = report.device_memory_bytes.filter(|c| *c > 0);
    let series_max = with_series
        .iter()
        .flat_map(|(_, r)| r.memory_series.iter().map(|p| p.1))
        .max()
        .unwrap_or(0);
    let capacity_on_axis =
        capacity.filter(|c| series_max as f64 >= *c as f64 * CAPACITY_ON_AXIS_FRACTION);
    let b_max = series_max.max(capacity_on_axis.unwrap_or(0)) as f64;
    let (unit, scale) = byte_unit(b_max);
    let (t_unit, unit_ns) = time_unit(t_max_ns as f64);
    let x_max = if t_max_ns > 0 {
        t_max_ns as f64 / unit_ns
    } else {
        1.0
    };
    let y_max = if b_max > 0.0 {
        b_max / scale * 1.1
    } else {
        1.0
    };
    let mut legend: Vec<(String, RGBColor)> = with_series
        .iter()
        .map(|(i, r)| (r.strategy.clone(), palette::series(*i)))
        .collect();
    let title = match (capacity, capacity_on_axis) {
        (Some(c), Some(_)) => {
            legend.push((format!("capacity {}", crate::units::bytes(c)), CAPACITY));
            TITLE.to_string()
        }
        (Some(c), None) => format!(
            "{TITLE} (capacity {} off scale: peak at {} of it)",
            crate::units::bytes(c),
            crate::units::percent(series_max as f64 / c as f64)
        ),
        (None, _) => TITLE.to_string(),
    };
    render(chart_height(8, 40, legend.len()), |root| {
        let (plot, legend_area) = root.split_horizontally(WIDTH_PX - LEGEND_PX);
        let mut chart = ChartBuilder::on(&plot)
            .caption(title.as_str(), (FONT, 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(err)?;
        let (xd, yd) = (decimals(x_max), decimals(y_max));
        chart
            .configure_mesh()
            .x_desc(t_unit)
            .y_desc(unit)
            .label_style((FONT, 12))
            .x_label_formatter(&|v| format!("{v:.xd$}"))
            .y_label_formatter(&|v| format!("{v:.yd$}"))
            .draw()
            .map_err(err)?;
        let columns = chart.plotting_area().dim_in_pixel().0.max(1) as usize;
        for (i, run) in &with_series {
            // Each series ends at its own step end, not at the longest run's.
            let own_end_ns = (nonneg(run.step_time_s) * 1e9) as u64;
            let points = memory_steps(&run.memory_series, own_end_ns, t_max_ns, columns);
            chart
                .draw_series(LineSeries::new(
                    points
                        .into_iter()
                        .map(|(t, b)| (t as f64 / unit_ns, b as f64 / scale)),
                    palette::series(*i).stroke_width(2),
                ))
                .map_err(err)?;
        }
        if let Some(c) = capacity_on_axis {
            let y = c as f64 / scale;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, y), (x_max, y)],
                    8,
                    5,
                    CAPACITY.stroke_width(2),
                ))
                .map_err(err)?;
        }
        draw_legend(&legend_area, &legend)
    })
}

/// A memory series as the vertices of its step function, sorted by time, held flat to
/// `end_ns` (its run's step end; never before its last sample); when longer than two points
/// per pixel column of an axis spanning `0..t_max_ns`, each column keeps only its highest
/// sample.
fn memory_steps(
    series: &[(u64, u64)],
    end_ns: u64,
    t_max_ns: u64,
    columns: usize,
) -> Vec<(u64, u64)> {
    let mut sorted = series.to_vec();
    sorted.sort_by_key(|p| p.0); // stable: equal times keep their recorded order
    if sorted.len() > 2 * columns && t_max_ns > 0 {
        let mut buckets: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (t, b) in sorted {
            let col = (u128::from(t) * columns as u128 / u128::from(t_max_ns)) as u64;
            let e = buckets.entry(col).or_insert((t, b));
            if b > e.1 {
                e.1 = b;
            }
        }
        sorted = buckets.into_values().collect();
    }
    let mut out = Vec::with_capacity(sorted.len() * 2);
    for (t, b) in sorted {
        if let Some(&(_, prev)) = out.last() {
            out.push((t, prev));
        }
        out.push((t, b));
    }
    if let Some(&(t, b)) = out.last()
        && t < end_ns
    {
        out.push((end_ns, b));
    }
    out
}

/// Shades of a timeline bar: a pixel column's busy fraction is rounded up to a multiple of
/// `1 / SHADES` and drawn with that opacity, so sparse activity looks faint, dense solid.
const SHADES: u32 = 4;

/// One merged bar of a timeline row: `[start_col, end_col)` pixel columns of one category at
/// one shade (`1..=SHADES`).
#[derive(Debug, PartialEq, Eq)]
struct Run {
    start_col: usize,
    end_col: usize,
    category: usize,
    shade: u32,
}

/// Rasterises the spans of one row onto `columns` pixel columns of `col_ns` each: a column
/// shows the category busiest in it (ties: earlier category) at a shade given by how busy the
/// column is, and equal neighbouring columns merge. This bounds the rectangles per row by the
/// chart width whatever the span count.
fn rasterise(
    spans: &[(u64, u64, usize)],
    categories: usize,
    columns: usize,
    col_ns: f64,
) -> Vec<Run> {
    if columns == 0 || categories == 0 || col_ns.is_nan() || col_ns <= 0.0 {
        return Vec::new();
    }
    let mut busy = vec![0.0f64; columns * categories];
    for &(s, e, c) in spans {
        let (s, e) = (s as f64, e as f64);
        let first = ((s / col_ns).floor() as usize).min(columns - 1);
        let last = ((e / col_ns).ceil() as usize).max(first + 1).min(columns);
        for col in first..last {
            let lo = s.max(col as f64 * col_ns);
            let hi = e.min((col + 1) as f64 * col_ns);
            // Zero-length spans still mark their column, with a tiny weight.
            busy[col * categories + c] += (hi - lo).max(1e-3);
        }
    }
    let mut runs: Vec<Run> = Vec::new();
    for col in 0..columns {
        let cell = &busy[col * categories..(col + 1) * categories];
        let mut best: Option<(usize, f64)> = None;
        for (c, &b) in cell.iter().enumerate() {
            if b > 0.0 && best.is_none_or(|(_, bb)| b > bb) {
                best = Some((c, b));
            }
        }
        let Some((category, _)) = best else { continue };
        let fraction = (cell.iter().sum::<f64>() / col_ns).min(1.0);
        let shade = ((fraction * f64::from(SHADES)).ceil() as u32).clamp(1, SHADES);
        match runs.last_mut() {
            Some(r) if r.end_col == col && r.category == category && r.shade == shade => {
                r.end_col = col + 1
            }
            _ => runs.push(Run {
                start_col: col,
                end_col: col + 1,
                category,
                shade,
            }),
        }
    }
    runs
}

/// Rank 0's streams of one strategy as a Gantt chart over `0..span_ns` (pass the longest
/// step of the report so strategies share a time axis): one row per stream, bars coloured
/// by category. Returns `None` when the run has no timeline.
pub fn timeline_svg(run: &StrategyRun, span_ns: u64) -> Result<Option<TimelineSvg>, ChartError> {
    let Some(view) = &run.rank0_timeline else {
        return Ok(None);
    };
    let title = format!("{} — rank {} streams", short(&run.strategy), view.rank);
    let streams = order::streams(view.spans.iter().map(|s| s.stream.as_str()));
    let categories = order::categories(view.spans.iter().map(|s| s.category.as_str()));
    let span_end = view.spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    let t_max_ns = span_ns.max(span_end);
    if streams.is_empty() || t_max_ns == 0 {
        let svg = message_svg(&title, "no spans recorded")?;
        return Ok(Some(TimelineSvg {
            svg,
            spans: view.spans.len(),
            rectangles: 0,
        }));
    }
    let n = streams.len();
    let legend: Vec<(String, RGBColor)> = categories
        .iter()
        .map(|c| (c.clone(), palette::category(c)))
        .collect();
    // The numbered lanes, explained under the colours.
    let mut notes: Vec<String> = streams
        .iter()
        .filter_map(|s| Some(format!("{s}: {}", order::stream_note(s)?)))
        .collect();
    if !notes.is_empty() {
        notes.insert(0, "lanes:".into());
    }
    let (unit, unit_ns) = time_unit(t_max_ns as f64);
    let x_max = t_max_ns as f64 / unit_ns;
    let mut rectangles = 0;
    let labels: Vec<String> = streams.iter().map(|s| short(s)).collect();
    let svg = render(
        chart_height(n, 26, legend.len() + notes.len() + 1),
        |root| {
            let (plot, legend_area) = root.split_horizontally(WIDTH_PX - LEGEND_PX);
            let mut chart = ChartBuilder::on(&plot)
                .caption(&title, (FONT, 18))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(label_area_px(&labels))
                .build_cartesian_2d(0.0..x_max, RowAxis::new(n))
                .map_err(err)?;
            let dec = decimals(x_max);
            chart
                .configure_mesh()
                .disable_y_mesh()
                .x_desc(unit)
                .label_style((FONT, 12))
                .x_label_formatter(&|v| format!("{v:.dec$}"))
                .y_label_formatter(&|v| {
                    row_at(*v, n).map_or_else(String::new, |i| labels[i].clone())
                })
                .draw()
                .map_err(err)?;
            let columns = chart.plotting_area().dim_in_pixel().0.max(1) as usize;
            let col_ns = t_max_ns as f64 / columns as f64;
            for (i, stream) in streams.iter().enumerate() {
                let spans: Vec<(u64, u64, usize)> = view
                    .spans
                    .iter()
                    .filter(|s| s.stream == *stream)
                    .filter_map(|s| {
                        let c = categories.iter().position(|c| *c == s.category)?;
                        Some((s.start_ns, s.end_ns.max(s.start_ns), c))
                    })
                    .collect();
                let runs = rasterise(&spans, categories.len(), columns, col_ns);
                rectangles += runs.len();
                let y = row_centre(i, n);
                chart
                    .draw_series(runs.iter().map(|r| {
                        let x0 = r.start_col as f64 * col_ns / unit_ns;
                        let x1 = r.end_col as f64 * col_ns / unit_ns;
                        let alpha = f64::from(r.shade) / f64::from(SHADES);
                        Rectangle::new(
                            [(x0, y - 0.38), (x1, y + 0.38)],
                            palette::category(&categories[r.category])
                                .mix(alpha)
                                .filled(),
                        )
                    }))
                    .map_err(err)?;
            }
            draw_legend(&legend_area, &legend)?;
            draw_notes(&legend_area, legend.len(), &notes)
        },
    )?;
    Ok(Some(TimelineSvg {
        svg,
        spans: view.spans.len(),
        rectangles,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rasterise_merges_and_bounds() {
        // 10 columns of 10 ns; many tiny spans of category 0 then one long span of category 1.
        let mut spans: Vec<(u64, u64, usize)> = (0..50).map(|k| (k, k + 1, 0)).collect();
        spans.push((50, 100, 1));
        let runs = rasterise(&spans, 2, 10, 10.0);
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[0].start_col, runs[0].end_col, runs[0].category),
            (0, 5, 0)
        );
        assert_eq!(
            (runs[1].start_col, runs[1].end_col, runs[1].category),
            (5, 10, 1)
        );
    }

    #[test]
    fn memory_steps_are_steps() {
        let steps = memory_steps(&[(10, 5), (0, 1)], 20, 20, 100);
        assert_eq!(steps, vec![(0, 1), (10, 1), (10, 5), (20, 5)]);
    }

    #[test]
    fn a_shorter_run_ends_at_its_own_step_end() {
        // A 15 ns run on an axis a 40 ns run stretches: held to 15, not drawn flat to 40.
        let steps = memory_steps(&[(0, 1), (10, 5)], 15, 40, 100);
        assert_eq!(steps.last(), Some(&(15, 5)));
        // A series recorded past its step end keeps its last sample.
        let steps = memory_steps(&[(0, 1), (30, 2)], 15, 40, 100);
        assert_eq!(steps.last(), Some(&(30, 2)));
    }

    /// The last x of every `<polyline>` drawn in `stroke` colour.
    fn polyline_ends(svg: &str, stroke: &str) -> Vec<f64> {
        svg.split("<polyline")
            .skip(1)
            .filter(|p| p.contains(&format!("stroke=\"{stroke}\"")))
            .filter_map(|p| {
                let pts = p.split("points=\"").nth(1)?.split('"').next()?;
                let last = pts.split_whitespace().last()?;
                last.split(',').next()?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn the_memory_chart_ends_each_series_at_its_own_step_end() {
        let run = |name: &str, step_s: f64| StrategyRun {
            strategy: name.into(),
            step_time_s: step_s,
            memory_series: vec![(0, 1 << 30), (1_000_000, 2 << 30)],
            ..StrategyRun::default()
        };
        let report = SimReport {
            runs: vec![run("long", 0.004), run("short", 0.002)],
            ..SimReport::default()
        };
        let svg = memory_svg(&report).unwrap();
        let colour = |i: usize| {
            let c = palette::series(i);
            format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
        };
        let long = polyline_ends(&svg, &colour(0));
        let short = polyline_ends(&svg, &colour(1));
        assert_eq!((long.len(), short.len()), (1, 1), "{svg}");
        // The 2 ms run stops halfway along the 4 ms axis (plot x from ~74 to ~900 px).
        assert!(
            short[0] < long[0] * 0.6,
            "short ends at {short:?}, long at {long:?}"
        );
    }

    #[test]
    fn timeline_legend_explains_the_numbered_lanes() {
        let span = |stream: &str, category: &str, start_ns| crate::model::SpanView {
            op: "x".into(),
            stream: stream.into(),
            category: category.into(),
            start_ns,
            end_ns: start_ns + 10,
            bytes: None,
        };
        let run = StrategyRun {
            strategy: "hyperparallel".into(),
            rank0_timeline: Some(crate::model::RankTimelineView {
                rank: 0,
                spans: vec![
                    span("compute", "compute", 0),
                    span("aux0", "optimizer", 10),
                    span("aux1", "fsdp-ag", 20),
                ],
            }),
            ..StrategyRun::default()
        };
        let svg = timeline_svg(&run, 40).unwrap().unwrap().svg;
        for text in [
            "lanes:",
            "aux0: Muon replica broadcasts",
            "aux1: expert shard group AG/RS",
        ] {
            assert!(svg.contains(text), "{text} missing from the legend");
        }
    }

    #[test]
    fn memory_downsampling_keeps_peak() {
        let series: Vec<(u64, u64)> = (0..1000)
            .map(|t| (t, if t == 501 { 99 } else { 1 }))
            .collect();
        let steps = memory_steps(&series, 1000, 1000, 10);
        assert!(steps.len() <= 21);
        assert!(steps.iter().any(|p| p.1 == 99));
    }
}
