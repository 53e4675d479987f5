//! The Prometheus text exposition (format 0.0.4) of a [`Selection`], shared by the textfile
//! connector and the HTTP endpoint.
//!
//! Per metric: `# HELP` (with `include_help`), `# TYPE` (with `include_type`), the unlabeled
//! aggregate, then the `subject_family` rows. Summaries render `_count` and `_sum` under
//! `# TYPE x summary`, and `_min`, `_max`, `_last` as gauges of their own (with their own HELP
//! and TYPE) so that `promtool check metrics` reports nothing; those three are omitted while
//! the summary has no observation (their value would be meaningless). Without `# TYPE` lines
//! the `_count` and `_sum` series are untyped and carry their own HELP. Output ends with a
//! newline; samples carry no timestamps (the node exporter's textfile collector rejects them).

use std::fmt::Write;

use crate::catalogue::Kind;
use crate::families::LABEL_NAME;
use crate::select::{Sample, Selection};

/// `Content-Type` of the rendering.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Rendering switches.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub namespace: &'a str,
    pub include_help: bool,
    pub include_type: bool,
}

/// A sample value: integers without exponent or fraction, `NaN`, `+Inf`, `-Inf`, otherwise the
/// shortest decimal that round-trips (Rust never uses an exponent here).
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v == 0.0 {
        "0".into() // also turns -0 into 0
    } else {
        format!("{v}")
    }
}

/// Escapes a label value: backslash, double quote, newline.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes HELP text: backslash and newline.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn header(out: &mut String, o: &Options<'_>, name: &str, help: &str, kind: &str) {
    if o.include_help {
        let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    }
    if o.include_type {
        let _ = writeln!(out, "# TYPE {name} {kind}");
    }
}

/// Renders the selection. An empty selection renders an empty string (a valid, empty file).
pub fn render(sel: &Selection, o: &Options<'_>) -> String {
    let mut out = String::with_capacity(256 * sel.metrics.len().max(1));
    for m in &sel.metrics {
        let name = format!("{}_{}", o.namespace, m.suffix);
        let untyped_summary = m.kind == Kind::Summary && !o.include_type;
        if !untyped_summary {
            header(&mut out, o, &name, &m.help, m.kind.as_str());
        }
        match &m.sample {
            Some(Sample::Counter(v)) => {
                let _ = writeln!(out, "{name} {v}");
            }
            Some(Sample::Gauge(v)) => {
                let _ = writeln!(out, "{name} {}", format_value(*v));
            }
            Some(Sample::Summary(s)) => {
                if o.include_type {
                    let _ = writeln!(out, "{name}_count {}", s.count);
                    let _ = writeln!(out, "{name}_sum {}", format_value(s.sum));
                } else {
                    // Without TYPE the parts are untyped series of their own; each gets its
                    // own HELP so that the lint finds nothing unexplained.
                    for (part, what, v) in [
                        ("count", "Number of observations", s.count as f64),
                        ("sum", "Sum of observations", s.sum),
                    ] {
                        let pname = format!("{name}_{part}");
                        let help = format!("{what} of {name} since the runner started.");
                        header(&mut out, o, &pname, &help, "untyped");
                        let _ = writeln!(out, "{pname} {}", format_value(v));
                    }
                }
                if s.count > 0 {
                    for (part, what, v) in [
                        ("min", "Smallest", s.min),
                        ("max", "Largest", s.max),
                        ("last", "Most recent", s.last),
                    ] {
                        let pname = format!("{name}_{part}");
                        let help =
                            format!("{what} observation of {name} since the runner started.");
                        header(&mut out, o, &pname, &help, "gauge");
                        let _ = writeln!(out, "{pname} {}", format_value(v));
                    }
                }
            }
            None => {}
        }
        if m.kind == Kind::Counter {
            for (label, v) in &m.labeled {
                let _ = writeln!(
                    out,
                    "{name}{{{LABEL_NAME}=\"{}\"}} {}",
                    escape_label_value(label),
                    format_value(*v)
                );
            }
        }
    }
    out
}

/// The single comment line written when a policy disables the export.
pub fn disabled_line(reason: &str) -> String {
    format!("# svc-observe: metrics export is disabled by policy ({reason})\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        assert_eq!(format_value(1.0), "1");
        assert_eq!(format_value(1e20), "100000000000000000000");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(1e-7), "0.0000001");
        assert_eq!(format_value(-0.0), "0");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(1700000000.0), "1700000000");
    }

    #[test]
    fn escapes() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("x\\y\nz"), "x\\\\y\\nz");
    }
}
