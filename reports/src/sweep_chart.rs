//! The sweep's chart: tokens/s against peak memory per rank for every simulated point, drawn
//! with plotters like the simulation charts (rounded axis ticks, a legend strip, SVG text).
//!
//! Feasible points are blue, points over the device memory grey; the Pareto front (no other
//! feasible point is both faster and smaller) is joined by a red line; the best feasible
//! point is ringed; each device capacity is a dashed vertical line. Points are labelled:
//! with their key values when on the front or best, else with their point number (only the
//! front and the best when there are many points). The same report gives the same SVG bytes.

use crate::charts::{
    CAPACITY, CAPACITY_ON_AXIS_FRACTION, ChartError, FONT, LEGEND_PX, WIDTH_PX, byte_unit,
    decimals, draw_legend, err, message_svg, render, short_to,
};
use crate::sweep::{SweepReport, SweepRow};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

const TITLE: &str = "Tokens/s vs peak memory per rank";
/// Colour of feasible points off the front.
const FEASIBLE: RGBColor = RGBColor(0x4e, 0x79, 0xa7);
/// Colour of the Pareto front.
const FRONT: RGBColor = RGBColor(0xe1, 0x57, 0x59);
/// Colour of points over the device memory.
const OVER: RGBColor = RGBColor(0xbb, 0xbb, 0xbb);
/// With more simulated rows than this, only the front and the best point are labelled.
const LABEL_ALL_MAX: usize = 40;
/// Longest point label drawn, characters.
const LABEL_CHARS: usize = 44;

/// A plotted row: memory and throughput.
struct Dot<'a> {
    row: &'a SweepRow,
    bytes: f64,
    tokens_per_s: f64,
}

/// A throughput unit that keeps `max` readable: (axis label, tokens/s per unit).
fn throughput_unit(max: f64) -> (&'static str, f64) {
    if max >= 1e6 {
        ("million tokens/s", 1e6)
    } else if max >= 1e3 {
        ("thousand tokens/s", 1e3)
    } else {
        ("tokens/s", 1.0)
    }
}

/// The label of a dot (`#point strategy`, with the point's values on the front), or `None`
/// when it stays unlabelled.
fn label(d: &Dot<'_>, label_all: bool) -> Option<String> {
    let r = d.row;
    if r.pareto || r.best {
        let text = format!("#{} {} ({})", r.point, r.strategy, r.values.join(", "));
        Some(short_to(&text, LABEL_CHARS))
    } else {
        label_all.then(|| format!("#{} {}", r.point, r.strategy))
    }
}

/// The plotting scale: data units per axis unit and the axis ends.
struct Scale {
    x_scale: f64,
    y_scale: f64,
    x_max: f64,
    y_max: f64,
}

impl Scale {
    fn at(&self, d: &Dot<'_>) -> (f64, f64) {
        (d.bytes / self.x_scale, d.tokens_per_s / self.y_scale)
    }
}

/// The chart's drawing context (memory on x, throughput on y).
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The rows with a peak memory and a finite, non-negative throughput.
fn plotted(report: &SweepReport) -> Vec<Dot<'_>> {
    report
        .rows
        .iter()
        .filter_map(|row| {
            let bytes = row.peak_memory_bytes? as f64;
            let tokens_per_s = row.tokens_per_s.filter(|t| t.is_finite() && *t >= 0.0)?;
            Some(Dot {
                row,
                bytes,
                tokens_per_s,
            })
        })
        .collect()
}

/// The distinct device capacities close enough to the largest peak memory `mem_max` to be
/// drawn on the axis, ascending.
fn capacities_on_axis(report: &SweepReport, mem_max: f64) -> Vec<u64> {
    let mut capacities: Vec<u64> = report
        .rows
        .iter()
        .filter_map(|r| r.hbm_capacity_bytes)
        .filter(|c| *c > 0 && mem_max >= *c as f64 * CAPACITY_ON_AXIS_FRACTION)
        .collect();
    capacities.sort_unstable();
    capacities.dedup();
    capacities
}

/// The legend entries of what the chart shows.
fn legend(dots: &[Dot<'_>], capacities: &[u64]) -> Vec<(String, RGBColor)> {
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    let has = |f: &dyn Fn(&SweepRow) -> bool| dots.iter().any(|d| f(d.row));
    if has(&|r| r.status == "ok" && !r.pareto) {
        legend.push(("feasible point".into(), FEASIBLE));
    }
    if has(&|r| r.pareto) {
        legend.push(("Pareto front".into(), FRONT));
    }
    if has(&|r| r.status != "ok") {
        legend.push(("over the device memory".into(), OVER));
    }
    if has(&|r| r.best) {
        legend.push(("best feasible (ringed)".into(), BLACK));
    }
    for c in capacities {
        legend.push((format!("capacity {}", crate::units::bytes(*c)), CAPACITY));
    }
    legend
}

/// The chart as SVG.
pub fn pareto_svg(report: &SweepReport) -> Result<String, ChartError> {
    let dots = plotted(report);
    if dots.is_empty() {
        return message_svg(TITLE, "no simulated point");
    }
    let mem_max = dots.iter().map(|d| d.bytes).fold(0.0, f64::max);
    let capacities = capacities_on_axis(report, mem_max);
    let x_top = capacities.iter().map(|c| *c as f64).fold(mem_max, f64::max);
    let (x_unit, x_scale) = byte_unit(x_top);
    let tps_max = dots.iter().map(|d| d.tokens_per_s).fold(0.0, f64::max);
    let (y_unit, y_scale) = throughput_unit(tps_max);
    let scale = Scale {
        x_scale,
        y_scale,
        x_max: (x_top / x_scale * 1.08).max(1e-9),
        y_max: (tps_max / y_scale * 1.12).max(1e-9),
    };
    let legend = legend(&dots, &capacities);
    let label_all = dots.len() <= LABEL_ALL_MAX;
    render(460, |root| {
        let (plot, legend_area) = root.split_horizontally(WIDTH_PX - LEGEND_PX);
        let mut chart = ChartBuilder::on(&plot)
            .caption(TITLE, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..scale.x_max, 0.0..scale.y_max)
            .map_err(err)?;
        let (xd, yd) = (decimals(scale.x_max), decimals(scale.y_max));
        chart
            .configure_mesh()
            .x_desc(format!("peak memory per rank ({x_unit})"))
            .y_desc(y_unit)
            .label_style((FONT, 12))
            .x_label_formatter(&|v| format!("{v:.xd$}"))
            .y_label_formatter(&|v| format!("{v:.yd$}"))
            .draw()
            .map_err(err)?;
        draw_capacities(&mut chart, &capacities, &scale)?;
        draw_points(&mut chart, &dots, &scale, label_all)?;
        draw_legend(&legend_area, &legend)
    })
}

/// Each capacity as a dashed vertical line with its label at the top.
fn draw_capacities(chart: &mut Chart, capacities: &[u64], scale: &Scale) -> Result<(), ChartError> {
    for c in capacities {
        let x = *c as f64 / scale.x_scale;
        chart
            .draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, scale.y_max)],
                8,
                5,
                CAPACITY.stroke_width(2),
            ))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x, scale.y_max))
                    + Text::new(
                        format!("capacity {}", crate::units::bytes(*c)),
                        (-130, 4),
                        (FONT, 11).into_font().color(&CAPACITY),
                    ),
            ))
            .map_err(err)?;
    }
    Ok(())
}

/// The Pareto front's line, then every dot (coloured by status, the best ringed) and its label.
fn draw_points(
    chart: &mut Chart,
    dots: &[Dot<'_>],
    scale: &Scale,
    label_all: bool,
) -> Result<(), ChartError> {
    let mut front: Vec<(f64, f64)> = dots
        .iter()
        .filter(|d| d.row.pareto)
        .map(|d| scale.at(d))
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    if front.len() > 1 {
        chart
            .draw_series(LineSeries::new(front, FRONT.stroke_width(2)))
            .map_err(err)?;
    }
    for d in dots {
        let colour = if d.row.status != "ok" {
            OVER
        } else if d.row.pareto {
            FRONT
        } else {
            FEASIBLE
        };
        let at = scale.at(d);
        chart
            .draw_series(std::iter::once(Circle::new(at, 4, colour.filled())))
            .map_err(err)?;
        if d.row.best {
            chart
                .draw_series(std::iter::once(Circle::new(at, 9, BLACK.stroke_width(2))))
                .map_err(err)?;
        }
        if let Some(text) = label(d, label_all) {
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at(at)
                        + Text::new(text, (7, -16), (FONT, 11).into_font().color(&BLACK)),
                ))
                .map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(point: usize, tps: f64, mem_gib: f64, status: &str, pareto: bool) -> SweepRow {
        SweepRow {
            point,
            values: vec![format!("{}", 8 << point)],
            strategy: "fsdp2".into(),
            status: status.into(),
            step_time_s: Some(1.0),
            tokens_per_s: Some(tps),
            peak_memory_bytes: Some((mem_gib * (1u64 << 30) as f64) as u64),
            hbm_capacity_bytes: Some(64_000_000_000),
            pareto,
            best: pareto && point == 1,
            ..SweepRow::default()
        }
    }

    /// The numbers among the SVG's text elements (the tick labels).
    fn numbers(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = t.split_once('>')?.1.split_once("</text>")?.0.trim();
                body.parse::<f64>().ok().map(|_| body.to_string())
            })
            .collect()
    }

    #[test]
    fn ticks_are_round_and_the_chart_has_legend_capacity_and_labels() {
        let report = SweepReport {
            scenario: "demo".into(),
            hardware: "hw".into(),
            keys: vec!["mesh.dp_shard".into()],
            rows: vec![
                row(0, 13381.0, 20.3, "ok", false),
                row(1, 26762.0, 31.7, "ok", true),
                row(2, 40143.0, 70.9, "over-memory", false),
            ],
        };
        let svg = pareto_svg(&report).unwrap();
        let ticks = numbers(&svg);
        assert!(ticks.len() >= 6, "{ticks:?}");
        for t in &ticks {
            let digits = t.trim_start_matches(['0', '.']).replace('.', "");
            let significant = digits.trim_end_matches('0').len();
            assert!(
                significant <= 2,
                "tick {t} is not a round number: {ticks:?}"
            );
        }
        for text in [
            "feasible point",
            "Pareto front",
            "over the device memory",
            "best feasible (ringed)",
            "capacity 59.60 GiB",
            "#1 fsdp2 (16)",
            "#0 fsdp2",
            "#2 fsdp2",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        assert!(svg.contains("stroke=\"#D62728\""), "the capacity line");
        assert_eq!(svg, pareto_svg(&report).unwrap(), "deterministic");
    }
}
