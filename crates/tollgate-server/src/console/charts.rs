//! The console's charts, drawn on the server as SVG with `plotters` (no script charting library
//! in the page). Amounts become pixel positions here and nowhere else: the tables beside each
//! chart carry the exact decimal values.

use chrono::NaiveDate;
use plotters::prelude::*;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

/// Width of a chart, in pixels.
pub const CHART_WIDTH_PX: u32 = 900;
/// Height of a chart, in pixels.
pub const CHART_HEIGHT_PX: u32 = 320;

/// A chart that could not be drawn (a plotting error, never data).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chart: {0}")]
pub struct ChartError(String);

fn failed(e: impl std::fmt::Display) -> ChartError {
    ChartError(e.to_string())
}

/// One named line or bar group.
#[derive(Debug, Clone, PartialEq)]
pub struct Series<T> {
    /// Legend label (an outcome, or `consumer / model`).
    pub label: String,
    /// One value per x position.
    pub values: Vec<T>,
}

/// Calls per minute by outcome: one line per outcome over `minutes` one-minute buckets, oldest
/// first (x = minutes before now).
///
/// # Errors
/// The drawing failed.
pub fn calls_per_minute(series: &[Series<u64>], minutes: u32) -> Result<String, ChartError> {
    let minutes = i64::from(minutes.max(1));
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (CHART_WIDTH_PX, CHART_HEIGHT_PX))
            .into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .caption("Calls per minute by outcome", ("sans-serif", 16))
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d(-minutes..0i64, 0u64..top + top / 5 + 1)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("minutes from now")
            .y_desc("calls")
            .draw()
            .map_err(failed)?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let start = -i64::try_from(s.values.len()).unwrap_or(minutes);
            let points = s
                .values
                .iter()
                .enumerate()
                .map(|(x, y)| (start + i64::try_from(x).unwrap_or(0), *y));
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(failed)?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()
                .map_err(failed)?;
        }
        root.present().map_err(failed)?;
    }
    Ok(svg)
}

/// Settled amounts by day, stacked by `consumer / model`: one bar per day in `days`, one
/// segment per series (its value on that day).
///
/// # Errors
/// The drawing failed.
pub fn settlements_by_day(
    days: &[NaiveDate],
    series: &[Series<Decimal>],
    currency: &str,
) -> Result<String, ChartError> {
    let pixel = |d: Decimal| d.to_f64().unwrap_or(0.0);
    let totals: Vec<Decimal> = (0..days.len())
        .map(|day| {
            series
                .iter()
                .filter_map(|s| s.values.get(day))
                .copied()
                .sum()
        })
        .collect();
    let top = totals
        .iter()
        .copied()
        .max()
        .map_or(0.0, pixel)
        .max(f64::EPSILON);
    let bars = days.len().max(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (CHART_WIDTH_PX, CHART_HEIGHT_PX))
            .into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let x_max = f64::from(u32::try_from(bars).unwrap_or(u32::MAX)) - 0.5;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .caption(
                format!("Settled per day ({currency}), by consumer / model"),
                ("sans-serif", 16),
            )
            .x_label_area_size(32)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..x_max, 0f64..top * 1.15)
            .map_err(failed)?;
        let label_of = |x: &f64| {
            let at = x.round();
            if (x - at).abs() > 0.01 || at < 0.0 {
                return String::new();
            }
            days.get(at.to_usize().unwrap_or(usize::MAX))
                .map(|d| d.format("%m-%d").to_string())
                .unwrap_or_default()
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.min(16))
            .x_label_formatter(&label_of)
            .y_desc(currency)
            .draw()
            .map_err(failed)?;
        let mut base = vec![0f64; days.len()];
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut rects = Vec::new();
            for (day, value) in s.values.iter().enumerate().take(days.len()) {
                let x = f64::from(u32::try_from(day).unwrap_or(u32::MAX));
                let y0 = base[day];
                let y1 = y0 + pixel(*value);
                base[day] = y1;
                rects.push(Rectangle::new(
                    [(x - 0.35, y0), (x + 0.35, y1)],
                    color.filled(),
                ));
            }
            chart
                .draw_series(rects)
                .map_err(failed)?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()
                .map_err(failed)?;
        }
        root.present().map_err(failed)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sc_156_charts_are_svg_with_one_mark_per_value() {
        let lines = calls_per_minute(
            &[Series {
                label: "success".into(),
                values: vec![0, 2, 5],
            }],
            3,
        )
        .unwrap();
        assert!(lines.starts_with("<svg") && lines.contains("<polyline"));
        assert!(!lines.contains("style=") && !lines.contains("<script"));
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let bars = settlements_by_day(
            &[day, day.succ_opt().unwrap()],
            &[Series {
                label: "team-a / mock-echo".into(),
                values: vec![Decimal::new(5, 5), Decimal::new(7, 5)],
            }],
            "USD",
        )
        .unwrap();
        // Background, the plot area, two bars, the legend's swatch and box.
        let rects = bars.matches("<rect").count();
        let empty = settlements_by_day(&[day], &[], "USD").unwrap();
        assert!(rects >= empty.matches("<rect").count() + 2, "{rects}");
        assert!(!bars.contains("style="));
    }

    /// SC-199: legend labels (consumer and model names, outcomes) and the currency are text in
    /// the SVG, escaped as markup, so a name cannot add an element or an attribute.
    #[test]
    fn sc_199_names_in_charts_are_escaped_text() {
        let hostile = "<script>alert(1)</script>\" onload=\"x";
        let day = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let bars = settlements_by_day(
            &[day],
            &[Series {
                label: format!("{hostile} / <img src=x onerror=y>"),
                values: vec![Decimal::new(5, 5)],
            }],
            "<b>USD</b>",
        )
        .unwrap();
        let lines = calls_per_minute(
            &[Series {
                label: hostile.into(),
                values: vec![1, 2],
            }],
            2,
        )
        .unwrap();
        for svg in [&bars, &lines] {
            assert!(!svg.contains("<script") && !svg.contains("<img"), "{svg}");
            assert!(!svg.contains("<b>") && !svg.contains("\" onload="), "{svg}");
            assert!(
                svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
                "{svg}"
            );
        }
        assert!(bars.contains("&lt;img src=x onerror=y&gt;"), "{bars}");
    }
}
