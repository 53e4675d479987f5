//! The instance certificate of the OCI metadata service (crates/observe/src/connectors/oci/instance.rs):
//! PEM from the metadata service, DER parsed in-tree to find the tenancy.
//!
//! First byte even: the rest is PEM text, through `oci_instance::pem_blocks` ("CERTIFICATE")
//! and each block through `subject_attributes` and `tenancy_of`. Odd: the rest is DER, straight
//! into `subject_attributes` and `tenancy_of`.
//! Properties: no panic (the DER walk indexes by peer-supplied lengths); errors clean and
//! bounded; an accepted tenancy is an `ocid1.tenancy.` OCID of the allowed characters that
//! appears (after its prefix) in an `O`/`OU` attribute of the subject.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svc::observe::connectors::oci::instance::{
    fingerprint_sha256, pem_blocks, subject_attributes, tenancy_of,
};
use svc_fuzz::{assert_clean_display, split_selector};

fn check_der(der: &[u8]) {
    let attrs = subject_attributes(der);
    match tenancy_of(der) {
        Ok(ocid) => {
            assert!(ocid.starts_with("ocid1.tenancy."));
            assert!(ocid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
            let attrs = attrs.expect("tenancy found, so the subject parsed");
            assert!(
                attrs.iter().any(|(_, v)| v.ends_with(&ocid)),
                "tenancy {ocid:?} not in the subject"
            );
        }
        Err(e) => assert_clean_display("certificate", &e, 1024),
    }
    let fp = fingerprint_sha256(der);
    assert_eq!(fp.len(), 32 * 3 - 1);
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = split_selector(data) else {
        return;
    };
    if sel & 1 == 1 {
        check_der(rest);
        return;
    }
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match pem_blocks(text, "CERTIFICATE") {
        Ok(blocks) => blocks.iter().for_each(|b| check_der(b)),
        Err(e) => assert_clean_display("pem", &e, 1024),
    }
});
