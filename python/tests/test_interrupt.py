"""Ctrl-C stops a study and every process it started."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import numpy as np, pandas as pd, dpca
    rng = np.random.default_rng(0)
    # M = 300: after the owners, the user decrypts about 840 ciphertexts at 3072
    # bits, seconds of work, so the interrupt lands inside the study.
    frame = pd.DataFrame(rng.uniform(-1, 1, size=(2000, 300))).add_prefix("x")
    dpca.local_study(frame, bounds={"*": (-1, 1)}, owners=4, k=3, key_bits=3072, out="out")
    """
)


def children_of(pid: int):
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            found[int(entry.name)] = cmdline
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_stops_the_study_and_its_processes(tmp_path):
    # A temporary folder of its own: every copy of the rows (the frame's CSV, the
    # owners' slices) must be gone with the study.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(scratch)},
        # As in a terminal: a shell that runs this suite in the background ignores
        # SIGINT for its children, and Python then installs no handler for it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        roles = {}
        deadline = time.monotonic() + 120
        # Wait until the proxy and at least one owner run: the middle of a study.
        while time.monotonic() < deadline:
            roles = {p: c for p, c in children_of(proc.pid).items() if "role_main" in c}
            if any(" owner " in c for c in roles.values()):
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert any(" proxy " in c for c in roles.values()), roles
        assert any(" owner " in c for c in roles.values()), roles
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err, err
    # Stopped, not finished: had the interrupt waited for the study, it would have
    # written its outputs.
    assert not (tmp_path / "out" / "study.json").exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in roles):
        time.sleep(0.1)
    assert not [c for p, c in roles.items() if alive(p)], "processes left behind"
    assert not list(scratch.iterdir()), "temporary files left behind"
