//! PNG plots of the report, drawn with plotters and a bundled font (a fresh machine has no fontconfig).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::register_font;

const FONT: &[u8] = include_bytes!("../../../../bench/fonts/DejaVuSans.ttf");

fn font() -> Result<()> {
    register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow!("bundled font refused"))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Latency distributions (ms) as cumulative curves, one per series.
pub fn latency_cdf(path: &Path, title: &str, series: &[(&str, Vec<f64>)]) -> Result<()> {
    font()?;
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(1.0_f64, f64::max);
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((0.5_f64..max * 1.1).log_scale(), 0.0_f64..100.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("percent of reloads at or below")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let colors = [RED, BLUE, BLACK, GREEN, MAGENTA];
    for (i, (name, values)) in series.iter().enumerate() {
        let mut sorted = values.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let n = sorted.len().max(1) as f64;
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                sorted
                    .iter()
                    .enumerate()
                    .map(|(k, v)| (v.max(0.5), (k + 1) as f64 * 100.0 / n)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// RSS (MiB) against the bytes of data watched (MiB), with the data itself as a reference line.
pub fn memory(path: &Path, points: &[(f64, f64, f64)]) -> Result<()> {
    font()?;
    let max_x = points.iter().map(|p| p.0).fold(1.0_f64, f64::max) * 1.1;
    let max_y = points
        .iter()
        .flat_map(|p| [p.0, p.1, p.2])
        .fold(64.0_f64, f64::max)
        * 1.1;
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "S4: rekindle's memory against the data it watches",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0_f64..max_x, 0.0_f64..max_y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("Secret and ConfigMap data in the namespace (MiB)")
        .y_desc("MiB")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let line = |data: Vec<(f64, f64)>,
                color: RGBColor,
                name: &str,
                chart: &mut ChartContext<'_, _, _>|
     -> Result<()> {
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(err)?;
        Ok(())
    };
    line(
        points.iter().map(|p| (p.0, p.0)).collect(),
        BLACK,
        "the data itself",
        &mut chart,
    )?;
    line(
        points.iter().map(|p| (p.0, p.1)).collect(),
        BLUE,
        "RSS after sync",
        &mut chart,
    )?;
    line(
        points.iter().map(|p| (p.0, p.2)).collect(),
        RED,
        "RSS after changes",
        &mut chart,
    )?;
    chart
        .draw_series(LineSeries::new(
            vec![(0.0, 64.0), (max_x, 64.0)],
            GREEN.stroke_width(1),
        ))
        .map_err(err)?
        .label("64 MiB target")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Curves against cluster size: one line with points per series.
pub fn curves(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<()> {
    font()?;
    let points = || series.iter().flat_map(|(_, v)| v.iter().copied());
    let max_x = points().map(|p| p.0).fold(1.0_f64, f64::max) * 1.05;
    let max_y = points().map(|p| p.1).fold(1.0_f64, f64::max) * 1.15;
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0_f64..max_x, 0.0_f64..max_y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let colors = [BLUE, RED, BLACK, GREEN, MAGENTA];
    for (i, (name, data)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(data.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
