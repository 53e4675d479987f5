//! S3 error XML (src/sink/object_store/client.rs): the body of a non-success answer of the
//! object store, or of whatever answers on its address.
//!
//! Calls `S3Error::from_answer` (what `S3Client::send` builds its error with) and the
//! classification methods. First byte even: the rest is a raw body. Odd: the rest is split at
//! NUL into a code and a message that the harness escapes into an S3 error document.
//! Properties: no panic; Display of the error has no control character and is bounded however
//! long or hostile the body; the `Code` and `Message` of a well-formed document round-trip
//! exactly (message cut to 200 characters).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::sink::object_store::client::S3Error;
use svc_fuzz::{assert_clean_display, split_selector, MAX_ERROR_CHARS};

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    let status = [400, 403, 404, 409, 412, 500, 503][(sel >> 1) as usize % 7];
    let (body, expected) = if sel & 1 == 0 {
        (rest.to_vec(), None)
    } else {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        let (code, message) = text.split_once('\0').unwrap_or((text, ""));
        let doc = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><RequestId>4442587FB7D0A2F9</RequestId></Error>",
            xml_escape(code),
            xml_escape(message)
        );
        (
            doc.into_bytes(),
            Some((code.to_string(), message.to_string())),
        )
    };
    let e = S3Error::from_answer(status, &body);
    let S3Error::Status {
        status: got,
        code,
        message,
    } = &e
    else {
        panic!("an answer is a Status error");
    };
    assert_eq!(*got, status);
    assert!(message.chars().count() <= 200);
    if let Some((want_code, want_message)) = expected {
        assert_eq!(code, &want_code, "Code round-trips");
        let cut: String = want_message.chars().take(200).collect();
        assert_eq!(message, &cut, "Message round-trips");
    }
    let _ = (
        e.is_retryable(),
        e.is_precondition_failed(),
        e.permanent_class(),
    );
    assert_clean_display("s3 error", &e.to_string(), MAX_ERROR_CHARS);
});
