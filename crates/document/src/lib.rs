//! Strict JSON documents: the reader that collects every problem with its field path, and the
//! name grammars both documents (runtime config, observability policy) share.

pub mod canonical;
pub mod effective;
pub mod grammar;
pub mod reader;
