#!/usr/bin/env bash
# The Python package's tests: the package built from this source tree and installed
# (`pip install ./python`, as a user would) into a virtual environment of its own
# under the cargo target folder, then pytest, then the optdigits example, which
# reproduces the command line's figures from Python.
set -euo pipefail
cd "$(dirname "$0")"
target=$(cargo metadata --format-version 1 --no-deps --manifest-path ../Cargo.toml |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
venv="$target/python-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps .
"$venv/bin/pip" install --quiet --disable-pip-version-check ".[test]"
# The command line the package's results are compared with, built as a run from
# the source tree builds it (the user alone, then the proxy and the owner that
# `user local` builds beside it), so the example's run builds nothing again.
cargo build --release --quiet -p user
cargo build --release --quiet -p proxy -p owner
export DPCA_USER_BIN="$target/release/user"
"$venv/bin/pytest" -q
"$venv/bin/python" examples/optdigits.py --key-bits 2048
