//! The `sink` block of `type = "object_store"`: every field of the spec table with its default
//! and range, plus three documented extensions (`ca_file`, `max_concurrent_puts`,
//! `addressing_style`). Validation is pure: nothing here reads the environment, a file or the
//! network (that happens when the sink is built). See `docs/sinks/object-store.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::document::grammar::{is_env_var_name, looks_secret};
use crate::document::reader::ObjectReader;
use crate::sink::key::{KeyStrategy, KEY_STRATEGIES};
use crate::sink::layout::{
    gzip_suffix_problem, is_simple_suffix, prefix_problem, Compression, DuplicatePolicy,
    GzipSuffix, PayloadMode,
};
use crate::sink::url_scheme::scheme_problem;

/// Where credentials come from (shared with every AWS caller; resolved in
/// [`crate::aws::chain::provider`]).
pub use crate::aws::credentials::CredentialMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectFormat {
    Envelope,
    Payload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataMode {
    None,
    ObjectMetadata,
    Sidecar,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerSideEncryption {
    None,
    Aes256,
    /// `aws:kms`, with `kms_key_id` or the account's default key.
    AwsKms,
}

/// S3 Object Lock retention mode (`object_lock.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    Governance,
    Compliance,
}

impl LockMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Governance => "GOVERNANCE",
            LockMode::Compliance => "COMPLIANCE",
        }
    }
}

/// `object_lock`: every event object is written under a retention of `retain_days` from its
/// put (write once, read many).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLock {
    pub mode: LockMode,
    pub retain_days: u32,
}

/// Longest `object_lock.retain_days` (100 years).
pub const MAX_RETAIN_DAYS: i64 = 36_500;
/// Longest `kms_key_id` (an ARN is at most 2,048 characters).
const MAX_KMS_KEY_ID_BYTES: usize = 2048;

/// How the bucket appears in request URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressingStyle {
    /// Virtual-hosted for the provider's default endpoint (bucket without dots), path style for
    /// a custom `endpoint_url`.
    Auto,
    /// `https://endpoint/bucket/key`.
    Path,
    /// `https://bucket.endpoint/key`.
    Virtual,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ObjectStoreConfig {
    pub bucket: String,
    pub prefix: Option<String>,
    pub endpoint_url: Option<String>,
    pub allow_http_for_local_testing: bool,
    pub region_name: Option<String>,
    pub credential_mode: CredentialMode,
    pub key_strategy: KeyStrategy,
    pub key_prefix: Option<String>,
    pub object_suffix: String,
    pub duplicate_policy: DuplicatePolicy,
    pub object_format: ObjectFormat,
    pub metadata_mode: MetadataMode,
    pub sidecar_suffix: String,
    pub payload_mode: PayloadMode,
    pub compression: Compression,
    pub content_type: String,
    /// Static pairs, names lowercased.
    pub object_metadata: BTreeMap<String, String>,
    pub server_side_encryption: ServerSideEncryption,
    /// `aws:kms` only: the key (id, ARN or alias); `None` = the account's default key.
    pub kms_key_id: Option<String>,
    /// Event objects written under Object Lock retention; the bucket must have Object Lock.
    pub object_lock: Option<ObjectLock>,
    /// Event objects written under a legal hold; the bucket must have Object Lock.
    pub legal_hold: bool,
    pub max_key_bytes: usize,
    pub max_object_bytes: u64,
    pub max_metadata_bytes: usize,
    pub request_timeout: Duration,
    pub max_retries: u32,
    pub retry: Backoff,
    /// Extension: PEM file of CA certificates trusted instead of the built-in web roots.
    pub ca_file: Option<PathBuf>,
    /// Extension: puts in flight for the whole sink (threads of its put pool), shared by all
    /// sink workers.
    pub max_concurrent_puts: usize,
    /// Extension: path or virtual-hosted requests.
    pub addressing_style: AddressingStyle,
}

pub const DEFAULT_MAX_KEY_BYTES: i64 = 1024;
pub const DEFAULT_MAX_OBJECT_BYTES: i64 = 16_777_216;
pub const DEFAULT_MAX_METADATA_BYTES: i64 = 4096;
pub const MAX_OBJECT_METADATA_PAIRS: usize = 32;
pub const DEFAULT_MAX_CONCURRENT_PUTS: i64 = 16;
pub const MAX_CONCURRENT_PUTS: i64 = 64;
/// Reserved first segment below `prefix` for `svc test-sink` probe objects.
pub const CHECK_NAMESPACE: &str = "_svc-check";
/// Reserved first segment below `prefix` for custody checkpoints.
pub const CUSTODY_NAMESPACE: &str = "_svc-custody";
/// Upper bound of the event-derived `x-amz-meta-*` pairs the sink adds in `object_metadata`
/// mode (`svc-payload-sha256` = 64 hex, `svc-stream-sequence` = up to 20 digits), counted as
/// name + value bytes like the static pairs.
pub const EVENT_METADATA_MAX_BYTES: usize = 18 + 64 + 19 + 20;

const OBJECT_FORMATS: &[(&str, ObjectFormat)] = &[
    ("envelope", ObjectFormat::Envelope),
    ("payload", ObjectFormat::Payload),
];
const METADATA_MODES: &[(&str, MetadataMode)] = &[
    ("none", MetadataMode::None),
    ("object_metadata", MetadataMode::ObjectMetadata),
    ("sidecar", MetadataMode::Sidecar),
];
const ENCRYPTIONS: &[(&str, ServerSideEncryption)] = &[
    ("none", ServerSideEncryption::None),
    ("AES256", ServerSideEncryption::Aes256),
    ("aws:kms", ServerSideEncryption::AwsKms),
];
const LOCK_MODES: &[(&str, LockMode)] = &[
    ("GOVERNANCE", LockMode::Governance),
    ("COMPLIANCE", LockMode::Compliance),
];
const ADDRESSING_STYLES: &[(&str, AddressingStyle)] = &[
    ("auto", AddressingStyle::Auto),
    ("path", AddressingStyle::Path),
    ("virtual", AddressingStyle::Virtual),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    DefaultChain,
    Environment,
    Profile,
}
const CREDENTIAL_MODES: &[(&str, Mode)] = &[
    ("default_chain", Mode::DefaultChain),
    ("environment", Mode::Environment),
    ("profile", Mode::Profile),
];

/// Field names that would hold a secret; present in a config they are rejected outright.
const SECRET_FIELDS: &[&str] = &[
    "access_key_id",
    "secret_access_key",
    "session_token",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
];

impl ObjectStoreConfig {
    /// Reads the fields after `type`; every problem is recorded on `r`.
    pub fn read(r: &mut ObjectReader<'_>) -> ObjectStoreConfig {
        let bucket = r.req_string("bucket");
        if r.raw("bucket").is_some_and(|v| v.is_string()) {
            if let Some(why) = bucket_problem(&bucket) {
                r.problem("bucket", why);
            }
        }
        let prefix = r.opt_string("prefix");
        if let Some(why) = prefix.as_deref().and_then(prefix_problem) {
            r.problem("prefix", why);
        }
        let allow_http = r.bool_or("allow_http_for_local_testing", false);
        let endpoint_url = r.opt_string("endpoint_url");
        if let Some(why) = endpoint_url
            .as_deref()
            .and_then(|u| endpoint_problem(u, allow_http))
        {
            r.problem("endpoint_url", why);
        }
        let region_name = read_region(r);
        let credential_mode = read_credentials(r);
        refuse_secret_fields(r);

        let key_strategy = r.one_of("key_strategy", KeyStrategy::IdempotencyKey, KEY_STRATEGIES);
        let key_prefix = read_key_prefix(r);
        let object_suffix = r.string_or("object_suffix", ".json");
        if !is_simple_suffix(&object_suffix) {
            r.problem(
                "object_suffix",
                "must be a simple extension such as .json or .json.gz",
            );
        }
        let duplicate_policy = DuplicatePolicy::read(r);
        let object_format = r.one_of("object_format", ObjectFormat::Envelope, OBJECT_FORMATS);
        let metadata_mode = r.one_of(
            "metadata_mode",
            MetadataMode::ObjectMetadata,
            METADATA_MODES,
        );
        let sidecar_suffix = read_sidecar_suffix(r, &object_suffix);
        if metadata_mode == MetadataMode::Sidecar
            && duplicate_policy == DuplicatePolicy::FailExisting
        {
            r.problem(
                "metadata_mode",
                "sidecar cannot be combined with duplicate_policy fail_existing",
            );
        }
        let payload_mode = PayloadMode::read(r);
        let compression = Compression::read(r);
        check_gzip_suffix(r, compression, &object_suffix);
        let content_type = r.string_or("content_type", "application/json");
        if content_type != "application/json" {
            r.problem("content_type", "must be one of: application/json");
        }
        let raw_metadata = r.string_map("object_metadata");
        let server_side_encryption = r.one_of(
            "server_side_encryption",
            ServerSideEncryption::None,
            ENCRYPTIONS,
        );
        let kms_key_id = read_kms_key_id(r, server_side_encryption);
        let object_lock = r.object("object_lock").map(|mut l| {
            let mode = match l.raw("mode") {
                Some(_) => l.one_of("mode", LockMode::Governance, LOCK_MODES),
                None => {
                    l.problem("mode", "is required: GOVERNANCE or COMPLIANCE");
                    LockMode::Governance
                }
            };
            let retain_days = match l.opt_int_in("retain_days", 1, MAX_RETAIN_DAYS) {
                Some(d) => d as u32,
                None => {
                    if !l.has("retain_days") {
                        l.problem("retain_days", "is required: days from 1 to 36500");
                    }
                    1
                }
            };
            l.finish();
            ObjectLock { mode, retain_days }
        });
        let legal_hold = r.bool_or("legal_hold", false);
        let max_key_bytes = r.int_in("max_key_bytes", DEFAULT_MAX_KEY_BYTES, 64, 1024) as usize;
        let max_object_bytes = r.int_in(
            "max_object_bytes",
            DEFAULT_MAX_OBJECT_BYTES,
            1,
            1_073_741_824,
        ) as u64;
        let max_metadata_bytes =
            r.int_in("max_metadata_bytes", DEFAULT_MAX_METADATA_BYTES, 128, 65536) as usize;
        let object_metadata =
            check_object_metadata(r, raw_metadata, metadata_mode, max_metadata_bytes);
        let request_timeout =
            Duration::from_secs_f64(r.number_in("request_timeout_seconds", 10.0, 0.0, true, 300.0));
        let max_retries = r.int_in("max_retries", 0, 0, 10) as u32;
        let retry = Backoff::read_sink_retry(r, 0, Jitter::Full);
        let ca_file = r.opt_string("ca_file").and_then(|p| {
            if p.trim().is_empty() {
                r.problem("ca_file", "must not be empty");
                None
            } else {
                Some(PathBuf::from(p))
            }
        });
        let max_concurrent_puts = r.int_in(
            "max_concurrent_puts",
            DEFAULT_MAX_CONCURRENT_PUTS,
            1,
            MAX_CONCURRENT_PUTS,
        ) as usize;
        let addressing_style =
            r.one_of("addressing_style", AddressingStyle::Auto, ADDRESSING_STYLES);

        ObjectStoreConfig {
            bucket,
            prefix,
            endpoint_url,
            allow_http_for_local_testing: allow_http,
            region_name,
            credential_mode,
            key_strategy,
            key_prefix,
            object_suffix,
            duplicate_policy,
            object_format,
            metadata_mode,
            sidecar_suffix,
            payload_mode,
            compression,
            content_type,
            object_metadata,
            server_side_encryption,
            kms_key_id,
            object_lock,
            legal_hold,
            max_key_bytes,
            max_object_bytes,
            max_metadata_bytes,
            request_timeout,
            max_retries,
            retry,
            ca_file,
            max_concurrent_puts,
            addressing_style,
        }
    }
}

fn read_region(r: &mut ObjectReader<'_>) -> Option<String> {
    let region_name = r.opt_string("region_name");
    if region_name
        .as_deref()
        .is_some_and(|region| !is_region(region))
    {
        r.problem(
            "region_name",
            "must be 1 to 64 characters of letters, digits, '-' or '_'",
        );
    }
    region_name
}

fn refuse_secret_fields(r: &mut ObjectReader<'_>) {
    for field in SECRET_FIELDS {
        if r.has(field) {
            r.problem(
                field,
                "secrets must not be stored in the configuration; use credential_mode \
                 environment (access_key_id_env, secret_access_key_env) or a profile",
            );
        }
    }
}

fn read_key_prefix(r: &mut ObjectReader<'_>) -> Option<String> {
    let key_prefix = r.opt_string("key_prefix");
    if let Some(kp) = &key_prefix {
        if let Some(why) = prefix_problem(kp) {
            r.problem("key_prefix", why);
        } else if let Some(seg) = [CHECK_NAMESPACE, CUSTODY_NAMESPACE]
            .into_iter()
            .find(|s| kp.split('/').next() == Some(*s))
        {
            r.problem(
                "key_prefix",
                format!("must not start with the reserved segment {seg}"),
            );
        }
    }
    key_prefix
}

fn read_sidecar_suffix(r: &mut ObjectReader<'_>, object_suffix: &str) -> String {
    let sidecar_suffix = r.string_or("sidecar_suffix", ".metadata.json");
    if !is_simple_suffix(&sidecar_suffix) {
        r.problem(
            "sidecar_suffix",
            "must be a simple extension such as .metadata.json",
        );
    } else if object_suffix.ends_with(&sidecar_suffix) {
        r.problem(
            "sidecar_suffix",
            "must not be a suffix of object_suffix (sidecars would collide with objects)",
        );
    }
    sidecar_suffix
}

/// `kms_key_id`: only with `server_side_encryption: aws:kms`; a key id, ARN or alias (letters,
/// digits and `-_/:.`), sent in a signed header.
fn read_kms_key_id(r: &mut ObjectReader<'_>, sse: ServerSideEncryption) -> Option<String> {
    let id = r.opt_string("kms_key_id")?;
    if sse != ServerSideEncryption::AwsKms {
        r.problem(
            "kms_key_id",
            "only applies to server_side_encryption aws:kms",
        );
        return None;
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_/:.".contains(c);
    if id.is_empty() || id.len() > MAX_KMS_KEY_ID_BYTES || !id.chars().all(allowed) {
        r.problem(
            "kms_key_id",
            "must be a KMS key id, ARN or alias: 1 to 2048 letters, digits and - _ / : .",
        );
        return None;
    }
    Some(id)
}

/// Checked even when `object_suffix` is not a simple extension (both problems are reported).
fn check_gzip_suffix(r: &mut ObjectReader<'_>, compression: Compression, object_suffix: &str) {
    match gzip_suffix_problem(compression, object_suffix) {
        Some(GzipSuffix::Missing) => r.problem(
            "object_suffix",
            "must end with .gz (such as .json.gz) when compression is gzip",
        ),
        Some(mismatch) => r.problem("object_suffix", mismatch.message()),
        None => {}
    }
}

fn read_credentials(r: &mut ObjectReader<'_>) -> CredentialMode {
    let mode = r.one_of("credential_mode", Mode::DefaultChain, CREDENTIAL_MODES);
    let profile_name = r.opt_string("profile_name");
    let access = r.opt_string("access_key_id_env");
    let secret = r.opt_string("secret_access_key_env");
    let token = r.opt_string("session_token_env");
    for (field, value) in [
        ("access_key_id_env", &access),
        ("secret_access_key_env", &secret),
        ("session_token_env", &token),
    ] {
        match value {
            Some(name) if !is_env_var_name(name) => {
                r.problem(field, "must be an environment variable name")
            }
            Some(_) if mode != Mode::Environment => {
                r.problem(field, "is only used with credential_mode environment")
            }
            _ => {}
        }
    }
    if let Some(p) = &profile_name {
        if !is_profile_name(p) {
            r.problem(
                "profile_name",
                "must be 1 to 64 characters of letters, digits, '.', '-' or '_'",
            );
        } else if mode != Mode::Profile {
            r.problem("profile_name", "is only used with credential_mode profile");
        }
    }
    match mode {
        Mode::DefaultChain => CredentialMode::DefaultChain,
        Mode::Profile => {
            if profile_name.is_none() {
                r.problem(
                    "profile_name",
                    "is required when credential_mode is profile",
                );
            }
            CredentialMode::Profile {
                profile_name: profile_name.unwrap_or_default(),
            }
        }
        Mode::Environment => {
            for (field, value) in [
                ("access_key_id_env", &access),
                ("secret_access_key_env", &secret),
            ] {
                if value.is_none() {
                    r.problem(field, "is required when credential_mode is environment");
                }
            }
            CredentialMode::Environment {
                access_key_id_env: access.unwrap_or_default(),
                secret_access_key_env: secret.unwrap_or_default(),
                session_token_env: token,
            }
        }
    }
}

/// Validates the static metadata pairs; names are lowercased (S3 stores them so).
fn check_object_metadata(
    r: &mut ObjectReader<'_>,
    raw: BTreeMap<String, String>,
    mode: MetadataMode,
    max_metadata_bytes: usize,
) -> BTreeMap<String, String> {
    let path = r.path_of("object_metadata");
    let problems = r.problems();
    if raw.len() > MAX_OBJECT_METADATA_PAIRS {
        r.problem(
            "object_metadata",
            format!("must have at most {MAX_OBJECT_METADATA_PAIRS} entries"),
        );
    }
    if !raw.is_empty() && mode == MetadataMode::None {
        r.problem(
            "object_metadata",
            "has no effect with metadata_mode none (use object_metadata or sidecar)",
        );
    }
    let mut out = BTreeMap::new();
    for (name, value) in raw {
        let field = format!("{path}.{name}");
        let valid_name = !name.is_empty()
            && name.len() <= 128
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid_name {
            problems.push(
                field,
                "name must be 1 to 128 characters of letters, digits or '-'",
            );
            continue;
        }
        if looks_secret(&name) {
            problems.push(field, "secret-bearing metadata names are not allowed");
            continue;
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("svc-") {
            problems.push(field, "names starting with svc- are reserved for the sink");
            continue;
        }
        if value.len() > 256
            || !value.bytes().all(|b| (0x20..0x7f).contains(&b))
            || value.trim() != value
        {
            problems.push(
                field,
                "value must be at most 256 printable ASCII characters without leading or \
                 trailing spaces",
            );
            continue;
        }
        if out.insert(lower, value).is_some() {
            problems.push(field, "duplicate name (names are case-insensitive)");
        }
    }
    if mode == MetadataMode::ObjectMetadata {
        let total: usize = out.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total + EVENT_METADATA_MAX_BYTES > max_metadata_bytes {
            problems.push(
                path,
                format!(
                    "{total} bytes plus up to {EVENT_METADATA_MAX_BYTES} bytes of event metadata \
                     exceed max_metadata_bytes ({max_metadata_bytes})"
                ),
            );
        }
    }
    out
}

/// Why a bucket name is not DNS-style, if it is not.
pub fn bucket_problem(b: &str) -> Option<&'static str> {
    if b.len() < 3 || b.len() > 63 {
        return Some("must be 3 to 63 characters");
    }
    if !b
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
    {
        return Some("must contain only lowercase letters, digits, '.' and '-'");
    }
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !edge(b.as_bytes()[0]) || !edge(b.as_bytes()[b.len() - 1]) {
        return Some("must start and end with a lowercase letter or digit");
    }
    if b.contains("..") || b.contains(".-") || b.contains("-.") {
        return Some("must not contain '..', '.-' or '-.'");
    }
    if b.parse::<std::net::Ipv4Addr>().is_ok()
        || (b.split('.').count() == 4
            && b.split('.').all(|p| p.bytes().all(|c| c.is_ascii_digit())))
    {
        return Some("must not be formatted as an IP address");
    }
    None
}

/// Why an endpoint URL is not acceptable, if it is not. Never echoes the URL (it might carry
/// credentials).
pub fn endpoint_problem(text: &str, allow_http_for_local_testing: bool) -> Option<String> {
    let Ok(u) = url::Url::parse(text) else {
        return Some("must be a valid absolute URL".into());
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Some("must not contain credentials".into());
    }
    if u.query().is_some() {
        return Some("must not contain a query".into());
    }
    if u.fragment().is_some() {
        return Some("must not contain a fragment".into());
    }
    if u.path() != "/" && !u.path().is_empty() {
        return Some("must not contain a path".into());
    }
    let Some(host) = u.host_str() else {
        return Some("must name a host".into());
    };
    scheme_problem(u.scheme(), host, allow_http_for_local_testing)
}

fn is_region(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn is_profile_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use crate::backoff::Growth;
    use crate::config::RuntimeConfig;
    use crate::sink::SinkConfig;

    use super::*;

    fn doc(sink: &str) -> String {
        format!(
            r#"{{"nats": {{"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c",
                 "subject": "a.>"}}, "sink": {sink}}}"#
        )
    }

    fn problems(sink: &str) -> Vec<String> {
        match RuntimeConfig::parse(&doc(sink)) {
            Ok(_) => Vec::new(),
            Err(inv) => inv.0.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Problems of a sink block `{"type": "object_store", "bucket": "my-bucket", <extra>}`.
    fn with(extra: &str) -> Vec<String> {
        let sep = if extra.is_empty() { "" } else { "," };
        problems(&format!(
            r#"{{"type": "object_store", "bucket": "my-bucket"{sep} {extra}}}"#
        ))
    }

    fn parse(extra: &str) -> ObjectStoreConfig {
        let sep = if extra.is_empty() { "" } else { "," };
        let text = doc(&format!(
            r#"{{"type": "object_store", "bucket": "my-bucket"{sep} {extra}}}"#
        ));
        match RuntimeConfig::parse(&text).unwrap().sink {
            SinkConfig::ObjectStore(c) => *c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn minimal_config_has_the_spec_defaults() {
        let c = parse("");
        assert_eq!(c.bucket, "my-bucket");
        assert_eq!(c.prefix, None);
        assert_eq!(c.endpoint_url, None);
        assert!(!c.allow_http_for_local_testing);
        assert_eq!(c.region_name, None);
        assert_eq!(c.credential_mode, CredentialMode::DefaultChain);
        assert_eq!(c.key_strategy, KeyStrategy::IdempotencyKey);
        assert_eq!(c.key_prefix, None);
        assert_eq!(c.object_suffix, ".json");
        assert_eq!(c.duplicate_policy, DuplicatePolicy::SkipExisting);
        assert_eq!(c.object_format, ObjectFormat::Envelope);
        assert_eq!(c.metadata_mode, MetadataMode::ObjectMetadata);
        assert_eq!(c.sidecar_suffix, ".metadata.json");
        assert_eq!(c.payload_mode, PayloadMode::JsonOrEnvelope);
        assert_eq!(c.compression, Compression::None);
        assert_eq!(c.content_type, "application/json");
        assert!(c.object_metadata.is_empty());
        assert_eq!(c.server_side_encryption, ServerSideEncryption::None);
        assert_eq!(c.max_key_bytes, 1024);
        assert_eq!(c.max_object_bytes, 16_777_216);
        assert_eq!(c.max_metadata_bytes, 4096);
        assert_eq!(c.request_timeout, Duration::from_secs(10));
        assert_eq!(c.max_retries, 0);
        assert_eq!(
            c.retry,
            Backoff {
                growth: Growth::Exponential,
                initial: Duration::from_millis(250),
                multiplier: 2.0,
                max: Duration::from_millis(5000),
                jitter: Jitter::Full,
            }
        );
        assert_eq!(c.ca_file, None);
        assert_eq!(c.max_concurrent_puts, 16);
        assert_eq!(c.addressing_style, AddressingStyle::Auto);
    }

    #[test]
    fn every_field_is_read() {
        let c = parse(
            r#""prefix": "events/prod", "endpoint_url": "http://127.0.0.1:9000",
               "allow_http_for_local_testing": true, "region_name": "eu-west-1",
               "credential_mode": "environment", "access_key_id_env": "K",
               "secret_access_key_env": "S", "session_token_env": "T",
               "key_strategy": "stream_sequence", "key_prefix": "svc", "object_suffix": ".json.gz",
               "duplicate_policy": "replace", "object_format": "payload",
               "metadata_mode": "sidecar", "sidecar_suffix": ".meta.json",
               "payload_mode": "json_or_envelope", "compression": "gzip",
               "content_type": "application/json", "object_metadata": {"Team": "ops"},
               "server_side_encryption": "AES256", "max_key_bytes": 64,
               "max_object_bytes": 1, "max_metadata_bytes": 128,
               "request_timeout_seconds": 0.5, "max_retries": 10, "retry_backoff_ms": 0,
               "retry_max_backoff_ms": 300000, "retry_backoff_mode": "linear",
               "retry_backoff_multiplier": 10.0, "retry_jitter": "equal",
               "ca_file": "/etc/ca.pem", "max_concurrent_puts": 64, "addressing_style": "path""#,
        );
        assert_eq!(c.prefix.as_deref(), Some("events/prod"));
        assert_eq!(
            c.credential_mode,
            CredentialMode::Environment {
                access_key_id_env: "K".into(),
                secret_access_key_env: "S".into(),
                session_token_env: Some("T".into())
            }
        );
        assert_eq!(
            c.object_metadata.get("team").map(String::as_str),
            Some("ops")
        );
        assert_eq!(c.request_timeout, Duration::from_millis(500));
        assert_eq!(c.retry.growth, Growth::Linear);
        assert_eq!(c.retry.jitter, Jitter::Equal);
        assert_eq!(c.max_concurrent_puts, 64);
        assert_eq!(c.addressing_style, AddressingStyle::Path);
        assert_eq!(
            parse(r#""credential_mode": "profile", "profile_name": "prod""#).credential_mode,
            CredentialMode::Profile {
                profile_name: "prod".into()
            }
        );
    }

    #[test]
    fn bucket_rules() {
        let b = |name: &str| {
            problems(&format!(
                r#"{{"type": "object_store", "bucket": "{name}"}}"#
            ))
        };
        assert_eq!(b("ab"), vec!["sink.bucket: must be 3 to 63 characters"]);
        assert_eq!(
            b(&"a".repeat(64)),
            vec!["sink.bucket: must be 3 to 63 characters"]
        );
        assert!(b(&"a".repeat(63)).is_empty());
        assert_eq!(
            b("My-Bucket"),
            vec!["sink.bucket: must contain only lowercase letters, digits, '.' and '-'"]
        );
        assert_eq!(
            b("my_bucket"),
            vec!["sink.bucket: must contain only lowercase letters, digits, '.' and '-'"]
        );
        assert_eq!(
            b("-bucket"),
            vec!["sink.bucket: must start and end with a lowercase letter or digit"]
        );
        assert_eq!(
            b("bucket."),
            vec!["sink.bucket: must start and end with a lowercase letter or digit"]
        );
        assert_eq!(
            b("a..b"),
            vec!["sink.bucket: must not contain '..', '.-' or '-.'"]
        );
        assert_eq!(
            b("192.168.5.4"),
            vec!["sink.bucket: must not be formatted as an IP address"]
        );
        assert_eq!(
            b("999.1.1.1"),
            vec!["sink.bucket: must not be formatted as an IP address"]
        );
        assert!(b("logs.example.com").is_empty());
        assert_eq!(
            problems(r#"{"type": "object_store"}"#),
            vec!["sink.bucket: is required"]
        );
        assert_eq!(
            problems(r#"{"type": "object_store", "bucket": 7}"#),
            vec!["sink.bucket: must be a string"]
        );
    }

    #[test]
    fn prefix_rules() {
        for (prefix, why) in [
            ("/a", "must not start or end with '/'"),
            ("a/", "must not start or end with '/'"),
            ("a//b", "must not contain empty segments"),
            ("a/./b", "must not contain '.' or '..' segments"),
            ("..", "must not contain '.' or '..' segments"),
            (
                "a b",
                "must contain only letters, digits, '_', '-', '.' and '/'",
            ),
            ("", "must not be empty (omit the field instead)"),
        ] {
            assert_eq!(
                with(&format!(r#""prefix": "{prefix}""#)),
                vec![format!("sink.prefix: {why}")],
                "{prefix}"
            );
            assert_eq!(
                with(&format!(r#""key_prefix": "{prefix}""#)),
                vec![format!("sink.key_prefix: {why}")],
                "{prefix}"
            );
        }
        assert_eq!(
            with(&format!(r#""prefix": "{}""#, "a".repeat(257))),
            vec!["sink.prefix: must be at most 256 bytes"]
        );
        assert_eq!(
            with(r#""key_prefix": "_svc-check/x""#),
            vec!["sink.key_prefix: must not start with the reserved segment _svc-check"]
        );
        assert!(with(r#""prefix": "a/b.c/d-e_f", "key_prefix": "x""#).is_empty());
    }

    #[test]
    fn endpoint_rules() {
        let e = |url: &str, allow: bool| {
            with(&format!(
                r#""endpoint_url": "{url}", "allow_http_for_local_testing": {allow}"#
            ))
        };
        assert!(e("https://s3.example.com", false).is_empty());
        assert!(e("https://s3.example.com:8443/", false).is_empty());
        assert!(e("http://127.0.0.1:9000", true).is_empty());
        assert!(e("http://localhost:9000", true).is_empty());
        assert!(e("http://[::1]:9000", true).is_empty());
        let one = |url: &str, allow: bool, why: &str| {
            assert_eq!(
                e(url, allow),
                vec![format!("sink.endpoint_url: {why}")],
                "{url}"
            );
        };
        one(
            "http://127.0.0.1:9000",
            false,
            "must use https (http is allowed only with allow_http_for_local_testing = true and \
             a loopback host)",
        );
        one(
            "http://10.0.0.5:9000",
            true,
            "http is allowed only for the loopback hosts localhost, 127.0.0.1 and [::1]",
        );
        one(
            "http://s3.example.com",
            true,
            "http is allowed only for the loopback hosts localhost, 127.0.0.1 and [::1]",
        );
        one(
            "https://s3.example.com/bucket",
            false,
            "must not contain a path",
        );
        one(
            "https://s3.example.com/?a=b",
            false,
            "must not contain a query",
        );
        one(
            "https://s3.example.com/#frag",
            false,
            "must not contain a fragment",
        );
        one(
            "https://user:hunter2@s3.example.com",
            false,
            "must not contain credentials",
        );
        one(
            "https://user@s3.example.com",
            false,
            "must not contain credentials",
        );
        one("ftp://s3.example.com", false, "must be an https URL");
        one("s3.example.com", false, "must be a valid absolute URL");
        // The rejected URL's secret is never echoed.
        let all = e("https://AKIA:hunter2@s3.example.com", false).join("\n");
        assert!(!all.contains("hunter2") && !all.contains("AKIA"), "{all}");
    }

    #[test]
    fn credential_rules() {
        assert_eq!(
            with(r#""credential_mode": "profile""#),
            vec!["sink.profile_name: is required when credential_mode is profile"]
        );
        assert_eq!(
            with(r#""credential_mode": "environment""#),
            vec![
                "sink.access_key_id_env: is required when credential_mode is environment",
                "sink.secret_access_key_env: is required when credential_mode is environment",
            ]
        );
        assert_eq!(
            with(r#""credential_mode": "environment", "access_key_id_env": "K""#),
            vec!["sink.secret_access_key_env: is required when credential_mode is environment"]
        );
        assert_eq!(
            with(
                r#""credential_mode": "environment", "access_key_id_env": "1BAD",
                   "secret_access_key_env": "S""#
            ),
            vec!["sink.access_key_id_env: must be an environment variable name"]
        );
        assert_eq!(
            with(r#""access_key_id_env": "K""#),
            vec!["sink.access_key_id_env: is only used with credential_mode environment"]
        );
        assert_eq!(
            with(r#""profile_name": "p""#),
            vec!["sink.profile_name: is only used with credential_mode profile"]
        );
        assert_eq!(
            with(r#""credential_mode": "iam""#),
            vec!["sink.credential_mode: must be one of: default_chain, environment, profile"]
        );
        let got = with(r#""secret_access_key": "wJalrXUtnFEMI""#);
        assert_eq!(
            got,
            vec![
                "sink.secret_access_key: secrets must not be stored in the configuration; use \
                 credential_mode environment (access_key_id_env, secret_access_key_env) or a \
                 profile"
            ]
        );
        assert!(!got.join("").contains("wJalr"));
        assert_eq!(
            with(r#""region_name": "eu west""#),
            vec!["sink.region_name: must be 1 to 64 characters of letters, digits, '-' or '_'"]
        );
    }

    #[test]
    fn metadata_rules() {
        let many: Vec<String> = (0..33).map(|i| format!(r#""k{i}": "v""#)).collect();
        assert_eq!(
            with(&format!(r#""object_metadata": {{{}}}"#, many.join(","))),
            vec!["sink.object_metadata: must have at most 32 entries"]
        );
        let ok: Vec<String> = (0..32).map(|i| format!(r#""k{i}": "v""#)).collect();
        assert!(with(&format!(r#""object_metadata": {{{}}}"#, ok.join(","))).is_empty());
        assert_eq!(
            with(r#""object_metadata": {"Authorization": "x"}"#),
            vec![
                "sink.object_metadata.Authorization: secret-bearing metadata names are not allowed"
            ]
        );
        assert_eq!(
            with(r#""object_metadata": {"db-password": "x"}"#),
            vec!["sink.object_metadata.db-password: secret-bearing metadata names are not allowed"]
        );
        assert_eq!(
            with(r#""object_metadata": {"a b": "x"}"#),
            vec!["sink.object_metadata.a b: name must be 1 to 128 characters of letters, digits or '-'"]
        );
        assert_eq!(
            with(r#""object_metadata": {"svc-x": "x"}"#),
            vec!["sink.object_metadata.svc-x: names starting with svc- are reserved for the sink"]
        );
        assert_eq!(
            with(r#""object_metadata": {"team": "caf\u00e9"}"#),
            vec![
                "sink.object_metadata.team: value must be at most 256 printable ASCII characters \
                 without leading or trailing spaces"
            ]
        );
        assert_eq!(
            with(r#""object_metadata": {"Team": "a", "team": "b"}"#),
            vec!["sink.object_metadata.team: duplicate name (names are case-insensitive)"]
        );
        assert_eq!(
            with(r#""object_metadata": {"team": "a"}, "metadata_mode": "none""#),
            vec![
                "sink.object_metadata: has no effect with metadata_mode none (use \
                 object_metadata or sidecar)"
            ]
        );
        assert_eq!(
            with(r#""object_metadata": {"team": "opsx"}, "max_metadata_bytes": 128"#),
            vec![
                "sink.object_metadata: 8 bytes plus up to 121 bytes of event metadata exceed \
                 max_metadata_bytes (128)"
            ]
        );
        assert!(with(r#""max_metadata_bytes": 128"#).is_empty());
    }

    #[test]
    fn mode_combinations_and_suffixes() {
        assert_eq!(
            with(r#""metadata_mode": "sidecar", "duplicate_policy": "fail_existing""#),
            vec!["sink.metadata_mode: sidecar cannot be combined with duplicate_policy fail_existing"]
        );
        assert_eq!(
            with(r#""compression": "gzip""#),
            vec![
                "sink.object_suffix: must end with .gz (such as .json.gz) when compression is gzip"
            ]
        );
        assert_eq!(
            with(r#""object_suffix": ".json.gz""#),
            vec!["sink.object_suffix: must not end with .gz unless compression is gzip"]
        );
        assert!(with(r#""compression": "gzip", "object_suffix": ".json.gz""#).is_empty());
        assert_eq!(
            with(r#""object_suffix": "json""#),
            vec!["sink.object_suffix: must be a simple extension such as .json or .json.gz"]
        );
        assert_eq!(
            with(r#""sidecar_suffix": ".a/b""#),
            vec!["sink.sidecar_suffix: must be a simple extension such as .metadata.json"]
        );
        assert_eq!(
            with(r#""object_suffix": ".metadata.json""#),
            vec![
                "sink.sidecar_suffix: must not be a suffix of object_suffix (sidecars would \
                 collide with objects)"
            ]
        );
        for (field, value, why) in [
            (
                "key_strategy",
                "uuid",
                "must be one of: idempotency_key, stream_sequence, message_id, payload_sha256",
            ),
            (
                "duplicate_policy",
                "ignore",
                "must be one of: skip_existing, replace, fail_existing",
            ),
            ("object_format", "xml", "must be one of: envelope, payload"),
            (
                "metadata_mode",
                "tags",
                "must be one of: none, object_metadata, sidecar",
            ),
            ("payload_mode", "raw", "must be one of: json_or_envelope"),
            ("compression", "zstd", "must be one of: none, gzip"),
            (
                "content_type",
                "text/plain",
                "must be one of: application/json",
            ),
            (
                "server_side_encryption",
                "aws:kms:dsse",
                "must be one of: none, AES256, aws:kms",
            ),
            (
                "retry_backoff_mode",
                "random",
                "must be one of: fixed, linear, exponential",
            ),
            ("retry_jitter", "half", "must be one of: none, full, equal"),
            (
                "addressing_style",
                "dns",
                "must be one of: auto, path, virtual",
            ),
        ] {
            assert_eq!(
                with(&format!(r#""{field}": "{value}""#)),
                vec![format!("sink.{field}: {why}")]
            );
        }
    }

    #[test]
    fn ranges() {
        for (field, bad, why) in [
            ("max_key_bytes", "63", "must be an integer from 64 to 1024"),
            (
                "max_key_bytes",
                "1025",
                "must be an integer from 64 to 1024",
            ),
            (
                "max_object_bytes",
                "0",
                "must be an integer from 1 to 1073741824",
            ),
            (
                "max_object_bytes",
                "1073741825",
                "must be an integer from 1 to 1073741824",
            ),
            (
                "max_metadata_bytes",
                "127",
                "must be an integer from 128 to 65536",
            ),
            (
                "max_metadata_bytes",
                "65537",
                "must be an integer from 128 to 65536",
            ),
            (
                "request_timeout_seconds",
                "0",
                "must be a number greater than 0 and at most 300",
            ),
            (
                "request_timeout_seconds",
                "300.5",
                "must be a number greater than 0 and at most 300",
            ),
            ("max_retries", "11", "must be an integer from 0 to 10"),
            ("max_retries", "-1", "must be an integer from 0 to 10"),
            (
                "retry_backoff_ms",
                "60001",
                "must be an integer from 0 to 60000",
            ),
            (
                "retry_max_backoff_ms",
                "300001",
                "must be an integer from 0 to 300000",
            ),
            (
                "retry_backoff_multiplier",
                "0.5",
                "must be a number from 1 to 10",
            ),
            (
                "retry_backoff_multiplier",
                "10.5",
                "must be a number from 1 to 10",
            ),
            (
                "max_concurrent_puts",
                "0",
                "must be an integer from 1 to 64",
            ),
        ] {
            assert_eq!(
                with(&format!(r#""{field}": {bad}"#)),
                vec![format!("sink.{field}: {why}")],
                "{field} = {bad}"
            );
        }
        assert_eq!(
            with(r#""retry_backoff_ms": 1000, "retry_max_backoff_ms": 500"#),
            vec!["sink.retry_max_backoff_ms: must be at least retry_backoff_ms"]
        );
        assert_eq!(with(r#""bogus": 1"#), vec!["sink.bogus: unknown field"]);
    }
}
