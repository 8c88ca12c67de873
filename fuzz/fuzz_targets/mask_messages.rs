#![no_main]
//! Fuzz target: see `dpca_shell::fuzzing::mask_messages`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dpca_shell::fuzzing::mask_messages(data));
