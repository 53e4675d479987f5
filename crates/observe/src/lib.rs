//! `svc-observe`, the exporter: snapshot + policy in, approved metrics out.
//!
//! A crate of its own that does not depend on the runner (`svc`): what it shares with it is the
//! snapshot contract (`svc_snapshot`), the subject matcher (`svc_subject`) and the low layers
//! below both (`svc_text`, `svc_document`, `svc_files`, `svc_host`, `svc_aws`). The compiler, not
//! a review, keeps it from reaching broker or sink code.
//!
//! Its exports read only the runner's JSON snapshot (`svc_snapshot`) and the
//! observability policy ([`policy`]); they never connect to the broker, a database, sink output
//! or DLQ subjects, and never see a payload. Two commands reach further when run for it:
//! `broker-monitoring-poll` (the broker's HTTP monitoring endpoints the policy allows) and
//! `init-scrape-policy` (the runner's config, to draft a policy; the binary reads the config
//! and hands over a [`template::TemplateInput`]). Flow of every connector:
//!
//! ```text
//! policy::Policy::load ──▶ connector switches ──▶ select::select (filter + families)
//!        snapshot ──▶ select::check_fresh ─────────┘          │
//!                                                   exposition::render (textfile, http)
//! ```
//!
//! [`filter`] is the one metric filter; [`families`] evaluates `subject_metrics`;
//! [`exposition`] renders the text format; [`textfile`] and [`http`] are the two scrape
//! connectors; [`template`] backs `init-scrape-policy`; [`cli`] is the command line.

pub mod catalogue;
pub mod cli;
pub mod connectors;
pub mod exposition;
pub mod families;
pub mod filter;
pub mod glob;
pub mod http;
pub mod policy;
pub mod select;
pub mod template;
pub mod textfile;
