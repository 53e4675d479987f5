//! The refusal of a governance stage (`mission_metadata`, `pre_sink_policy`, `size_policy`):
//! a permanent pre-sink failure with a reason code per problem, the field path of each, and
//! for a size limit the measured size and the limit. Built only from field names the
//! configuration defines, static reasons and numbers: never from message content.

use std::fmt;

/// Most problems kept for one message (the first ones found).
pub const MAX_PROBLEMS: usize = 16;

/// A measured size over its limit (bytes, or a count for the count limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    pub measured: u64,
    pub limit: u64,
}

/// One problem: a full field path (`mission_metadata.sortie_id`) and a stable reason code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub code: &'static str,
    /// Value-free text of the reason (`must be an integer`, `2048 bytes, more than 1024`).
    pub text: String,
}

/// Why a stage refused a message; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The stage: `mission_metadata`, `pre_sink_policy` or `size_policy`.
    pub stage: &'static str,
    pub problems: Vec<Problem>,
    /// Set when the first problem is a size over a limit.
    pub measured: Option<Measured>,
}

impl Refusal {
    /// A refusal with one problem.
    pub fn one(
        stage: &'static str,
        field: impl Into<String>,
        code: &'static str,
        text: impl Into<String>,
    ) -> Refusal {
        Refusal {
            stage,
            problems: vec![Problem {
                field: field.into(),
                code,
                text: text.into(),
            }],
            measured: None,
        }
    }

    /// A refusal with one size problem: `measured` over `limit`.
    pub fn size(
        stage: &'static str,
        field: impl Into<String>,
        code: &'static str,
        unit: &str,
        measured: u64,
        limit: u64,
    ) -> Refusal {
        let mut r = Refusal::one(
            stage,
            field,
            code,
            format!("{measured} {unit}, more than {limit}"),
        );
        r.measured = Some(Measured { measured, limit });
        r
    }

    pub fn first(&self) -> &Problem {
        &self.problems[0]
    }

    /// The reason code of the first problem.
    pub fn code(&self) -> &'static str {
        self.first().code
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.first();
        write!(f, "{}: {} ({})", p.field, p.text, p.code)?;
        match self.problems.len() {
            1 => Ok(()),
            2 => f.write_str(" (and 1 more problem)"),
            n => write!(f, " (and {} more problems)", n - 1),
        }
    }
}

impl std::error::Error for Refusal {}

/// Collects problems of one stage, without repeats and at most [`MAX_PROBLEMS`].
#[derive(Debug)]
pub struct Problems {
    stage: &'static str,
    list: Vec<Problem>,
    measured: Option<Measured>,
}

impl Problems {
    pub fn new(stage: &'static str) -> Problems {
        Problems {
            stage,
            list: Vec::new(),
            measured: None,
        }
    }

    pub fn push(&mut self, field: impl Into<String>, code: &'static str, text: impl Into<String>) {
        let field = field.into();
        if self.list.len() < MAX_PROBLEMS
            && !self.list.iter().any(|p| p.field == field && p.code == code)
        {
            self.list.push(Problem {
                field,
                code,
                text: text.into(),
            });
        }
    }

    /// A size over its limit; the first one found is the record's `measured`.
    pub fn push_size(&mut self, field: impl Into<String>, code: &'static str, m: Measured) {
        if self.list.is_empty() {
            self.measured = Some(m);
        }
        self.push(
            field,
            code,
            format!("{} bytes, more than {}", m.measured, m.limit),
        );
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn into_result<T>(self, ok: T) -> Result<T, Refusal> {
        if self.list.is_empty() {
            Ok(ok)
        } else {
            Err(Refusal {
                stage: self.stage,
                problems: self.list,
                measured: self.measured,
            })
        }
    }
}
