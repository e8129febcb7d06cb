//! The charts, drawn by plotters as SVG on the server. Each says in words
//! what it shows (`role="img"` with a `<title>`), and marks failures by
//! shape as well as colour.

use plotters::prelude::*;

const PASS: RGBColor = RGBColor(0x1a, 0x7f, 0x37);
const FAIL: RGBColor = RGBColor(0xc2, 0x1f, 0x1f);
const LINE: RGBColor = RGBColor(0x24, 0x51, 0x9e);
const BAND: RGBColor = RGBColor(0x9e, 0xb8, 0xe0);

/// Gives the chart its accessible name. Only numbers and fixed words go
/// into `title`, never text from a trace.
fn titled(svg: String, title: &str) -> String {
    match svg.find('>') {
        Some(end) => format!(
            "{} role=\"img\" aria-label=\"{title}\"><title>{title}</title>{}",
            &svg[..end],
            &svg[end + 1..]
        ),
        None => svg,
    }
}

/// A plotters error, which only a bad range could cause, leaves the chart out.
fn drawn(f: impl FnOnce(&mut String) -> Result<(), Box<dyn std::error::Error + '_>>) -> String {
    let mut svg = String::new();
    if f(&mut svg).is_err() {
        return String::new();
    }
    svg
}

/// Pass rate per day, oldest first: `(day, passed, results)`.
pub fn sparkline(days: &[(i64, u64, u64)]) -> String {
    if days.is_empty() {
        return String::new();
    }
    let rates: Vec<(i64, f64)> = days.iter().map(|&(d, p, t)| (d, p as f64 / t.max(1) as f64)).collect();
    let (first, last) = (rates[0].0, rates[rates.len() - 1].0);
    let svg = drawn(|out| {
        let root = SVGBackend::with_string(out, (140, 28)).into_drawing_area();
        let mut chart = ChartBuilder::on(&root)
            .margin(3)
            .build_cartesian_2d(first as f64 - 0.5..last as f64 + 0.5, -0.05f64..1.05f64)?;
        chart.draw_series(LineSeries::new(rates.iter().map(|&(d, r)| (d as f64, r)), LINE.stroke_width(2)))?;
        chart.draw_series(
            rates
                .iter()
                .filter(|&&(_, r)| r >= 1.0)
                .map(|&(d, r)| Circle::new((d as f64, r), 2, LINE.filled())),
        )?;
        // A day with a failure gets a cross, not only a colour.
        chart.draw_series(
            rates
                .iter()
                .filter(|&&(_, r)| r < 1.0)
                .map(|&(d, r)| Cross::new((d as f64, r), 3, FAIL.stroke_width(2))),
        )?;
        root.present()?;
        Ok(())
    });
    let (lo, hi) = rates.iter().fold((1.0f64, 0.0f64), |(lo, hi), &(_, r)| (lo.min(r), hi.max(r)));
    titled(
        svg,
        &format!(
            "pass rate over {} day(s): lowest {:.0}%, highest {:.0}%, latest {:.0}%",
            rates.len(),
            lo * 100.0,
            hi * 100.0,
            rates[rates.len() - 1].1 * 100.0
        ),
    )
}

/// One point of the score chart, oldest first.
pub struct Scored {
    pub score: f64,
    pub failed: bool,
    /// The dynamic threshold's band at this point (mean ± 2 standard
    /// deviations of the scores before it), once there are enough.
    pub band: Option<(f64, f64)>,
}

/// Scores over time with the dynamic-threshold band; failures as crosses,
/// points below the band (drift alerts) as triangles.
pub fn scores(points: &[Scored]) -> String {
    if points.is_empty() {
        return String::new();
    }
    let n = points.len();
    let svg = drawn(|out| {
        let root = SVGBackend::with_string(out, (720, 240)).into_drawing_area();
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(36)
            .build_cartesian_2d(0f64..(n.max(2) - 1) as f64, -0.02f64..1.02f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .y_labels(6)
            .x_labels(n.clamp(2, 8))
            .x_desc("result (oldest to newest)")
            // Results are whole numbers: ticks between them go unlabelled.
            .x_label_formatter(&|x| {
                if x.fract() == 0.0 {
                    format!("{}", *x as i64 + 1)
                } else {
                    String::new()
                }
            })
            .draw()?;
        let banded: Vec<(usize, (f64, f64))> = points.iter().enumerate().filter_map(|(i, p)| Some((i, p.band?))).collect();
        if !banded.is_empty() {
            // The band as a polygon: its top left to right, its bottom back.
            let mut outline: Vec<(f64, f64)> = banded.iter().map(|&(i, (_, hi))| (i as f64, hi.min(1.02))).collect();
            outline.extend(banded.iter().rev().map(|&(i, (lo, _))| (i as f64, lo.max(-0.02))));
            chart.draw_series(std::iter::once(Polygon::new(outline, BAND.mix(0.35).filled())))?;
        }
        chart.draw_series(LineSeries::new(
            points.iter().enumerate().map(|(i, p)| (i as f64, p.score)),
            LINE.stroke_width(2),
        ))?;
        chart.draw_series(
            points
                .iter()
                .enumerate()
                .filter(|(_, p)| p.failed)
                .map(|(i, p)| Cross::new((i as f64, p.score), 4, FAIL.stroke_width(2))),
        )?;
        chart.draw_series(
            points
                .iter()
                .enumerate()
                .filter(|(_, p)| p.band.is_some_and(|(lo, _)| p.score < lo))
                .map(|(i, p)| TriangleMarker::new((i as f64, p.score), 6, FAIL.filled())),
        )?;
        root.present()?;
        Ok(())
    });
    let failed = points.iter().filter(|p| p.failed).count();
    let below = points.iter().filter(|p| p.band.is_some_and(|(lo, _)| p.score < lo)).count();
    titled(
        svg,
        &format!(
            "scores of the last {n} result(s), oldest to newest: {failed} did not pass, {below} fell below the dynamic-threshold band"
        ),
    )
}

/// How many scores fell in each tenth of [0, 1].
pub fn bins(scores: impl Iterator<Item = f64>) -> [u64; 10] {
    let mut bins = [0u64; 10];
    for s in scores {
        bins[((s.clamp(0.0, 1.0) * 10.0) as usize).min(9)] += 1;
    }
    bins
}

/// The distribution of scores in ten bins.
pub fn histogram(bins: &[u64; 10]) -> String {
    let top = bins.iter().copied().max().unwrap_or(0).max(1);
    let svg = drawn(|out| {
        let root = SVGBackend::with_string(out, (360, 180)).into_drawing_area();
        let mut chart = ChartBuilder::on(&root)
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..1f64, 0f64..top as f64 * 1.05)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(TRANSPARENT)
            .x_labels(6)
            .y_labels(4)
            .y_label_formatter(&|y| if y.fract() == 0.0 { format!("{y}") } else { String::new() })
            .x_desc("score")
            .draw()?;
        chart.draw_series(bins.iter().enumerate().map(|(i, &c)| {
            let x = i as f64 / 10.0;
            let color = if i >= 5 { PASS } else { FAIL };
            Rectangle::new([(x + 0.005, 0.0), (x + 0.095, c as f64)], color.mix(0.8).filled())
        }))?;
        root.present()?;
        Ok(())
    });
    let words: Vec<String> = bins
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{:.1} to {:.1}: {c}", i as f64 / 10.0, (i + 1) as f64 / 10.0))
        .collect();
    titled(svg, &format!("distribution of scores; {}", words.join(", ")))
}
