"""The deployed roles from Python: a proxy process, a Study and two Owners that
contribute DataFrames, each party with its own certificate."""

import subprocess
import threading
import time

import numpy as np
import pandas as pd
import pytest

import dpca
from dpca._study import role_launcher


@pytest.fixture()
def proxy(tmp_path):
    """A proxy process with its certificate, and the folder of everyone's."""
    certs = dpca.dev_certs(tmp_path / "certs", owners=["clinic-a", "clinic-b"])
    proc = subprocess.Popen(
        role_launcher() + ["proxy", "--listen", "127.0.0.1:0", "--state", str(tmp_path / "proxy.redb")]
        + dpca.Tls.in_folder(certs, "proxy").flags(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield f"https://{line.split()[-1]}", certs
    proc.kill()
    proc.wait()


def test_owners_contribute_frames_to_a_study_at_a_proxy(proxy, digits, tmp_path):
    url, certs = proxy
    halves = [digits.iloc[:300], digits.iloc[300:]]
    invitation = tmp_path / "invitation.toml"
    study = dpca.Study(
        url, tls=dpca.Tls.in_folder(certs, "user"), schema=digits, label="label",
        owners=["clinic-a", "clinic-b"], max_rows=1000, bounds={"*": (0, 16)},
        invitation=invitation, k=4, key_bits=2048, out=tmp_path / "out", deadline_minutes=5,
    )
    reports = {}
    # An owner told another key's fingerprint refuses the study before encrypting.
    wrong = dpca.Owner(url, tls=dpca.Tls.in_folder(certs, "clinic-a"), budget_cap=(3.0, 3e-3))
    # Daemon threads: a failing assertion below must end the test, not wait for
    # the study's deadline.
    opener = threading.Thread(target=lambda: reports.setdefault("result", study.run()), daemon=True)
    opener.start()
    for _ in range(600):
        if invitation.exists():
            break
        time.sleep(0.05)
    study_id = [l.split('"')[1] for l in invitation.read_text().splitlines() if l.startswith("study")][0]
    with pytest.raises(dpca.StudyError, match="fingerprint"):
        wrong.contribute(halves[0], study=study_id, key_fingerprint="ab" * 32, label="label")

    def contribute(name, frame):
        # Two studies (the row-norm histogram that chooses C, then the study),
        # each charged at the request's delta.
        owner = dpca.Owner(url, tls=dpca.Tls.in_folder(certs, name), budget_cap=(3.0, 3e-3))
        reports[name] = owner.contribute(frame, invitation=invitation, label="label")

    threads = [
        threading.Thread(target=contribute, args=(n, f), daemon=True)
        for n, f in zip(["clinic-a", "clinic-b"], halves)
    ]
    for t in threads:
        t.start()
    for t in threads + [opener]:
        t.join(timeout=120)
    result = reports.pop("result")
    assert sorted(reports) == ["clinic-a", "clinic-b"]
    assert [reports[n]["rows"] for n in ("clinic-a", "clinic-b")] == [300, 300]
    assert result.study["n_owners"] == 2
    assert result.study["n_rows"] == 600
    assert result.components.shape == (64, 4)
    assert np.all(np.diff(result.eigenvalues.to_numpy()[:4]) <= 0)


def test_an_owner_refuses_a_key_it_was_not_given(proxy, digits, tmp_path):
    url, certs = proxy
    owner = dpca.Owner(url, tls=dpca.Tls.in_folder(certs, "clinic-a"), budget_cap=(3.0, 1e-3), retry_for=0)
    with pytest.raises(dpca.StudyError, match="unknown study|not known|no study"):
        owner.contribute(digits, study="0" * 32, key_fingerprint="ab" * 32, label="label")


def test_an_owner_needs_tls_or_plaintext_by_name():
    with pytest.raises(ValueError, match="tls is required"):
        dpca.Owner("https://localhost:50051", budget_cap=(1.0, 1e-5))
