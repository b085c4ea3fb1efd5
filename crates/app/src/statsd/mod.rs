//! The reference's statsd stats: their names ([`names`]), the TCP sink that sends them
//! (`USE_STATSD`, `sink`), and a statsd-exporter mapping file (`PROMETHEUS_MAPPER_YAML`,
//! [`mapper`], its YAML checked by `guard`) that names them on the metrics page as the
//! reference's Prometheus sink does ([`exposition`]).

pub(crate) mod exposition;
mod guard;
pub(crate) mod mapper;
pub(crate) mod names;
mod sink;

pub(crate) use mapper::Mapper;
pub(crate) use sink::{StatsdArgs, spawn};
