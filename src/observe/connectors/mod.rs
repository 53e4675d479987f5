//! Push and poll connectors of `svc-observe`.

pub mod aws_credentials;
pub mod broker_monitoring;
pub mod oci_auth;
pub mod oci_signature;
pub mod sigv4;
