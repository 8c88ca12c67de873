//! The data user: owns the Paillier key, opens studies, decrypts the single row count
//! the proxy asks for, opens the noisy release and derives the principal components.

pub mod clean;
pub mod figures;
pub mod keys;
pub mod local;
pub mod report;
pub mod session;
