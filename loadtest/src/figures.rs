//! Figures measured next to their limit in the same run (issue 15): each prints as one line
//! `figure: value  (limit: value, ratio x)` and goes into the JSON report as is.

use std::fmt::Write as _;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// What was measured, e.g. `inbound delivered (cluster)`.
    pub figure: String,
    pub value: f64,
    pub unit: String,
    /// What the value is compared with, e.g. `Postgres 16-connection single-row INSERT`.
    pub limit_name: String,
    pub limit: f64,
    pub limit_unit: String,
    /// `value / limit` (0 when the limit is 0).
    pub ratio: f64,
    /// How to read the ratio, e.g. `goal >= 0.5`.
    pub goal: String,
}

impl Figure {
    pub fn new(
        figure: impl Into<String>,
        value: f64,
        unit: &str,
        limit_name: impl Into<String>,
        limit: f64,
        limit_unit: &str,
        goal: &str,
    ) -> Self {
        Self {
            figure: figure.into(),
            value,
            unit: unit.to_owned(),
            limit_name: limit_name.into(),
            limit,
            limit_unit: limit_unit.to_owned(),
            ratio: ratio(value, limit),
            goal: goal.to_owned(),
        }
    }

    /// `figure: value  (limit: value, ratio x)`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{}: {} {}  (limit: {} {} {}, ratio {:.3}x",
            self.figure,
            num(self.value),
            self.unit,
            self.limit_name,
            num(self.limit),
            self.limit_unit,
            self.ratio
        );
        if !self.goal.is_empty() {
            let _ = write!(s, "; {}", self.goal);
        }
        s.push(')');
        s
    }
}

pub fn ratio(value: f64, limit: f64) -> f64 {
    if limit > 0.0 { value / limit } else { 0.0 }
}

/// A number with as many decimals as its size needs.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn render(figures: &[Figure]) -> String {
    let mut s = String::new();
    if figures.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "\nfigures (each next to its limit, measured in this run):"
    );
    for f in figures {
        let _ = writeln!(s, "  {}", f.line());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let f = Figure::new(
            "inbound delivered (cluster)",
            544.0,
            "msgs/s",
            "Postgres 16-connection single-row INSERT",
            12200.0,
            "rows/s",
            "goal >= 0.5",
        );
        assert_eq!(
            f.line(),
            "inbound delivered (cluster): 544.0 msgs/s  (limit: Postgres 16-connection single-row INSERT 12200 rows/s, ratio 0.045x; goal >= 0.5)"
        );
        assert_eq!(ratio(1.0, 0.0), 0.0);
        assert_eq!(num(1.234), "1.23");
    }
}
