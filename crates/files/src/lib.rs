//! Files and directories in places other accounts may write: a group-writable data tree, the
//! node exporter's textfile directory, a sticky scratch area. Nothing here follows a symbolic
//! link at a name another account could have planted, blocks on a FIFO, trusts a file by its
//! name alone, or takes a mode from the umask. The boundary and its tests are described in
//! docs/security.md, "Shared directories".
//!
//! - [`atomic`]: replace a whole file (the metrics snapshot, the exporter's textfile output).
//! - [`unnamed`]: `O_TMPFILE` files given their name with `linkat` (also the file sink's way).
//! - [`owner`]: opening files and directories the service trusts, with owner and mode rules.

pub mod atomic;
pub mod owner;
pub mod unnamed;
