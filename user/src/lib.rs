//! The data user: owns the Paillier key, opens studies, decrypts the single row count
//! the proxy asks for, opens the noisy release and derives the principal components.
//!
//! A study (`local::run`, shared by `user local` and `user study`) is a pure plan
//! (`plan`), a cohort of owners and a proxy (`cohort`: processes started here, or
//! owners invited to a proxy elsewhere), the session with the proxy (`session`),
//! and the analysis of the release (`analysis`); `bounds`, `row_norm`, `axes`,
//! `sweep` and `slicing` are the steps some studies add.

mod analysis;
mod axes;
pub mod bounds;
pub mod clean;
pub mod cli;
mod cohort;
pub mod figures;
pub mod keys;
pub mod local;
pub mod masks;
pub mod plan;
pub mod programs;
pub mod report;
mod row_norm;
pub mod session;
pub mod slicing;
pub mod study_page;
mod sweep;

pub use axes::read_components;
