//! The charts of `vramfit bench cluster --plots DIR`: GPU memory used and
//! committed over time, and the distribution of completion times, one line
//! per policy, as SVG files.

use std::path::{Path, PathBuf};

use plotters::coord::CoordTranslate;
use plotters::prelude::*;

use super::ClusterReport;

const COLORS: [RGBColor; 4] = [
    RGBColor(0x44, 0x44, 0x44),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
];

/// Writes `memory.svg` and `jct.svg` into `dir` (created if missing) and
/// returns their paths.
pub fn write(report: &ClusterReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let memory = dir.join("memory.svg");
    let jct = dir.join("jct.svg");
    memory_chart(report, &memory)?;
    jct_chart(report, &jct)?;
    Ok(vec![memory, jct])
}

fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plot: {e:?}")
}

/// One policy's line, named in the legend.
fn labelled_line<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    points: Vec<(f64, f64)>,
    name: &str,
    color: RGBColor,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate<From = (f64, f64)>,
{
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(2)))
        .map_err(plot_error)?
        .label(name.to_string())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    Ok(())
}

fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

fn memory_chart(report: &ClusterReport, path: &Path) -> anyhow::Result<()> {
    let capacity = report.gpus as f64
        * crate::predict::gpu_profile("H200").map_or(1.0, |g| g.capacity_bytes as f64);
    let end_h = report
        .policies
        .iter()
        .flat_map(|p| p.timeline.last())
        .map(|s| s.0 / 3600.0)
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "GPU memory used (solid) and committed (dashed), % of all GPUs",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..end_h, 0.0..100.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("hours")
        .y_desc("%")
        .draw()
        .map_err(plot_error)?;
    for (i, policy) in report.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let used: Vec<(f64, f64)> = policy
            .timeline
            .iter()
            .map(|s| (s.0 / 3600.0, s.1 as f64 / capacity * 100.0))
            .collect();
        let committed: Vec<(f64, f64)> = policy
            .timeline
            .iter()
            .map(|s| (s.0 / 3600.0, s.2 as f64 / capacity * 100.0))
            .collect();
        labelled_line(&mut chart, used, &policy.name, color)?;
        chart
            .draw_series(DashedLineSeries::new(
                committed,
                4,
                4,
                color.stroke_width(1),
            ))
            .map_err(plot_error)?;
    }
    legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn jct_chart(report: &ClusterReport, path: &Path) -> anyhow::Result<()> {
    let max_h = report
        .policies
        .iter()
        .flat_map(|p| p.jct.iter())
        .fold(1.0f64, |m, &t| m.max(t / 3600.0));
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Job completion time, cumulative share of finished jobs",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d((0.01..max_h).log_scale(), 0.0..1.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("hours (log)")
        .y_desc("share of jobs")
        .draw()
        .map_err(plot_error)?;
    for (i, policy) in report.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut jct: Vec<f64> = policy.jct.iter().map(|t| (t / 3600.0).max(0.01)).collect();
        jct.sort_by(f64::total_cmp);
        let n = jct.len().max(1) as f64;
        let step = (jct.len() / 1000).max(1);
        let points: Vec<(f64, f64)> = jct
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || *k + 1 == jct.len())
            .map(|(k, &t)| (t, (k + 1) as f64 / n))
            .collect();
        labelled_line(&mut chart, points, &policy.name, color)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
#[path = "plots_tests.rs"]
mod tests;
