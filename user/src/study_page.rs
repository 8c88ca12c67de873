//! `report.html`: one study's page beside its outputs. What was released under
//! which guarantee, the scree plot with the noise floor, the cumulative explained
//! variance, the loadings of the leading components and the files written; all of
//! it from the release and public parameters, so it spends nothing.

use std::fmt::Write as _;

use dpca_common::linalg::Pca;

use crate::figures::{escape, Chart, Mark, Series};
use crate::report::{page, table_rows, StudyReport, OUTPUT_FILES};

/// Components shown in the report's figures (all of them up to this many).
const FIGURE_COMPONENTS: usize = 40;

/// Leading components whose loadings the page lists, and features per component.
const LOADING_COMPONENTS: usize = 3;
const LOADING_FEATURES: usize = 5;

/// How many rows the row-norm clip shortened, as the report and the summary say it.
pub fn clipped_text(report: &StudyReport) -> String {
    match report.clipped_rows {
        None => "not known here (each owner's report says its own)".into(),
        Some(c) if c as u64 == report.n_rows && c > 0 => format!("all {c} (every row)"),
        Some(c) => format!(
            "{c} of {} ({:.1}%)",
            report.n_rows,
            100.0 * c as f64 / report.n_rows.max(1) as f64
        ),
    }
}

/// A warning when the clip shortened more than a tenth of the rows (a given C),
/// or a tenth more than the quantile that chose C asked for: the components then
/// describe the bound as much as the data.
pub fn clipping_warning(report: &StudyReport) -> Option<String> {
    let share = report.clipped_rows? as f64 / report.n_rows.max(1) as f64;
    let c = report.row_norm_bound;
    match &report.row_norm_choice {
        None => (share > 0.1).then(|| {
            format!(
                "rows clipped to the row-norm bound C = {c:.4}: {}. They were longer than C \
                 and were scaled down to it, so the components describe the bound as much \
                 as the data. Choose C from the data privately (--row-norm-quantile 0.9) \
                 or set a larger --row-norm-bound.",
                clipped_text(report)
            )
        }),
        Some(choice) => (share > 1.0 - choice.quantile + 0.1).then(|| {
            format!(
                "rows clipped to the row-norm bound C = {c:.4}, chosen as the {} quantile of \
                 the rows' norms: {}, more than the quantile asked for (the histogram's noise \
                 or its bins put C low). The components describe the bound as much as the \
                 data: set a larger --row-norm-bound, or a higher --row-norm-quantile.",
                choice.quantile,
                clipped_text(report)
            )
        }),
    }
}

/// What the noise floor says of the top k, in a sentence.
pub fn noise_sentence(report: &StudyReport) -> String {
    let (k, above) = (report.k, report.components_above_noise);
    let verdict = match above {
        0 => "no component stands above it: at this noise level the components are noise, \
              not structure of the data"
            .to_string(),
        n if n < k => format!(
            "only the first {n} of the {k} components stand above it; the others are \
             within the noise"
        ),
        n => format!("all {k} components stand above it ({n} in all)"),
    };
    format!(
        "The noise floor, about the largest eigenvalue the release's noise alone would \
         give S'/N, is {:.4}: {verdict}.",
        report.noise_floor
    )
}

/// Synthetic rows on the first two principal coordinates (about the DP mean),
/// with their class where they have one.
#[derive(Clone, Debug, Default)]
pub struct SyntheticView {
    /// (class index, PC1, PC2) of each row shown.
    pub points: Vec<(Option<usize>, f64, f64)>,
    /// The class labels the indices name.
    pub labels: Vec<String>,
}

impl SyntheticView {
    /// The figure: one series of dots per class (one in all without classes).
    fn chart(&self) -> Chart {
        let groups = self.labels.len().max(1);
        let series = (0..groups)
            .map(|g| Series {
                name: self
                    .labels
                    .get(g)
                    .cloned()
                    .unwrap_or_else(|| "synthetic".into()),
                points: self
                    .points
                    .iter()
                    .filter(|(c, _, _)| c.unwrap_or(0) == g)
                    .map(|&(_, a, b)| (a, b))
                    .collect(),
                mark: Mark::Dots,
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        Chart {
            title: format!(
                "Synthetic rows on the first two components ({} shown)",
                self.points.len()
            ),
            x_label: "PC1".into(),
            y_label: "PC2".into(),
            series,
            y_range: None,
            log_x: false,
            marker: None,
        }
    }
}

/// The study's page; with synthetic rows, their figure beside the eigenvalues'.
pub fn study_page(report: &StudyReport, pca: &Pca, synthetic: Option<&SyntheticView>) -> String {
    let mut warnings = String::new();
    for w in clipping_warning(report)
        .into_iter()
        .chain((report.components_above_noise < report.k).then(|| noise_sentence(report)))
    {
        let _ = writeln!(warnings, "<p><b>Warning:</b> {}</p>", escape(&w));
    }
    let explained: f64 = pca
        .explained_ratio
        .iter()
        .take(report.k)
        .map(|r| r.max(0.0))
        .sum();
    let figure = synthetic.map_or(String::new(), |view| {
        format!(
            "<h2>Synthetic rows</h2>\n{}\n<p>Each dot is a synthetic row (PCA-Gauss, \
             post-processing of the release) on the first two components, about the DP \
             mean; synthetic.csv holds them all in the input's units.</p>\n",
            view.chart().svg()
        )
    });
    let body = format!(
        "<p>Everything on this page is computed from the differentially private \
         release and public parameters, but for the counts of rows of a local run \
         (where the user holds the rows): the rows clipped and each owner's rows \
         are exact, not private; leave them out of what you publish.</p>\n{warnings}{}\
         <h2>Eigenvalues</h2>\n{}\n<p>{}</p>\n<p>The first {k} components explain {:.1}% of \
         the variance of the noisy covariance (negative eigenvalues, where noise outweighs \
         signal, count as 0).</p>\n{}\n{figure}<h2>Leading components</h2>\n{}{}\
         <h2>Privacy spent</h2>\n{}<h2>Files</h2>\n{}",
        facts(report),
        scree(report, pca).svg(),
        escape(&noise_sentence(report)),
        100.0 * explained,
        cumulative(report, pca).svg(),
        loadings(report, pca),
        preprocessing(report),
        budget(report),
        files(report),
        k = report.k
    );
    page("Private PCA: study report", &body)
}

/// Features the preprocessing table lists; study.json has them all.
const LISTED_FEATURES: usize = 16;

/// How each feature was mapped to [-1, 1]: the bounds chosen privately (range,
/// center, scale), or where the bounds came from.
fn preprocessing(report: &StudyReport) -> String {
    let Some(choice) = &report.bounds_choice else {
        let source = match report.bounds_from_data {
            true => "read off the data (--insecure-bounds-from-data: not private)",
            false => "given in the bounds file (public)",
        };
        return format!("<h2>Preprocessing</h2>\n<p>Bounds {source}.</p>\n");
    };
    let mut out = format!(
        "<h2>Preprocessing</h2>\n<p>Every feature's bounds were chosen privately by a \
         marginal histogram study (epsilon {:.4} alone): its values were found in \
         [lo, hi], it is centered on their median and scaled by the half-width that \
         holds that range, then clipped to it. Synthetic values are kept in [lo, hi].</p>\n\
         <table><tr><th>feature</th><th>lo</th><th>hi</th><th>center</th><th>scale</th></tr>",
        choice.epsilon
    );
    for (name, f) in report
        .features
        .iter()
        .zip(&choice.scaling.features)
        .take(LISTED_FEATURES)
    {
        let pooled = if f.pooled { " (pooled range)" } else { "" };
        let _ = write!(
            out,
            "<tr><th>{}{pooled}</th><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td><td>{:.4}</td></tr>",
            escape(name),
            f.lo,
            f.hi,
            f.center,
            f.scale
        );
    }
    let more = report.features.len().saturating_sub(LISTED_FEATURES);
    out + &match more {
        0 => "</table>\n".to_string(),
        n => format!("</table>\n<p>and {n} more in study.json.</p>\n"),
    }
}

fn facts(report: &StudyReport) -> String {
    let missing = match report.owners_missing.is_empty() {
        true => " (none missing)".to_string(),
        false => format!(
            " ({} missing: {})",
            report.owners_missing.len(),
            report.owners_missing.join(", ")
        ),
    };
    table_rows(&[
        ("study", report.study_id.clone()),
        ("written", report.written_at.clone()),
        ("rows N", report.n_rows.to_string()),
        ("features M", report.n_features.to_string()),
        ("owners counted", format!("{}{missing}", report.n_owners)),
        (
            "mechanism",
            format!("{} ({} centering)", report.mechanism, report.centering),
        ),
        (
            "privacy spent",
            format!(
                "epsilon {:.4}, delta {:.3e} in all (by block below)",
                report.budget.epsilon, report.budget.delta
            ),
        ),
        ("whom the noise guards against", report.trust.line()),
        ("noise sd per entry of S", format!("{:.4e}", report.sigma)),
        ("noise floor of S'/N", format!("{:.4}", report.noise_floor)),
        (
            "components above it",
            format!(
                "{} of the top {}",
                report.components_above_noise.min(report.k),
                report.k
            ),
        ),
        ("row-norm bound C", format!("{:.4}", report.row_norm_bound)),
        ("rows clipped to C", clipped_text(report)),
        ("key size", format!("{} bits", report.encryption.key_bits)),
        ("task", report.task.clone()),
        ("synthetic rows", report.synthetic_rows.to_string()),
    ])
}

fn scree(report: &StudyReport, pca: &Pca) -> Chart {
    let shown = pca.eigenvalues.len().min(FIGURE_COMPONENTS);
    let idx = |i: usize| (i + 1) as f64;
    let of_all = match shown < pca.eigenvalues.len() {
        true => format!(", the first {shown} of {}", pca.eigenvalues.len()),
        false => String::new(),
    };
    Chart {
        title: format!("Scree plot (eigenvalues of the noisy covariance S'/N{of_all})"),
        x_label: "component".into(),
        y_label: "eigenvalue".into(),
        series: vec![
            Series {
                name: "eigenvalue".into(),
                points: (0..shown).map(|i| (idx(i), pca.eigenvalues[i])).collect(),
                mark: Mark::Bars,
            },
            Series {
                name: "noise floor".into(),
                points: vec![
                    (idx(0), report.noise_floor),
                    (idx(shown.max(1) - 1), report.noise_floor),
                ],
                mark: Mark::Line,
            },
        ],
        y_range: None,
        log_x: false,
        marker: Some((report.k as f64 + 0.5, format!("k = {}", report.k))),
    }
}

fn cumulative(report: &StudyReport, pca: &Pca) -> Chart {
    let shown = pca.eigenvalues.len().min(FIGURE_COMPONENTS);
    let mut cum = 0.0;
    Chart {
        title: "Cumulative explained variance".into(),
        x_label: "components".into(),
        y_label: "share of the variance".into(),
        series: vec![Series {
            name: "cumulative".into(),
            points: (0..shown)
                .map(|i| {
                    cum += pca.explained_ratio[i].max(0.0);
                    ((i + 1) as f64, cum)
                })
                .collect(),
            mark: Mark::Line,
        }],
        y_range: Some((0.0, 1.0)),
        log_x: false,
        marker: Some((report.k as f64, format!("k = {}", report.k))),
    }
}

/// The features that weigh most in each leading component, with their loadings.
fn loadings(report: &StudyReport, pca: &Pca) -> String {
    let mut out = String::from("<table><tr><th>component</th><th>largest loadings</th></tr>");
    for j in 0..pca.components.ncols().min(LOADING_COMPONENTS) {
        let mut order: Vec<usize> = (0..pca.components.nrows()).collect();
        order.sort_by(|&a, &b| {
            pca.components[(b, j)]
                .abs()
                .total_cmp(&pca.components[(a, j)].abs())
        });
        let top: Vec<String> = order
            .iter()
            .take(LOADING_FEATURES)
            .map(|&i| {
                let name = report.features.get(i).map_or("?", String::as_str);
                format!("{name} {:+.3}", pca.components[(i, j)])
            })
            .collect();
        let _ = write!(
            out,
            "<tr><th>PC{}</th><td>{}</td></tr>",
            j + 1,
            escape(&top.join(", "))
        );
    }
    out + "</table>\n<p>components.csv holds every loading.</p>\n"
}

/// The budget by released block, and composed.
fn budget(report: &StudyReport) -> String {
    let mut rows: Vec<(&str, String)> = report
        .budget
        .parts
        .iter()
        .map(|p| {
            (
                p.part.as_str(),
                format!("epsilon {:.4}, delta {:.3e}", p.epsilon, p.delta),
            )
        })
        .collect();
    let total = format!(
        "epsilon {:.4}, delta {:.3e}",
        report.budget.epsilon, report.budget.delta
    );
    rows.push(("composed", total));
    table_rows(&rows) + &composition(report)
}

/// Why the blocks' epsilons do not add up to the total.
fn composition(report: &StudyReport) -> String {
    match report.budget.rho {
        Some(rho) => format!(
            "<p>Each block's epsilon is what it would spend alone at its delta. They \
             compose under zCDP: the blocks' rho add up (to {rho:.5}), and that sum \
             converts once to the epsilon above at delta {:.3e}, far less than their \
             epsilons added.</p>\n",
            report.budget.delta
        ),
        None => "<p>The blocks compose by basic composition: their epsilons and deltas \
                 add up to the total.</p>\n"
            .to_string(),
    }
}

/// Links to the outputs beside the page.
fn files(report: &StudyReport) -> String {
    let mut out = String::from("<ul>");
    for name in OUTPUT_FILES {
        if name == "synthetic.csv" && report.synthetic_rows == 0 {
            continue;
        }
        let _ = write!(out, "<li><a href=\"{name}\">{name}</a></li>");
    }
    out + "</ul>\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;

    /// The clip is reported with its count, as "all" when every row was clipped,
    /// and warned of past a tenth of the rows; a remote user is told it cannot know.
    #[test]
    fn clipped_rows_are_counted_and_warned_of() {
        let mut r = StudyReport {
            n_rows: 569,
            row_norm_bound: 1.0,
            clipped_rows: Some(569),
            ..Default::default()
        };
        assert_eq!(clipped_text(&r), "all 569 (every row)");
        let w = clipping_warning(&r).expect("a warning");
        assert!(
            w.starts_with("rows clipped to the row-norm bound C = 1.0000: all 569 (every row)."),
            "{w}"
        );
        r.clipped_rows = Some(56);
        assert_eq!(clipped_text(&r), "56 of 569 (9.8%)");
        assert!(clipping_warning(&r).is_none(), "under a tenth");
        r.clipped_rows = None;
        assert!(clipped_text(&r).starts_with("not known here"));
        assert!(clipping_warning(&r).is_none());
        // C chosen as the 0.9 quantile: a tenth clipped is what was asked for;
        // a fifth and more is warned of, as the quantile's.
        r.row_norm_choice = Some(crate::report::RowNormChoice {
            quantile: 0.9,
            ..Default::default()
        });
        r.clipped_rows = Some(80);
        assert!(clipping_warning(&r).is_none(), "14% at the 0.9 quantile");
        r.clipped_rows = Some(120);
        let w = clipping_warning(&r).expect("21% at the 0.9 quantile");
        assert!(
            w.contains("chosen as the 0.9 quantile") && w.contains("--row-norm-quantile"),
            "{w}"
        );
    }

    #[test]
    fn the_study_page_shows_the_release_and_both_figures() {
        let report = StudyReport {
            study_id: "s<1>".into(),
            n_rows: 5620,
            n_features: 3,
            n_owners: 4,
            owners_missing: vec!["owner-05".into()],
            k: 2,
            noise_floor: 1.5,
            components_above_noise: 1,
            features: vec!["a".into(), "b".into(), "c".into()],
            ..Default::default()
        };
        let pca = Pca {
            components: DMatrix::from_column_slice(3, 2, &[0.1, -0.9, 0.4, 0.0, 0.0, 1.0]),
            eigenvalues: vec![3.0, 1.0, -0.5],
            explained_ratio: vec![0.75, 0.25, 0.0],
        };
        let html = study_page(&report, &pca, None);
        assert_eq!(html.matches("<svg").count(), 2);
        // Three bars (the negative one below the axis) and the legend's two
        // swatches (eigenvalue, noise floor), and the k marker.
        assert_eq!(html.matches("<rect").count(), 5);
        assert!(html.contains("noise floor"));
        assert!(html.contains("k = 2"));
        assert!(html.contains("s&lt;1&gt;") && !html.contains("s<1>"));
        assert!(html.contains("1 missing: owner-05"));
        assert!(
            html.contains("explain 100.0%"),
            "the top 2 explain 0.75 + 0.25"
        );
        // One of the top 2 stands above the floor: said, and warned of.
        assert!(html.contains("only the first 1 of the 2 components stand above it"));
        assert!(html.contains("<b>Warning:</b>"));
        // The largest loading of PC1 first, with its sign.
        assert!(html.contains("b -0.900, c +0.400, a +0.100"), "{html}");
        assert!(html.contains("<a href=\"components.csv\">"));
        assert!(
            !html.contains("synthetic.csv\">"),
            "no synthetic rows were written"
        );
    }

    /// The printed table says which components stand above the floor, and what
    /// negative eigenvalues are: within the noise.
    #[test]
    fn the_table_marks_the_components_within_the_noise() {
        let pca = Pca {
            components: DMatrix::zeros(3, 3),
            eigenvalues: vec![3.0, 1.0, -0.5],
            explained_ratio: vec![0.75, 0.25, 0.0],
        };
        let table = crate::report::variance_table(&pca, 3, 1.5);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].ends_with("above"), "{table}");
        assert!(lines[2].ends_with("within noise"), "{table}");
        assert!(lines[3].contains("-0.5000") && lines[3].ends_with("within noise"));
        assert!(lines[4].contains("only the first 1 of these 3"), "{table}");
    }
}
