//! What the host gives every layer above it: its environment variables behind a seam tests
//! can replace ([`Env`]) and the INI dialect of the cloud vendors' shared config files
//! ([`ini`]). Neutral on purpose: the AWS code, the object-store sink and the OCI, CloudWatch
//! and Azure connectors of `svc-observe` read through it, and none of them through another.

pub mod ini;

use std::collections::{BTreeMap, HashMap};

/// Environment lookups, injectable for tests. Empty values count as unset.
pub trait Env {
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

impl Env for BTreeMap<&str, &str> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| v.to_string())
            .filter(|v| !v.is_empty())
    }
}
