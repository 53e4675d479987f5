//! Push and poll connectors of `svc-observe`.

pub mod oci_signature;
pub mod sigv4;
