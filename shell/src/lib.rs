//! The shell every role shares, above the wire types of `dpca-proto`:
//! [`client::connect`] and its retries, [`config`] (the settings file under env and
//! flags), mutual TLS ([`tls`]), [`invitation`] files, [`signed_count`] (owners'
//! signatures on their E[N_i]), [`logging::init`], [`usage::Usage`], the owner's
//! report line ([`owner_report`]) and the entry points of the fuzz targets
//! ([`fuzzing`]).

pub mod client;
pub mod config;
pub mod fuzzing;
pub mod invitation;
pub mod logging;
pub mod owner_report;
pub mod signed_count;
pub mod text;
pub mod tls;
pub mod usage;
