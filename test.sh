#!/usr/bin/env bash
# Every test: the Rust workspace's (unit, property and integration tests, the
# simulation), then the Python package's (python/run-tests.sh).
set -euo pipefail
cd "$(dirname "$0")"
cargo test --workspace --release
python/run-tests.sh
