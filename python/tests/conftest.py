"""Shared inputs of the package's tests: a slice of the bundled optdigits table and
the command-line `user` program the results are compared with."""

import os
from pathlib import Path

import pandas as pd
import pytest

import dpca

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def digits() -> pd.DataFrame:
    """600 rows of optdigits: 64 pixel counts in 0..16 and the digit label."""
    return pd.read_csv(dpca.bundled_data()).iloc[:600].reset_index(drop=True)


@pytest.fixture(scope="session")
def user_bin() -> Path:
    """The `user` program of this workspace (built by the test command), with its
    `proxy` and `owner` beside it."""
    given = os.environ.get("DPCA_USER_BIN")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = Path(given) if given else target / "release" / "user"
    if not path.exists():
        pytest.fail(
            f"{path} not found: build it with `cargo build --release -p user` (the "
            "test command does) or set DPCA_USER_BIN"
        )
    return path
