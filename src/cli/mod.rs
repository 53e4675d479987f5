//! Command-line front ends: one lexopt parser per binary, each with its hand-written `HELP`.

pub mod observe;
