//! The reference's statsd stats: their names ([`names`]), the TCP sink that sends them
//! (`USE_STATSD`, `sink`), and a statsd-exporter mapping file (`PROMETHEUS_MAPPER_YAML`,
//! [`mapper`], its YAML checked by `guard`) that names them on the metrics page as the
//! reference's Prometheus sink does ([`exposition`]).

pub mod exposition;
mod guard;
pub mod mapper;
pub mod names;
mod sink;

pub use mapper::Mapper;
pub use sink::{StatsdArgs, lines, spawn};
