//! Test support beyond the harness: certificates made in the test (`certs`), the Kubernetes
//! manifests read as the cluster would (`manifest`) and run as kubelet would (`pod`).

pub mod certs;
pub mod manifest;
pub mod pod;
