//! The shell every role shares, above the wire types of `dpca-proto`:
//! [`client::connect`] and its retries, the wall [`clock`] study deadlines are read
//! on, [`config`] (the settings file under env and flags), mutual TLS ([`tls`]),
//! [`invitation`] files, [`signed_count`] (owners' signatures on their E\[N_i\]),
//! [`logging::init`], [`usage::Usage`], the owner's report line ([`owner_report`])
//! and the entry points of the fuzz targets ([`fuzzing`]); with `test-support`, a
//! proxy that never answers (`testing`).

pub mod client;
pub mod clock;
pub mod config;
pub mod fuzzing;
pub mod invitation;
pub mod logging;
pub mod owner_report;
pub mod signed_count;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod text;
pub mod tls;
pub mod upload;
pub mod usage;
