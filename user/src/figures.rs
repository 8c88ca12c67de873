//! Figures of the user's report as inline SVG: a chart is a few axes, polylines and
//! bars, so it is drawn here as text rather than through a plotting library (no
//! fonts, no image codecs, nothing to install); a browser renders the page.

use std::fmt::Write;

/// One data series.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points in data units, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// How the points are drawn.
    pub mark: Mark,
}

/// How a series' points are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A line through the points, with a dot on each.
    Line,
    /// Bars from y = 0.
    Bars,
    /// Dots alone (a scatter plot).
    Dots,
}

/// A chart: axes with ticks, the series, an optional vertical marker.
#[derive(Clone, Debug)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The series.
    pub series: Vec<Series>,
    /// Fixed y range; `None` fits the data (and includes 0).
    pub y_range: Option<(f64, f64)>,
    /// X on a log2 scale (epsilon sweeps).
    pub log_x: bool,
    /// A dashed vertical line at this x, labelled.
    pub marker: Option<(f64, String)>,
}

const W: f64 = 640.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Text safe inside SVG/HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// About five round tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|t| *t <= hi + step * 1e-9)
        // 3 x 0.2 is 0.6000000000000001: labels and tests want 0.6.
        .map(|t| (t * 1e9).round() / 1e9)
        .collect()
}

fn label(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e4 || v.abs() < 1e-3) {
        format!("{v:.1e}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Chart {
    fn x_of(&self, x: f64) -> f64 {
        if self.log_x {
            x.max(f64::MIN_POSITIVE).log2()
        } else {
            x
        }
    }

    /// The chart as an `<svg>` element.
    pub fn svg(&self) -> String {
        let frame = self.frame();
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
            W / 2.0,
            escape(&self.title)
        );
        self.write_axes(&mut s, &frame);
        for (i, series) in self.series.iter().enumerate() {
            self.write_series(&mut s, &frame, i, series);
        }
        if let Some((x, text)) = &self.marker {
            let x = frame.px(*x);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#555" stroke-dasharray="4 3"/><text x="{:.1}" y="{}" fill="#555">{}</text>"##,
                H - BOTTOM,
                x + 4.0,
                TOP + 12.0,
                escape(text)
            );
        }
        s.push_str("</svg>");
        s
    }

    /// The data ranges drawn: x (on the chart's scale) padded for bars or a lone
    /// point, y fixed or fitted to the data and 0.
    fn frame(&self) -> Frame<'_> {
        let pts = || self.series.iter().flat_map(|s| s.points.iter());
        let finite = |v: &f64| v.is_finite();
        let xs: Vec<f64> = pts().map(|p| self.x_of(p.0)).filter(finite).collect();
        let ys: Vec<f64> = pts().map(|p| p.1).filter(finite).collect();
        let (mut x0, mut x1) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        if !(x0.is_finite() && x1.is_finite()) {
            (x0, x1) = (0.0, 1.0);
        }
        let bars = self.series.iter().any(|s| s.mark == Mark::Bars);
        if bars || x1 - x0 < 1e-12 {
            // Room for half a bar (or a lone point) on each side.
            (x0, x1) = (x0 - 0.5, x1 + 0.5);
        }
        let (y0, y1) = self.y_range.unwrap_or_else(|| {
            let hi = ys.iter().cloned().fold(0.0f64, f64::max);
            let lo = ys.iter().cloned().fold(0.0f64, f64::min);
            (lo, if hi > lo { hi * 1.05 } else { lo + 1.0 })
        });
        Frame {
            chart: self,
            x: (x0, x1),
            y: (y0, y1),
            bars,
        }
    }

    /// The axes, their ticks and labels.
    fn write_axes(&self, s: &mut String, frame: &Frame<'_>) {
        let (bx, by) = (H - BOTTOM, W - RIGHT);
        let _ = write!(
            s,
            r##"<path d="M{LEFT},{TOP}V{bx}H{by}" fill="none" stroke="#333"/>"##
        );
        for t in ticks(frame.y.0, frame.y.1) {
            let y = frame.py(t);
            let _ = write!(
                s,
                r##"<line x1="{LEFT}" x2="{by}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT - 6.0,
                y + 4.0,
                label(t)
            );
        }
        for t in self.x_ticks(frame) {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                frame.px(t),
                bx + 16.0,
                label(t)
            );
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            H - 12.0,
            escape(&self.x_label),
            (TOP + H - BOTTOM) / 2.0,
            escape(&self.y_label)
        );
    }

    /// Every point's x on a log axis; whole positions (at most ten labels) under
    /// bars; round values otherwise.
    fn x_ticks(&self, frame: &Frame<'_>) -> Vec<f64> {
        let (x0, x1) = frame.x;
        if self.log_x {
            let mut v: Vec<f64> = self
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .collect();
            v.sort_by(f64::total_cmp);
            v.dedup();
            v
        } else if frame.bars {
            let n = (x1 - 0.5).round() as i64;
            let step = ((n as f64) / 10.0).ceil().max(1.0) as i64;
            (1..=n)
                .filter(|i| (i - 1) % step == 0)
                .map(|i| i as f64)
                .collect()
        } else {
            ticks(x0, x1)
        }
    }

    /// Series `i`: bars, or a line with dots; and its legend entry where there
    /// are several.
    fn write_series(&self, s: &mut String, frame: &Frame<'_>, i: usize, series: &Series) {
        let color = COLORS[i % COLORS.len()];
        let visible = series
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite());
        if series.mark == Mark::Bars {
            let slot = (W - LEFT - RIGHT) / (frame.x.1 - frame.x.0);
            for &(x, y) in visible {
                let (top, base) = (frame.py(y.max(0.0)), frame.py(y.min(0.0)));
                let _ = write!(
                    s,
                    r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{color}" fill-opacity="0.7"/>"#,
                    frame.px(x) - slot * 0.4,
                    slot * 0.8,
                    (base - top).max(0.5)
                );
            }
        } else {
            if series.mark == Mark::Line {
                let coords: Vec<String> = visible
                    .clone()
                    .map(|&(x, y)| format!("{:.1},{:.1}", frame.px(x), frame.py(y)))
                    .collect();
                let _ = write!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                    coords.join(" ")
                );
            }
            let (r, opacity) = match series.mark {
                Mark::Dots => (2.0, 0.6),
                _ => (3.0, 1.0),
            };
            for &(x, y) in visible {
                let _ = write!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="{r}" fill="{color}" fill-opacity="{opacity}"/>"#,
                    frame.px(x),
                    frame.py(y)
                );
            }
        }
        if self.series.len() < 2 {
            // The title names a lone series; a legend would only cover data.
            return;
        }
        let ly = TOP + 6.0 + 16.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{}" y="{ly}" width="10" height="10" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT - 170.0,
            W - RIGHT - 155.0,
            ly + 9.0,
            escape(&series.name)
        );
    }
}

/// The data ranges of a chart and the map from data to drawing coordinates.
struct Frame<'a> {
    chart: &'a Chart,
    x: (f64, f64),
    y: (f64, f64),
    bars: bool,
}

impl Frame<'_> {
    fn px(&self, x: f64) -> f64 {
        let (x0, x1) = self.x;
        LEFT + (self.chart.x_of(x) - x0) / (x1 - x0) * (W - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        let (y0, y1) = self.y;
        TOP + (y1 - y.clamp(y0, y1)) / (y1 - y0) * (H - TOP - BOTTOM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polyline_points(svg: &str) -> Vec<(f64, f64)> {
        let start = svg.find("<polyline points=\"").expect("polyline") + 18;
        let end = start + svg[start..].find('"').expect("end");
        svg[start..end]
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').expect("pair");
                (x.parse().expect("x"), y.parse().expect("y"))
            })
            .collect()
    }

    #[test]
    fn points_land_inside_the_plot_in_order_and_higher_values_higher() {
        let chart = Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "s".into(),
                points: vec![(0.5, 0.2), (1.0, 0.9), (2.0, 0.5)],
                mark: Mark::Line,
            }],
            y_range: Some((0.0, 1.0)),
            log_x: true,
            marker: None,
        };
        let p = polyline_points(&chart.svg());
        assert_eq!(p.len(), 3);
        for &(x, y) in &p {
            assert!((LEFT..=W - RIGHT).contains(&x) && (TOP..=H - BOTTOM).contains(&y));
        }
        // log2 scale: 0.5 -> 1 -> 2 are equally spaced.
        assert!(((p[1].0 - p[0].0) - (p[2].0 - p[1].0)).abs() < 0.2, "{p:?}");
        // SVG y grows downwards.
        assert!(p[1].1 < p[2].1 && p[2].1 < p[0].1, "{p:?}");
    }

    #[test]
    fn text_is_escaped_and_ticks_are_round() {
        let chart = Chart {
            title: "a < b & \"c\"".into(),
            x_label: String::new(),
            y_label: String::new(),
            series: vec![
                Series {
                    name: "<s>".into(),
                    points: vec![(1.0, 3.0), (2.0, 7.0)],
                    mark: Mark::Bars,
                },
                Series {
                    name: "line".into(),
                    points: vec![(1.0, 1.0), (2.0, 2.0)],
                    mark: Mark::Line,
                },
            ],
            y_range: None,
            log_x: false,
            marker: Some((1.5, "k = 1".into())),
        };
        let svg = chart.svg();
        assert!(svg.contains("a &lt; b &amp; &quot;c&quot;") && svg.contains("&lt;s&gt;"));
        assert!(!svg.contains("<s>"));
        assert_eq!(
            svg.matches("<rect").count(),
            4,
            "two bars and two legend swatches"
        );
        assert_eq!(ticks(0.0, 7.35), [0.0, 2.0, 4.0, 6.0]);
        assert_eq!(ticks(0.0, 1.0), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
    }
}
