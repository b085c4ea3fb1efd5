//! Test support beyond the harness: certificates made in the test (`certs`), the Kubernetes
//! manifests read as the cluster would (`manifest`) and run as kubelet would (`pod`), and an xDS
//! management server (`ads`).

pub mod ads;
pub mod certs;
pub mod manifest;
pub mod pod;
