//! Security label profile: config, header parsing, rules/defaults, and a randomised parser test.

use super::*;
use crate::document::reader::{parse_json, ObjectReader, Problems};
use crate::message::metadata::MessageMetadata;

fn cfg(text: &str) -> Result<SecurityLabelsConfig, Vec<String>> {
    let v = parse_json(text).unwrap();
    let p = Problems::new();
    let c = SecurityLabelsConfig::read(Some(ObjectReader::at("security_labels".into(), &v, &p)));
    let p = p.into_vec();
    if p.is_empty() {
        Ok(c)
    } else {
        Err(p.iter().map(|p| p.to_string()).collect())
    }
}

fn meta() -> MessageMetadata {
    MessageMetadata {
        priority: "high".into(),
        classification: "restricted".into(),
        labels: vec!["eu".into(), "pii".into()],
        fell_back: Vec::new(),
    }
}

fn msg(subject: &str, header: Option<&str>) -> RawMessage {
    RawMessage {
        stream: "S".into(),
        consumer: "c".into(),
        headers: header
            .map(|h| vec![(DEFAULT_HEADER.to_string(), h.to_string())])
            .unwrap_or_default(),
        ..RawMessage::sample(subject, 1, &Vec::new())
    }
}

fn enabled() -> SecurityLabelsConfig {
    SecurityLabelsConfig {
        enabled: true,
        ..Default::default()
    }
}

#[test]
fn defaults_of_the_block() {
    let c = cfg("{}").unwrap();
    assert_eq!(c, SecurityLabelsConfig::default());
    assert!(!c.enabled);
    assert_eq!(c.header, "Svc-Security-Labels");
    assert_eq!(c.max_bytes, 8192);
    // Disabled: the header is not even read.
    assert_eq!(c.resolve(&msg("a", Some("not json")), &meta()), Ok(None));
}

#[test]
fn header_profile_is_normalized_and_filled() {
    let c = enabled();
    let got = c
        .resolve(
            &msg(
                "a",
                Some(r#" { "owner": "team-a", "releasability": ["X", "Y"], "priority": null } "#),
            ),
            &meta(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        canonical_json(&got),
        r#"{"classification":"restricted","labels":["eu","pii"],"owner":"team-a","priority":null,"profile":"svc.security-label.v1","releasability":["X","Y"]}"#
    );
    // Explicit values are kept as given (no coercion, no case change without a vocabulary).
    let got = c
        .resolve(
            &msg("a", Some(r#"{"classification":"SECRET","labels":[]}"#)),
            &meta(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(got["classification"], "SECRET");
    assert_eq!(got["labels"], serde_json::json!([]));
    assert_eq!(got["priority"], "high");
}

/// The vocabulary is the authority on spelling: values match ASCII case-insensitively and
/// are stored in the vocabulary's form, from the header, the metadata fill and the config.
#[test]
fn values_take_the_vocabularys_spelling() {
    let c = cfg(r#"{"enabled": true,
        "allowed_classifications": ["UNCLASSIFIED", "SECRET"],
        "allowed_priorities": ["High", "low"],
        "allowed_releasability": ["NATO", "EU"],
        "rules": [{"subject": "r.>", "profile": {"classification": "unclassified"}}]}"#)
    .unwrap();
    let mut m = MessageMetadata {
        classification: "secret".into(),
        ..meta()
    };
    c.spell_metadata(&mut m);
    assert_eq!(
        (m.classification.as_str(), m.priority.as_str()),
        ("SECRET", "High")
    );
    // Filled from the metadata.
    let got = c.resolve(&msg("a", Some("{}")), &m).unwrap().unwrap();
    assert_eq!(got["classification"], "SECRET");
    assert_eq!(got["priority"], "High");
    // From the header, arrays included.
    let got = c
        .resolve(
            &msg(
                "a",
                Some(r#"{"classification":"Secret","releasability":["nato","Eu"]}"#),
            ),
            &m,
        )
        .unwrap()
        .unwrap();
    assert_eq!(got["classification"], "SECRET");
    assert_eq!(got["releasability"], serde_json::json!(["NATO", "EU"]));
    // A configured profile is stored spelled too.
    let got = c.resolve(&msg("r.1", None), &m).unwrap().unwrap();
    assert_eq!(got["classification"], "UNCLASSIFIED");
    // Not listed in any case: refused, without the value.
    let e = c
        .resolve(&msg("a", Some(r#"{"classification":"TOPSECRET"}"#)), &m)
        .unwrap_err();
    assert!(!e.to_string().contains("TOPSECRET"), "{e}");
    // Without a vocabulary, or with labels off, values stay as they are.
    let mut m2 = meta();
    enabled().spell_metadata(&mut m2);
    SecurityLabelsConfig::default().spell_metadata(&mut m2);
    assert_eq!(m2, meta());
}

#[test]
fn envelope_gets_profile_in_both_places() {
    let (mut env, _) = crate::message::envelope::normalize(&msg("a", None), 0, &Default::default());
    let p = serde_json::json!({"profile": PROFILE_SCHEMA});
    apply_to(&mut env, Some(p.clone()));
    assert_eq!(env.security_labels.as_ref(), Some(&p));
    assert_eq!(env.metadata.security_labels.as_ref(), Some(&p));
}

/// The invalid cases of the spec's "Errors" row, plus types, each with field and reason, and
/// never the offending value.
#[test]
fn spec_error_cases_name_field_and_never_echo() {
    let c = cfg(r#"{"enabled": true, "max_bytes": 200,
        "allowed_classifications": ["unclassified", "restricted"],
        "allowed_releasability": ["nato"]}"#)
    .unwrap();
    let secret = "S3CR3T-VALUE-xyzzy";
    let big = "B".repeat(300);
    let cases: Vec<(String, &str, &str)> = vec![
        (format!("{{\"owner\": \"{secret}\""), "", "invalid_json"),
        (format!("[\"{secret}\"]"), "", "not_object"),
        (format!("{{\"{secret}\": 1}}"), "", "unknown_field"),
        (
            format!("{{\"classification\": \"{secret}\"}}"),
            "classification",
            "not_in_vocabulary",
        ),
        (
            format!("{{\"releasability\": [\"nato\", \"{secret}\"]}}"),
            "releasability[1]",
            "not_in_vocabulary",
        ),
        (format!("{{\"owner\": \"{big}\"}}"), "", "too_large"),
        (
            format!("{{\"extensions\": {{\"api_token\": \"{secret}\"}}}}"),
            "extensions",
            "secret_extension_key",
        ),
        (
            format!("{{\"extensions\": {{\"a\": {{\"db_password\": \"{secret}\"}}}}}}"),
            "extensions",
            "secret_extension_key",
        ),
        (
            format!("{{\"profile\": \"{secret}\"}}"),
            "profile",
            "wrong_profile",
        ),
        (
            "{\"profile\": \"svc.security-label.v2\"}".into(),
            "profile",
            "wrong_profile",
        ),
        ("{\"profile\": null}".into(), "profile", "wrong_type"),
        ("{\"labels\": \"eu\"}".into(), "labels", "wrong_type"),
        ("{\"labels\": null}".into(), "labels", "wrong_type"),
        ("{\"labels\": [1]}".into(), "labels[0]", "wrong_type"),
        ("{\"owner\": 7}".into(), "owner", "wrong_type"),
        ("{\"owner\": true}".into(), "owner", "wrong_type"),
        ("{\"owner\": [\"a\"]}".into(), "owner", "wrong_type"),
        ("{\"extensions\": []}".into(), "extensions", "wrong_type"),
        ("{\"extensions\": null}".into(), "extensions", "wrong_type"),
        ("{\"owner\": \"\"}".into(), "owner", "empty_value"),
        (
            format!("{{\"owner\": \"a\\u0007{secret}\"}}"),
            "owner",
            "control_character",
        ),
        (
            format!("{{\"owner\": \"a\", \"owner\": \"{secret}\"}}"),
            "",
            "duplicate_key",
        ),
        (
            format!("{{\"extensions\": {{\"{secret}\": 1, \"{secret}\": 2}}}}"),
            "",
            "duplicate_key",
        ),
        (
            format!("{{\"extensions\": {{\"bad key {secret}\": 1}}}}"),
            "extensions",
            "invalid_extension_key",
        ),
        (
            "{\"extensions\": {\"a\": {\"b\": {\"c\": {\"d\": {}}}}}}".into(),
            "extensions",
            "extensions_too_deep",
        ),
        (
            "{\"extensions\": {\"a\": [[[[1]]]]}}".into(),
            "extensions",
            "extensions_too_deep",
        ),
        ("".into(), "", "invalid_json"),
        (format!("{{}} {secret}"), "", "invalid_json"),
        ("[".repeat(200), "", "nesting_too_deep"),
    ];
    for (header, field, code) in &cases {
        let err = c.resolve(&msg("a", Some(header)), &meta()).unwrap_err();
        let first = err.first();
        assert_eq!(
            (first.field.as_str(), first.reason.code()),
            (*field, *code),
            "header {header:?}: {err}"
        );
        let text = format!("{err} {err:?}");
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains("BBBB"), "{text}");
        assert!(!text.contains("S3CR3T"), "{text}");
        assert!(text.starts_with("security_labels"), "{text}");
    }
    // Exact texts of a few.
    let e = |h: &str| {
        c.resolve(&msg("a", Some(h)), &meta())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        e(r#"{"classification": "nope"}"#),
        "security_labels.classification: value is not in security_labels.allowed_classifications"
    );
    assert_eq!(
        e(r#"{"x": 1, "y": 2}"#),
        "security_labels: unknown root field (allowed: profile, priority, classification, labels, releasability, handling_caveats, owner, originator, policy_id, retention_category, extensions)"
    );
    assert_eq!(
        e(r#"{"owner": 1, "releasability": [2]}"#),
        "security_labels.owner: must be a string or null (and 1 more problem)"
    );
    assert_eq!(
        e("{\"owner\":"),
        "security_labels: is not valid JSON (line 1 column 9)"
    );
    // The filled-in metadata is checked against the vocabulary too.
    let m = MessageMetadata {
        classification: "secret".into(),
        ..meta()
    };
    let err = c.resolve(&msg("a", Some("{}")), &m).unwrap_err();
    assert_eq!(err.first().field, "classification");
    // Duplicate header.
    let mut two = msg("a", Some("{}"));
    two.headers
        .push((DEFAULT_HEADER.to_string(), "{}".to_string()));
    assert_eq!(
        c.resolve(&two, &meta()).unwrap_err().to_string(),
        "security_labels: header appears more than once"
    );
}

#[test]
fn extension_bounds() {
    let c = enabled();
    // Four levels, counting `extensions` itself, are allowed.
    let ok = r#"{"extensions": {"site": "x", "nested": {"a": [1, {"b": null}]}, "o": {"p": {"q": {}}}}}"#;
    assert!(c.resolve(&msg("a", Some(ok)), &meta()).is_ok());
    let many: Vec<String> = (0..=MAX_EXTENSION_KEYS)
        .map(|i| format!("\"k{i}\": 1"))
        .collect();
    let too_many = format!("{{\"extensions\": {{{}}}}}", many.join(","));
    let err = c.resolve(&msg("a", Some(&too_many)), &meta()).unwrap_err();
    assert_eq!(err.first().reason, LabelReason::TooManyExtensionKeys);
    let long_key = format!("{{\"extensions\": {{\"{}\": 1}}}}", "k".repeat(65));
    let err = c.resolve(&msg("a", Some(&long_key)), &meta()).unwrap_err();
    assert_eq!(err.first().reason, LabelReason::InvalidExtensionKey);
    let exact = format!("{{\"extensions\": {{\"{}\": 1}}}}", "k".repeat(64));
    assert!(c.resolve(&msg("a", Some(&exact)), &meta()).is_ok());
}

#[test]
fn size_limit_is_on_the_canonical_form() {
    // Whitespace does not count; the filled-in fields do.
    let mut c = enabled();
    let owner = "o".repeat(40);
    let header = format!("{{ \"owner\" :   \"{owner}\" ,  \"labels\": [], \"priority\": null, \"classification\": null }}");
    let canonical = format!(
        "{{\"classification\":null,\"labels\":[],\"owner\":\"{owner}\",\"priority\":null,\"profile\":\"svc.security-label.v1\"}}"
    );
    c.max_bytes = canonical.len();
    let got = c
        .resolve(&msg("a", Some(&header)), &meta())
        .unwrap()
        .unwrap();
    assert_eq!(canonical_json(&got), canonical);
    c.max_bytes = canonical.len() - 1;
    let err = c.resolve(&msg("a", Some(&header)), &meta()).unwrap_err();
    assert_eq!(
        err.first().reason,
        LabelReason::TooLarge {
            size: canonical.len(),
            max: canonical.len() - 1
        }
    );
    // The pre-parse limit.
    c.max_bytes = 1;
    let huge = format!("{{\"owner\": \"{}\"}}", "x".repeat(MIN_HEADER_LIMIT_BYTES));
    assert_eq!(
        c.resolve(&msg("a", Some(&huge)), &meta())
            .unwrap_err()
            .first()
            .reason
            .code(),
        "header_too_large"
    );
}

#[test]
fn rules_then_default_when_header_absent() {
    let c = cfg(r#"{
        "enabled": true,
        "default": {"owner": "platform", "retention_category": "standard"},
        "rules": [
            {"subject": "audit.>", "profile": {"owner": "audit", "handling_caveats": ["no-export"]}},
            {"subject": "public.*", "profile": null},
            {"subject": "audit.x", "profile": {"owner": "never-reached"}}
        ]}"#)
    .unwrap();
    let r = |s: &str| c.resolve(&msg(s, None), &meta()).unwrap();
    let audit = r("audit.x").unwrap();
    assert_eq!(audit["owner"], "audit");
    assert_eq!(audit["handling_caveats"], serde_json::json!(["no-export"]));
    assert_eq!(
        audit["classification"], "restricted",
        "filled from metadata"
    );
    assert_eq!(
        audit.get("retention_category"),
        None,
        "rules replace, not merge"
    );
    assert_eq!(r("public.news"), None, "null profile clears the default");
    assert_eq!(
        r("public.news.eu"),
        Some(r("other").unwrap()),
        "* is one token"
    );
    let other = r("other").unwrap();
    assert_eq!(other["owner"], "platform");
    assert_eq!(other["profile"], PROFILE_SCHEMA);
    // A header beats the rules.
    let h = c
        .resolve(&msg("public.news", Some(r#"{"owner":"pub"}"#)), &meta())
        .unwrap()
        .unwrap();
    assert_eq!(h["owner"], "pub");
    // Enabled without default or rules: no profile.
    assert_eq!(enabled().resolve(&msg("a", None), &meta()), Ok(None));
}

#[test]
fn config_profiles_are_validated_with_paths() {
    let got = cfg(r#"{
        "enabled": "yes",
        "header": "Bad Header",
        "max_bytes": 0,
        "allowed_priorities": ["low", ""],
        "allowed_classifications": ["a"],
        "default": {"owner": 5, "classification": "b", "extensions": {"secret": 1}, "zz": 1},
        "rules": [
            {"subject": "a.>.b", "profile": {"profile": "v2"}},
            {"subject": "ok"},
            {"profile": []},
            {"subject": "x", "profile": null, "extra": 1}
        ],
        "bogus": true
    }"#)
    .unwrap_err();
    assert_eq!(
        got,
        vec![
            "security_labels.enabled: must be true or false",
            "security_labels.header: must be a non-empty header name without spaces or control characters",
            "security_labels.max_bytes: must be an integer from 1 to 262144",
            "security_labels.allowed_priorities[1]: must be a non-empty string without control characters",
            "security_labels.default.extensions: contains a secret-looking key name (not allowed)",
            "security_labels.default.owner: must be a string or null",
            "security_labels.default: unknown root field (allowed: profile, priority, classification, labels, releasability, handling_caveats, owner, originator, policy_id, retention_category, extensions)",
            "security_labels.rules[0].subject: '>' may only be the last token",
            "security_labels.rules[0].profile.profile: must be svc.security-label.v1",
            "security_labels.rules[1].profile: is required (an object, or null to clear the default)",
            "security_labels.rules[2].subject: is required",
            "security_labels.rules[2].profile: must be a JSON object",
            "security_labels.rules[3].extra: unknown field",
            "security_labels.bogus: unknown field",
        ]
    );
    // Vocabulary and size apply to configured profiles too.
    assert_eq!(
        cfg(r#"{"allowed_classifications": ["a"], "max_bytes": 30, "default": {"classification": "b", "owner": "0123456789"}}"#)
            .unwrap_err(),
        vec![
            "security_labels.default.classification: value is not in security_labels.allowed_classifications",
            "security_labels.default: canonical size 77 bytes exceeds security_labels.max_bytes (30)",
        ]
    );
    // `default: null` is the same as absent.
    assert_eq!(cfg(r#"{"default": null}"#).unwrap().default, None);
}

/// The profile on the envelope is serialized by serde_json; it is canonical only while
/// serde_json's map is key-ordered. Enabling `preserve_order` anywhere in the tree breaks this.
#[test]
fn serde_json_maps_are_key_ordered() {
    let v: Value =
        serde_json::from_str(r#"{"b": {"d": 1, "c": 2}, "a": [{"z": 0, "y": 1}]}"#).unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), canonical_json(&v));
    assert_eq!(
        canonical_len(v.as_object().unwrap()),
        canonical_json(&v).len()
    );
}

#[test]
fn canonical_json_sorts_every_level() {
    let v: Value =
        serde_json::from_str(r#"{"b": {"z": 1, "a": [{"y": 2, "x": "é\n"}]}, "a": null}"#).unwrap();
    assert_eq!(
        canonical_json(&v),
        r#"{"a":null,"b":{"a":[{"x":"é\n","y":2}],"z":1}}"#
    );
}

/// A small deterministic generator (xorshift) so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Marker planted in generated values: it must never appear in an error.
const MARK: &str = "QQmarkQQ";

fn gen_string(rng: &mut Rng) -> String {
    let pieces = [
        MARK, "a", "Z", "é", "日本", "\u{0}", "\u{7}", "\n", "\"", "\\", " ", "🦀", "\u{202e}",
        "nato", "secret", "token", "-", ".",
    ];
    let n = rng.below(6);
    let mut s: String = (0..n).map(|_| *rng.pick(&pieces)).collect();
    if rng.below(40) == 0 {
        s.push_str(&MARK.repeat(2000));
    }
    s
}

fn gen_value(rng: &mut Rng, depth: usize) -> Value {
    let pick = if depth > 6 {
        rng.below(4)
    } else {
        rng.below(7)
    };
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => serde_json::json!(rng.next() as i64),
        3 => Value::String(gen_string(rng)),
        4 => Value::Array(
            (0..rng.below(4))
                .map(|_| gen_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(5) {
                let key = if rng.below(2) == 0 {
                    (*rng.pick(&["site", "api_key", "x.y", "password", "", "k"])).to_string()
                } else {
                    gen_string(rng)
                };
                m.insert(key, gen_value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// A mostly-valid profile with random damage.
fn gen_profile(rng: &mut Rng) -> Value {
    let mut m = Map::new();
    for field in ROOT_FIELDS {
        if rng.below(3) == 0 {
            continue;
        }
        let valid = rng.below(4) != 0;
        let v = match (kind_of(field).unwrap(), valid) {
            (Kind::Str, true) => Value::String(PROFILE_SCHEMA.into()),
            (Kind::StrOrNull, true) => Value::String(
                rng.pick(&["unclassified", "restricted", "high", "x"])
                    .to_string(),
            ),
            (Kind::StrArray, true) => serde_json::json!(["nato", "eu"]),
            (Kind::Object, true) => serde_json::json!({"site": "a", "n": {"b": [1, 2]}}),
            (_, false) => gen_value(rng, 0),
        };
        m.insert(field.to_string(), v);
    }
    if rng.below(5) == 0 {
        m.insert(gen_string(rng), gen_value(rng, 0));
    }
    Value::Object(m)
}

/// Byte-level mutation of valid JSON text.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let alphabet: Vec<char> = "{}[]\":,0123456789eE+-.tfnul \\/\u{0}\u{1f}é\u{feff}x"
        .chars()
        .collect();
    for _ in 0..1 + rng.below(4) {
        let op = rng.below(4);
        let at = if chars.is_empty() {
            0
        } else {
            rng.below(chars.len())
        };
        match op {
            0 if !chars.is_empty() => {
                chars.remove(at);
            }
            1 => chars.insert(at.min(chars.len()), *rng.pick(&alphabet)),
            2 if !chars.is_empty() => chars[at] = *rng.pick(&alphabet),
            _ => {
                let dup: Vec<char> = chars.iter().skip(at).take(8).cloned().collect();
                for (i, c) in dup.into_iter().enumerate() {
                    chars.insert((at + i).min(chars.len()), c);
                }
            }
        }
    }
    chars.into_iter().collect()
}

fn check_outcome(c: &SecurityLabelsConfig, header: &str, checked: &mut [usize; 2]) {
    let m = meta();
    match c.resolve(&msg("a.b", Some(header)), &m) {
        Ok(Some(v)) => {
            checked[0] += 1;
            let text = canonical_json(&v);
            assert!(text.len() <= c.max_bytes, "{}", text.len());
            assert_eq!(
                serde_json::to_string(&v).unwrap(),
                text,
                "serialized = canonical"
            );
            let obj = v.as_object().expect("profile is an object");
            assert_eq!(obj["profile"], PROFILE_SCHEMA);
            assert!(obj.keys().all(|k| ROOT_FIELDS.contains(&k.as_str())));
            for f in ["priority", "classification", "labels"] {
                assert!(obj.contains_key(f), "{f} filled");
            }
            // Idempotent: the normalized profile is accepted again unchanged.
            let again = c.resolve(&msg("a.b", Some(&text)), &m).unwrap().unwrap();
            assert_eq!(again, v);
        }
        Ok(None) => panic!("a present header always yields a profile or an error"),
        Err(rej) => {
            checked[1] += 1;
            assert!(!rej.errors.is_empty() && rej.errors.len() <= MAX_ERRORS);
            for e in &rej.errors {
                let root = e.field.split('[').next().unwrap();
                assert!(
                    root.is_empty() || ROOT_FIELDS.contains(&root),
                    "field {:?}",
                    e.field
                );
                assert!(!e.reason.code().is_empty());
                let text = e.to_string();
                assert!(text.starts_with("security_labels"), "{text}");
                assert!(!text.contains(MARK), "{text}");
                assert!(text.len() < 400, "{text}");
            }
        }
    }
}

/// Many thousands of generated headers: random JSON-ish bytes, damaged valid profiles, deep
/// nesting, huge strings, unicode and control characters. Never a panic; every rejection names
/// an allow-listed field (or none) and a reason, and never echoes input.
#[test]
fn randomised_profiles_never_panic_and_never_echo() {
    let mut c = cfg(r#"{"enabled": true, "max_bytes": 2048,
        "allowed_classifications": ["unclassified", "restricted"],
        "allowed_releasability": ["nato", "eu"]}"#)
    .unwrap();
    let mut rng = Rng(0x5EED_1AB3_15C0_FFEE);
    let mut checked = [0usize; 2];
    for i in 0..30_000 {
        if i == 15_000 {
            c.max_bytes = 262_144;
            c.allowed_classifications.clear();
        }
        let header = match rng.below(5) {
            0 => {
                // Random JSON-ish text.
                let alphabet = [
                    "{",
                    "}",
                    "[",
                    "]",
                    "\"",
                    ":",
                    ",",
                    "1",
                    "-0.5e3",
                    "null",
                    "true",
                    " ",
                    "\"profile\"",
                    "\"owner\"",
                    "\"extensions\"",
                    "\\u0000",
                    "\\ud800",
                    MARK,
                    "é",
                    "\u{0}",
                ];
                (0..rng.below(24)).map(|_| *rng.pick(&alphabet)).collect()
            }
            1 => {
                let valid = gen_profile(&mut rng).to_string();
                mutate(&mut rng, &valid)
            }
            2 => {
                // Deep nesting, in and out of extensions.
                let d = 1 + rng.below(300);
                let inner = format!("{}{MARK}{}", "[".repeat(d), "]".repeat(d));
                if rng.below(2) == 0 {
                    format!("{{\"extensions\": {{\"a\": {inner}}}}}")
                } else {
                    inner
                }
            }
            _ => gen_profile(&mut rng).to_string(),
        };
        check_outcome(&c, &header, &mut checked);
    }
    assert!(checked[0] > 1_000, "accepted {}", checked[0]);
    assert!(checked[1] > 10_000, "rejected {}", checked[1]);
}

/// Both blocks are read by the runtime config, with full field paths.
#[test]
fn runtime_config_reads_both_blocks() {
    let base = r#""nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": {"type": "file", "directory": "/tmp/out"}"#;
    let c = crate::config::RuntimeConfig::parse(&format!("{{{base}}}")).unwrap();
    assert!(!c.security_labels.enabled);
    assert_eq!(c.message_metadata.default_priority, "normal");
    let c = crate::config::RuntimeConfig::parse(&format!(
        r#"{{{base}, "message_metadata": {{"default_priority": "Low"}},
             "security_labels": {{"enabled": true, "default": {{"owner": "ops"}}}}}}"#
    ))
    .unwrap();
    assert_eq!(c.message_metadata.default_priority, "low");
    assert!(c.security_labels.enabled);
    assert_eq!(c.security_labels.default.unwrap().fields()["owner"], "ops");
    let err = crate::config::RuntimeConfig::parse(&format!(
        r#"{{{base}, "message_metadata": {{"rules": [{{"subject": "a.*"}}]}},
             "security_labels": {{"default": {{"extensions": {{"password": "hunter2"}}}}}}}}"#
    ))
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "message_metadata.rules[0].subject: rule sets none of priority, classification, labels\n\
         security_labels.default.extensions: contains a secret-looking key name (not allowed)"
    );
    assert!(!err.contains("hunter2"));
}
