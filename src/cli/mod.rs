//! Command-line front ends: one lexopt parser per binary, each with a hand-written `HELP`.

pub mod logging;
pub mod observe;
pub mod output;
pub mod protect;
pub mod spool;
pub mod svc;
