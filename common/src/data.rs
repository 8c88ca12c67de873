//! CSV tables and the public preprocessing of rows: bounds, scaling to [-1, 1] and
//! clipping to the row-norm bound. Parsing works on any reader; opening files is the
//! binaries' business.

use std::io::Read;

/// Errors of reading and validating a table.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DataError {
    /// The CSV could not be read at all.
    #[error("{source_name}: cannot read CSV: {reason}")]
    Csv {
        /// File or stream name.
        source_name: String,
        /// Parser message.
        reason: String,
    },
    /// A row with the wrong number of cells.
    #[error("{source_name}, line {line}: expected {expected} columns, found {found}")]
    ColumnCount {
        /// File name.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// Columns in the header.
        expected: usize,
        /// Columns in this row.
        found: usize,
    },
    /// A feature cell with nothing in it.
    #[error("{source_name}, line {line}, column `{column}`: the cell is empty")]
    EmptyCell {
        /// File name.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// Column name.
        column: String,
    },
    /// A file with nothing in it, not even a header.
    #[error("{source_name}: the file is empty (a CSV needs a header line, then rows)")]
    EmptyFile {
        /// File name.
        source_name: String,
    },
    /// A cell that is not a finite number.
    #[error("{source_name}, line {line}, column `{column}`: `{value}` is not a finite number")]
    BadCell {
        /// File name.
        source_name: String,
        /// 1-based line number.
        line: u64,
        /// Column name.
        column: String,
        /// The cell as read.
        value: String,
    },
    /// The header does not match the study's features.
    #[error("{source_name}: columns do not match the study: {reason}")]
    Schema {
        /// File name.
        source_name: String,
        /// What differs.
        reason: String,
    },
    /// The named label column is absent.
    #[error("{source_name}: label column `{label}` not found")]
    MissingLabel {
        /// File name.
        source_name: String,
        /// The label asked for.
        label: String,
    },
    /// A classification or regression study needs each row's label, and this table
    /// has none.
    #[error("{source_name}: the study needs a label column (classification or regression), but none was named: pass --label")]
    NoLabelColumn {
        /// File name.
        source_name: String,
    },
    /// A row whose label is not one of the study's classes.
    #[error(
        "{source_name}, line {line}: label `{value}` is not one of the study's classes ({classes})"
    )]
    UnknownClass {
        /// File name.
        source_name: String,
        /// 1-based line number in the file.
        line: u64,
        /// The label as read.
        value: String,
        /// The study's classes, comma-separated.
        classes: String,
    },
    /// A bounds file problem.
    #[error("bounds: {0}")]
    Bounds(String),
    /// A table with no rows.
    #[error("{source_name}: no data rows (a header and nothing else)")]
    Empty {
        /// File name.
        source_name: String,
    },
}

/// A numeric table: feature columns (label removed) and the label cells, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// Feature names in column order.
    pub features: Vec<String>,
    /// Rows of feature values.
    pub rows: Vec<Vec<f64>>,
    /// The label column's name and raw cells, if a label was named.
    pub label: Option<(String, Vec<String>)>,
    /// The input's header (trimmed) in file order, label included: what output
    /// written in the input's shape follows.
    pub columns: Vec<String>,
    /// The file line (1-based, the header on line 1) each row was read from, for
    /// messages about a row found wrong after reading; empty for a schema.
    pub lines: Vec<u64>,
}

/// Reads a CSV with a header. Every feature cell must be a finite number; the label
/// column, if named, is kept apart as text. `source_name` is used in error messages.
pub fn read_csv<R: Read>(
    reader: R,
    source_name: &str,
    label: Option<&str>,
) -> Result<Table, DataError> {
    let mut batches = CsvBatches::new(reader, source_name, label)?;
    let mut table = batches.empty_table();
    while let Some(batch) = batches.next_batch(usize::MAX)? {
        table.append(batch);
    }
    if table.rows.is_empty() {
        return Err(DataError::Empty {
            source_name: source_name.to_string(),
        });
    }
    Ok(table)
}

/// A CSV table read a batch of rows at a time, so that a table of any length is
/// never held whole: each batch is a [`Table`] of the same columns, its rows with
/// their file lines, and the errors name the line and column as [`read_csv`]'s.
pub struct CsvBatches<R: Read> {
    rdr: csv::Reader<R>,
    source_name: String,
    header: Vec<String>,
    label_idx: Option<usize>,
    features: Vec<String>,
    rows_read: u64,
}

impl<R: Read> CsvBatches<R> {
    /// Reads the header of `reader`, leaving out the `label` column if named.
    pub fn new(reader: R, source_name: &str, label: Option<&str>) -> Result<Self, DataError> {
        let mut rdr = csv_reader(reader);
        let (header, label_idx, features) = read_header(&mut rdr, source_name, label)?;
        Ok(Self {
            rdr,
            source_name: source_name.to_string(),
            header,
            label_idx,
            features,
            rows_read: 0,
        })
    }

    /// The feature names, label left out.
    pub fn features(&self) -> &[String] {
        &self.features
    }

    /// Data rows read so far.
    pub fn rows_read(&self) -> u64 {
        self.rows_read
    }

    /// A table of these columns and no rows.
    pub fn empty_table(&self) -> Table {
        Table {
            features: self.features.clone(),
            rows: Vec::new(),
            label: self.label_idx.map(|i| (self.header[i].clone(), Vec::new())),
            columns: self.header.clone(),
            lines: Vec::new(),
        }
    }

    /// The next at most `max_rows` rows (at least one), or `None` at the end.
    /// The records are split here, in file order, and their cells parsed on
    /// every core; an error is the first one in file order, as read alone.
    pub fn next_batch(&mut self, max_rows: usize) -> Result<Option<Table>, DataError> {
        let mut records = Vec::new();
        while records.len() < max_rows.max(1) {
            let mut record = csv::StringRecord::new();
            let more = self
                .rdr
                .read_record(&mut record)
                .map_err(|e| DataError::Csv {
                    source_name: self.source_name.clone(),
                    reason: e.to_string(),
                })?;
            if !more {
                break;
            }
            records.push(record);
        }
        // Each parsed on its own, then taken in order: the error reported is
        // the first in the file, whichever thread met one first.
        let parsed: Vec<Result<ParsedRow, DataError>> = {
            use rayon::prelude::*;
            let (header, label_idx, source) = (&self.header, self.label_idx, &self.source_name);
            records
                .par_iter()
                .map(|r| parse_record(r, header, label_idx, source))
                .collect()
        };
        let mut batch = self.empty_table();
        for parsed in parsed {
            let (row, label, line) = parsed?;
            batch.rows.push(row);
            batch.lines.push(line);
            if let (Some((_, labels)), Some(label)) = (&mut batch.label, label) {
                labels.push(label);
            }
        }
        self.rows_read += batch.rows.len() as u64;
        Ok((!batch.rows.is_empty()).then_some(batch))
    }
}

/// One record's feature cells as numbers (of the `header` columns but the
/// label's), its label cell and its line.
fn parse_record(
    record: &csv::StringRecord,
    header: &[String],
    label_idx: Option<usize>,
    source_name: &str,
) -> Result<ParsedRow, DataError> {
    let line = record.position().map(|p| p.line()).unwrap_or(0);
    if record.len() != header.len() {
        return Err(DataError::ColumnCount {
            source_name: source_name.to_string(),
            line,
            expected: header.len(),
            found: record.len(),
        });
    }
    let mut row = Vec::with_capacity(header.len());
    let mut label = None;
    for (i, cell) in record.iter().enumerate() {
        if Some(i) == label_idx {
            label = Some(cell.trim().to_string());
            continue;
        }
        row.push(number(cell, source_name, line, &header[i])?);
    }
    Ok((row, label, line))
}

/// A parsed record: its feature values, its label cell, its line.
type ParsedRow = (Vec<f64>, Option<String>, u64);

impl Table {
    /// Appends `more`'s rows (of the same columns) to this table's.
    pub fn append(&mut self, more: Table) {
        self.rows.extend(more.rows);
        self.lines.extend(more.lines);
        if let (Some((_, mine)), Some((_, theirs))) = (&mut self.label, more.label) {
            mine.extend(theirs);
        }
    }
}

/// A feature cell as a finite number, or the error naming where it is.
fn number(cell: &str, source_name: &str, line: u64, column: &str) -> Result<f64, DataError> {
    if cell.trim().is_empty() {
        return Err(DataError::EmptyCell {
            source_name: source_name.to_string(),
            line,
            column: column.to_string(),
        });
    }
    cell.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| DataError::BadCell {
            source_name: source_name.to_string(),
            line,
            column: column.to_string(),
            value: cell.to_string(),
        })
}

/// The table's columns without its rows: the header of a CSV, with the label
/// column named as in [`read_csv`]. What a party that must not see the rows (the
/// data user of a remote study) learns the schema from; rows, if any, are not read.
pub fn read_schema<R: Read>(
    reader: R,
    source_name: &str,
    label: Option<&str>,
) -> Result<Table, DataError> {
    let mut rdr = csv_reader(reader);
    let (header, label_idx, features) = read_header(&mut rdr, source_name, label)?;
    if features.is_empty() {
        return Err(DataError::Schema {
            source_name: source_name.to_string(),
            reason: "no feature columns".into(),
        });
    }
    Ok(Table {
        features,
        rows: Vec::new(),
        label: label_idx.map(|i| (header[i].clone(), Vec::new())),
        columns: header,
        lines: Vec::new(),
    })
}

/// A reader of a CSV with a header; rows of the wrong length are reported by line,
/// not refused by the parser.
fn csv_reader<R: Read>(reader: R) -> csv::Reader<R> {
    csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(reader)
}

/// The trimmed header, the label's index and the feature names.
#[allow(clippy::type_complexity)]
fn read_header<R: Read>(
    rdr: &mut csv::Reader<R>,
    source_name: &str,
    label: Option<&str>,
) -> Result<(Vec<String>, Option<usize>, Vec<String>), DataError> {
    let header: Vec<String> = rdr
        .headers()
        .map_err(|e| DataError::Csv {
            source_name: source_name.to_string(),
            reason: e.to_string(),
        })?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    if header.iter().all(String::is_empty) {
        return Err(DataError::EmptyFile {
            source_name: source_name.to_string(),
        });
    }
    let label_idx = match label {
        Some(l) => {
            Some(
                header
                    .iter()
                    .position(|h| h == l)
                    .ok_or_else(|| DataError::MissingLabel {
                        source_name: source_name.to_string(),
                        label: l.to_string(),
                    })?,
            )
        }
        None => None,
    };
    let features: Vec<String> = header
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != label_idx)
        .map(|(_, h)| h.clone())
        .collect();
    Ok((header, label_idx, features))
}

impl Table {
    /// The file line of data row `row` (0-based); for a table built without
    /// lines, the line it would have with one header line and no blank lines.
    pub fn line_of(&self, row: usize) -> u64 {
        self.lines.get(row).copied().unwrap_or(row as u64 + 2)
    }

    /// Checks that the feature columns are exactly the study's, in order.
    pub fn check_schema(&self, features: &[String], source_name: &str) -> Result<(), DataError> {
        if self.features.len() != features.len() {
            return Err(DataError::Schema {
                source_name: source_name.to_string(),
                reason: format!(
                    "{} feature columns, the study has {}",
                    self.features.len(),
                    features.len()
                ),
            });
        }
        if let Some((i, (a, b))) = self
            .features
            .iter()
            .zip(features)
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            return Err(DataError::Schema {
                source_name: source_name.to_string(),
                reason: format!("column {} is `{a}`, the study expects `{b}`", i + 1),
            });
        }
        Ok(())
    }

    /// Maps every row's label to its index in the study's `classes`; refuses a table
    /// without a label column and any label outside `classes`.
    pub fn class_indices(
        &self,
        classes: &[String],
        source_name: &str,
    ) -> Result<Vec<usize>, DataError> {
        let (_, labels) = self
            .label
            .as_ref()
            .ok_or_else(|| DataError::NoLabelColumn {
                source_name: source_name.to_string(),
            })?;
        let index: std::collections::HashMap<&str, usize> = classes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i))
            .collect();
        labels
            .iter()
            .enumerate()
            .map(|(row, l)| {
                index
                    .get(l.as_str())
                    .copied()
                    .ok_or_else(|| DataError::UnknownClass {
                        source_name: source_name.to_string(),
                        line: self.line_of(row),
                        value: l.clone(),
                        classes: classes.join(","),
                    })
            })
            .collect()
    }

    /// The table of a regression study (PCA-Gauss Algorithm 2): the label becomes
    /// the last feature column; every label cell must be a finite number.
    pub fn with_label_as_feature(&self, source_name: &str) -> Result<Table, DataError> {
        let (name, cells) = self
            .label
            .as_ref()
            .ok_or_else(|| DataError::NoLabelColumn {
                source_name: source_name.to_string(),
            })?;
        let mut rows = Vec::with_capacity(self.rows.len());
        for (i, (row, cell)) in self.rows.iter().zip(cells).enumerate() {
            let y = number(cell, source_name, self.line_of(i), name)?;
            let mut r = row.clone();
            r.push(y);
            rows.push(r);
        }
        let mut features = self.features.clone();
        features.push(name.clone());
        Ok(Table {
            features,
            rows,
            label: None,
            columns: self.columns.clone(),
            lines: self.lines.clone(),
        })
    }

    /// The distinct labels in order of first appearance (the classes a data user
    /// declares for a local study), or `None` without a label column.
    pub fn distinct_labels(&self) -> Option<Vec<String>> {
        let (_, labels) = self.label.as_ref()?;
        let mut seen = std::collections::HashSet::new();
        Some(
            labels
                .iter()
                .filter(|l| seen.insert(l.as_str()))
                .cloned()
                .collect(),
        )
    }

    /// Per-feature [min, max] of the data. For demos only: real bounds are public
    /// knowledge, and bounds read off private data leak it.
    pub fn bounds_from_data(&self) -> Vec<(f64, f64)> {
        let m = self.features.len();
        let mut b = vec![(f64::INFINITY, f64::NEG_INFINITY); m];
        for row in &self.rows {
            for (j, &x) in row.iter().enumerate() {
                b[j].0 = b[j].0.min(x);
                b[j].1 = b[j].1.max(x);
            }
        }
        b
    }
}

/// Reads a bounds file: CSV with header `feature,lo,hi`, one row per feature; a row
/// with feature `*` sets the bounds of every feature not listed. A name that is no
/// feature is refused, naming the closest feature: the bounds set the noise, and a
/// misspelled feature would otherwise get the `*` bounds without a word.
pub fn read_bounds<R: Read>(reader: R, features: &[String]) -> Result<Vec<(f64, f64)>, DataError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(reader);
    let mut default = None;
    let mut map: std::collections::HashMap<String, (u64, (f64, f64))> = Default::default();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| DataError::Bounds(e.to_string()))?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let (name, bounds) = bounds_row(&rec, line)?;
        let earlier = if name == "*" {
            default.replace((line, bounds)).map(|(l, _)| l)
        } else {
            map.insert(name.clone(), (line, bounds)).map(|(l, _)| l)
        };
        if let Some(first) = earlier {
            return Err(DataError::Bounds(format!(
                "line {line}: `{name}` is listed twice (first on line {first})"
            )));
        }
    }
    let mut unknown: Vec<(u64, &String)> = map
        .iter()
        .filter(|(name, _)| !features.contains(name))
        .map(|(name, (line, _))| (*line, name))
        .collect();
    unknown.sort();
    if let Some((line, name)) = unknown.first() {
        return Err(DataError::Bounds(format!(
            "line {line}: `{name}` is no feature of the table{}",
            closest(name, features)
                .map(|f| format!(" (did you mean `{f}`?)"))
                .unwrap_or_default()
        )));
    }
    features
        .iter()
        .map(|f| {
            map.get(f)
                .map(|(_, b)| *b)
                .or(default.map(|(_, b)| b))
                .ok_or_else(|| {
                    DataError::Bounds(format!(
                        "no bounds for feature `{f}`: list it, or add a `*` line (or give no \
                         bounds file, and every feature's bounds are chosen privately)"
                    ))
                })
        })
        .collect()
}

/// One row of a bounds file: its name and checked bounds.
fn bounds_row(rec: &csv::StringRecord, line: u64) -> Result<(String, (f64, f64)), DataError> {
    if rec.len() != 3 {
        return Err(DataError::Bounds(format!(
            "line {line}: expected feature,lo,hi"
        )));
    }
    let parse = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| DataError::Bounds(format!("line {line}: `{s}` is not a finite number")))
    };
    let (lo, hi) = (parse(&rec[1])?, parse(&rec[2])?);
    if lo > hi {
        return Err(DataError::Bounds(format!("line {line}: lo {lo} > hi {hi}")));
    }
    Ok((rec[0].trim().to_string(), (lo, hi)))
}

/// The feature nearest to `name` in edit distance, if it is near enough to be a
/// likely typo (at most a third of the name's length, and at least 2).
fn closest<'a>(name: &str, features: &'a [String]) -> Option<&'a String> {
    let limit = (name.chars().count() / 3).max(2);
    features
        .iter()
        .map(|f| {
            (
                strsim::levenshtein(&name.to_lowercase(), &f.to_lowercase()),
                f,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, f)| f)
}

/// Clips each value to its bounds, maps it to [-1, 1] (a constant feature, lo = hi,
/// maps to 0), then scales the row down to L2 norm `c` if it is longer. Returns the
/// row and whether the norm clip was applied.
pub fn normalize_row(row: &[f64], bounds: &[(f64, f64)], c: f64) -> (Vec<f64>, bool) {
    let mut out: Vec<f64> = row
        .iter()
        .zip(bounds)
        .map(|(&x, &(lo, hi))| {
            if hi > lo {
                2.0 * (x.clamp(lo, hi) - lo) / (hi - lo) - 1.0
            } else {
                0.0
            }
        })
        .collect();
    let clipped = clip_to_norm(&mut out, c);
    (out, clipped)
}

/// Scales `row` down to L2 norm `c` if it is longer; returns whether it did. The
/// row-norm clip of [`normalize_row`], for rows already normalized.
pub fn clip_to_norm(row: &mut [f64], c: f64) -> bool {
    let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
    let clipped = norm > c;
    if clipped {
        let s = c / norm;
        row.iter_mut().for_each(|x| *x *= s);
    }
    clipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_indices_name_the_bad_row() {
        let t = read_csv(
            "a,label\n1,x\n2,y\n3,z\n".as_bytes(),
            "t.csv",
            Some("label"),
        )
        .expect("ok");
        let classes = vec!["y".to_string(), "x".to_string()];
        let err = t
            .class_indices(&classes, "t.csv")
            .expect_err("z is unknown");
        assert_eq!(
            err.to_string(),
            "t.csv, line 4: label `z` is not one of the study's classes (y,x)"
        );
        let ok = vec!["y".to_string(), "x".to_string(), "z".to_string()];
        assert_eq!(t.class_indices(&ok, "t.csv"), Ok(vec![1, 0, 2]));
        assert_eq!(
            t.distinct_labels(),
            Some(vec!["x".into(), "y".into(), "z".into()])
        );
        let unlabelled = read_csv("a\n1\n".as_bytes(), "u.csv", None).expect("ok");
        assert!(matches!(
            unlabelled.class_indices(&ok, "u.csv"),
            Err(DataError::NoLabelColumn { .. })
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Read in batches of any size, a table is the table read whole, rows,
        /// labels and lines alike; and a bad cell is named at the same line.
        #[test]
        fn batches_of_any_size_are_the_table_read_whole(
            rows in proptest::collection::vec((proptest::collection::vec(-1e6f64..1e6, 3), 0u8..4), 1..40),
            batch in 1usize..10,
            bad in proptest::option::of(0usize..40),
        ) {
            let mut text = String::from("a,label,b,c\n");
            for (i, (r, l)) in rows.iter().enumerate() {
                let first = match bad {
                    Some(b) if b == i => "x".to_string(),
                    _ => r[0].to_string(),
                };
                text.push_str(&format!("{first},{l},{},{}\n", r[1], r[2]));
            }
            let whole = read_csv(text.as_bytes(), "t.csv", Some("label"));
            let mut batches = CsvBatches::new(text.as_bytes(), "t.csv", Some("label")).expect("header");
            let mut joined = batches.empty_table();
            let read = loop {
                match batches.next_batch(batch) {
                    Ok(Some(b)) => {
                        proptest::prop_assert!(b.rows.len() <= batch);
                        joined.append(b);
                    }
                    Ok(None) => break Ok(joined),
                    Err(e) => break Err(e),
                }
            };
            proptest::prop_assert_eq!(read, whole);
        }
    }

    #[test]
    fn reads_table_with_label() {
        let t = read_csv(
            "a,b,label\n1,2,x\n3,4.5,y\n".as_bytes(),
            "t.csv",
            Some("label"),
        )
        .expect("ok");
        assert_eq!(t.features, vec!["a", "b"]);
        assert_eq!(t.rows, vec![vec![1.0, 2.0], vec![3.0, 4.5]]);
        assert_eq!(
            t.label,
            Some(("label".into(), vec!["x".into(), "y".into()]))
        );
    }

    #[test]
    fn bad_cell_names_file_line_and_column() {
        let err = read_csv("a,b\n1,2\n3,NaN\n".as_bytes(), "own.csv", None).expect_err("NaN");
        assert_eq!(
            err,
            DataError::BadCell {
                source_name: "own.csv".into(),
                line: 3,
                column: "b".into(),
                value: "NaN".into()
            }
        );
        assert!(err.to_string().contains("own.csv, line 3, column `b`"));
        let err = read_csv("a,b\n1,abc\n".as_bytes(), "own.csv", None).expect_err("text");
        assert!(matches!(err, DataError::BadCell { line: 2, .. }));
        let err = read_csv("a,b\n1,inf\n".as_bytes(), "own.csv", None).expect_err("inf");
        assert!(matches!(err, DataError::BadCell { .. }));
    }

    /// Every path names the row by its line in the file, blank lines counted:
    /// a bad feature cell, a bad numeric label and an unknown class on line 5.
    #[test]
    fn every_path_names_the_file_line() {
        let text = "a,label\n1,1\n\n2,2\n3,q\n";
        let err = read_csv(
            text.replace("3,q", "x,3").as_bytes(),
            "t.csv",
            Some("label"),
        )
        .expect_err("bad cell");
        assert!(
            err.to_string().starts_with("t.csv, line 5, column `a`"),
            "{err}"
        );
        let t = read_csv(text.as_bytes(), "t.csv", Some("label")).expect("read");
        let err = t.with_label_as_feature("t.csv").expect_err("label q");
        assert!(
            err.to_string().starts_with("t.csv, line 5, column `label`"),
            "{err}"
        );
        let classes = ["1".to_string(), "2".to_string()];
        let err = t.class_indices(&classes, "t.csv").expect_err("class q");
        assert!(
            err.to_string().starts_with("t.csv, line 5: label `q`"),
            "{err}"
        );
    }

    /// An empty cell says so, and so does an empty file.
    #[test]
    fn empty_cells_and_files_are_named_as_empty() {
        let err = read_csv("a,b\n1,2\n3,\n".as_bytes(), "t.csv", None).expect_err("empty");
        assert_eq!(
            err.to_string(),
            "t.csv, line 3, column `b`: the cell is empty"
        );
        let err = read_csv("a,b\n1,  \n".as_bytes(), "t.csv", None).expect_err("blank");
        assert!(err.to_string().ends_with("the cell is empty"), "{err}");
        for empty in ["", "\n"] {
            let err = read_csv(empty.as_bytes(), "e.csv", Some("label")).expect_err("empty file");
            assert_eq!(
                err.to_string(),
                "e.csv: the file is empty (a CSV needs a header line, then rows)"
            );
        }
        let err = read_csv("a,b\n".as_bytes(), "h.csv", None).expect_err("header only");
        assert!(err.to_string().contains("no data rows"), "{err}");
    }

    #[test]
    fn wrong_column_count_is_refused() {
        let err = read_csv("a,b\n1,2\n3\n".as_bytes(), "x.csv", None).expect_err("short row");
        assert_eq!(
            err,
            DataError::ColumnCount {
                source_name: "x.csv".into(),
                line: 3,
                expected: 2,
                found: 1
            }
        );
    }

    #[test]
    fn schema_mismatch_is_named() {
        let t = read_csv("a,c\n1,2\n".as_bytes(), "x.csv", None).expect("ok");
        let err = t
            .check_schema(&["a".into(), "b".into()], "x.csv")
            .expect_err("mismatch");
        assert!(err.to_string().contains("column 2 is `c`"));
        let err = t.check_schema(&["a".into()], "x.csv").expect_err("count");
        assert!(err.to_string().contains("2 feature columns"));
    }

    #[test]
    fn a_schema_is_the_header_alone() {
        let t = read_schema("a, y ,b\n1,x,2\n".as_bytes(), "s.csv", Some("y")).expect("schema");
        assert_eq!(t.features, ["a", "b"]);
        assert_eq!(t.columns, ["a", "y", "b"]);
        assert!(t.rows.is_empty());
        assert_eq!(t.label.as_ref().map(|(l, _)| l.as_str()), Some("y"));
        let err = read_schema("a,b\n".as_bytes(), "s.csv", Some("y")).expect_err("no label");
        assert!(err.to_string().contains("s.csv"), "{err}");
        let err = read_schema("y\n".as_bytes(), "s.csv", Some("y")).expect_err("no features");
        assert!(err.to_string().contains("no feature columns"), "{err}");
    }

    #[test]
    fn normalization_maps_bounds_and_clips() {
        let (r, clipped) = normalize_row(
            &[0.0, 16.0, 8.0, 5.0],
            &[(0.0, 16.0), (0.0, 16.0), (0.0, 16.0), (5.0, 5.0)],
            10.0,
        );
        assert_eq!(r, vec![-1.0, 1.0, 0.0, 0.0]);
        assert!(!clipped);
        let (r, clipped) = normalize_row(&[20.0, 16.0], &[(0.0, 16.0), (0.0, 16.0)], 1.0);
        assert!(clipped);
        let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-12);
    }

    #[test]
    fn bounds_file_with_default() {
        let b = read_bounds(
            "feature,lo,hi\n*,0,16\nb,-1,1\n".as_bytes(),
            &["a".into(), "b".into()],
        )
        .expect("ok");
        assert_eq!(b, vec![(0.0, 16.0), (-1.0, 1.0)]);
        assert!(read_bounds("feature,lo,hi\na,2,1\n".as_bytes(), &["a".into()]).is_err());
        assert!(read_bounds("feature,lo,hi\n".as_bytes(), &["a".into()]).is_err());
    }

    /// A name that is no feature is refused, beside `*` too (where it would get the
    /// `*` bounds), naming the line and the nearest feature; so is a name twice.
    #[test]
    fn bounds_for_no_feature_are_refused_naming_the_nearest() {
        let features: Vec<String> = ["carat".into(), "depth".into(), "price".into()].to_vec();
        let err = |text: &str| {
            read_bounds(text.as_bytes(), &features)
                .expect_err(text)
                .to_string()
        };
        let typo = err("feature,lo,hi\n*,0,1\ncarat,0,3\ndpeth,40,80\n");
        assert_eq!(
            typo,
            "bounds: line 4: `dpeth` is no feature of the table (did you mean `depth`?)"
        );
        let far = err("feature,lo,hi\ncarat,0,3\ndepth,0,1\nprice,0,1\nweight,0,1\n");
        assert_eq!(far, "bounds: line 5: `weight` is no feature of the table");
        let twice = err("feature,lo,hi\ncarat,0,3\ncarat,0,4\n*,0,1\n");
        assert_eq!(
            twice,
            "bounds: line 3: `carat` is listed twice (first on line 2)"
        );
        let stars = err("feature,lo,hi\n*,0,3\n*,0,4\n");
        assert!(stars.contains("`*` is listed twice"), "{stars}");
    }
}
