//! The INI dialect of the AWS and OCI shared config files.

use std::collections::BTreeMap;

/// Sections of an INI file (the dialect of the AWS, and OCI, shared config files): section
/// name -> key -> value. Section names are trimmed with inner runs of blanks collapsed
/// (`[profile   x]` is `profile x`), keys lower-cased, values trimmed; `#` and `;` start
/// comment lines; a repeated section merges into the first (later keys win; the value a
/// later one replaces is wiped); lines before the first section and lines without `=` are
/// ignored. The values are the caller's to wipe (AWS and OCI keys are secrets).
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let (Some(section), Some((k, v))) = (&current, line.split_once('=')) {
            let replaced = out
                .entry(section.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            // A key set twice: the first value may be a secret key, wiped as it is replaced.
            if let Some(mut old) = replaced {
                svc_text::secret_bytes::wipe_string(&mut old);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_edge_cases() {
        let ini = parse_ini(
            "top = ignored\n# comment\n; also\n[default]\nAWS_Access_Key_ID =  A = B \n\
             no equals sign\n[  profile   x ]\nk=v\n[default]\nextra=1\n[empty]\n",
        );
        assert_eq!(ini["default"]["aws_access_key_id"], "A = B");
        assert_eq!(ini["default"]["extra"], "1");
        assert_eq!(ini["profile x"]["k"], "v");
        assert!(ini["empty"].is_empty());
        assert_eq!(ini.len(), 3);
    }
}
