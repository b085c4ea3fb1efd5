//! SVG charts in one house style (white page, caption, margins, a mesh without light lines, a
//! boxed legend), drawn with plotters: `examples/simulate.rs` draws the algorithm figures of
//! `docs/` with it, and `replay --plot` its per-rule panels.

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

/// What drawing returns: plotters' errors carry the backend's error type, so they are boxed.
pub type Plot = Result<(), Box<dyn std::error::Error>>;

/// A white SVG page of `size` pixels that writes `path` when presented.
pub fn page<'a>(
    path: &'a std::path::Path,
    size: (u32, u32),
) -> Result<DrawingArea<SVGBackend<'a>, Shift>, Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// A chart builder with the house caption and margins; `y_label_area` is the width of the y
/// labels (wider for bigger numbers).
pub fn builder<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    y_label_area: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.caption(caption, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(y_label_area);
    b
}

/// Draws the house mesh: axis descriptions, `x_labels` labels, no light grid lines.
pub fn mesh<DB, X, Y>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
    x_labels: usize,
) -> Plot
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(x_labels)
        .light_line_style(WHITE)
        .draw()?;
    Ok(())
}

/// Draws the series' legend in a white box with a black border at `position`.
pub fn legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Plot
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
