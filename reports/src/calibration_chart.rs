//! The calibration report's predicted-vs-measured chart: one horizontal bar per figure row,
//! the relative error `predicted / measured - 1` (clipped to ±100% for display, the table has
//! the exact value), green when the row is within tolerance and red when not, with the row's
//! tolerance drawn as two ticks.

use crate::charts::{
    ChartError, FONT, RowAxis, err, label_area_px_to, message_svg, render, row_at, row_centre,
    short_to,
};
use plotters::prelude::*;

/// One row of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorBar {
    /// Row label (`FSDP2 step time (s)`).
    pub label: String,
    /// `predicted / measured - 1`; NaN when the measurement is zero.
    pub relative_error: f64,
    /// Tolerance as a relative error (e.g. 0.10), when it has one.
    pub tolerance: Option<f64>,
    /// Within tolerance.
    pub passed: bool,
}

const PASS: RGBColor = RGBColor(0x59, 0xa1, 0x4f);
const FAIL: RGBColor = RGBColor(0xe1, 0x57, 0x59);
/// Display clip of the error axis, as a fraction.
const CLIP: f64 = 1.0;
/// Longest row label drawn, characters (a run and a figure name: `HyperParallel-FSDP:
/// weighted FSDP collective bandwidth (GB/s)` is 61).
const LABEL_CHARS: usize = 64;

/// The chart as an SVG document.
pub fn predicted_vs_measured_svg(title: &str, bars: &[ErrorBar]) -> Result<String, ChartError> {
    let bars: Vec<&ErrorBar> = bars
        .iter()
        .filter(|b| b.relative_error.is_finite())
        .collect();
    let n = bars.len();
    if n == 0 {
        return message_svg(title, "no figure with a non-zero measurement");
    }
    let names: Vec<String> = bars
        .iter()
        .map(|b| short_to(&b.label, LABEL_CHARS))
        .collect();
    let height = 90 + 22 * n as u32;
    render(height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 18))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(label_area_px_to(&names, LABEL_CHARS))
            .build_cartesian_2d(-CLIP * 100.0..CLIP * 100.0, RowAxis::new(n))
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("predicted / measured - 1 (%), clipped at ±100%")
            .label_style((FONT, 12))
            .x_label_formatter(&|v| format!("{v:+.0}"))
            .y_label_formatter(&|v| row_at(*v, n).map_or_else(String::new, |i| names[i].clone()))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, 0.0), (0.0, n as f64)],
                BLACK.stroke_width(1),
            )))
            .map_err(err)?;
        for (i, b) in bars.iter().enumerate() {
            let y = row_centre(i, n);
            let x = (b.relative_error * 100.0).clamp(-CLIP * 100.0, CLIP * 100.0);
            let color = if b.passed { PASS } else { FAIL };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y - 0.32), (x, y + 0.32)],
                    color.filled(),
                )))
                .map_err(err)?;
            if let Some(t) = b.tolerance {
                let t = (t * 100.0).min(CLIP * 100.0);
                for tx in [-t, t] {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(tx, y - 0.45), (tx, y + 0.45)],
                            BLACK.stroke_width(2),
                        )))
                        .map_err(err)?;
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_rows_are_red_and_passing_rows_green() {
        let svg = predicted_vs_measured_svg(
            "t",
            &[
                ErrorBar {
                    label: "a".into(),
                    relative_error: 0.05,
                    tolerance: Some(0.1),
                    passed: true,
                },
                ErrorBar {
                    label: "b".into(),
                    relative_error: -0.4,
                    tolerance: Some(0.1),
                    passed: false,
                },
            ],
        )
        .unwrap();
        assert!(
            svg.contains("#59A14F") || svg.contains("#59a14f"),
            "no pass colour"
        );
        assert!(
            svg.contains("#E15759") || svg.contains("#e15759"),
            "no fail colour"
        );
    }
}
