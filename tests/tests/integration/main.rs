//! The integration tests, one module per subject, in one test program: each
//! program links the whole workspace, and one link instead of eight saves
//! minutes of every build of the tests.

mod adversaries;
mod breaks;
mod cleaning;
mod crash;
mod e2e;
mod masks;
mod operator;
mod refusals;
mod remote;
mod simulation;
