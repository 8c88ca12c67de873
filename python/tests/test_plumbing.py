"""The Python side's own plumbing: flags, kept outputs, config files."""

import numpy as np
import pandas as pd
import pytest

import dpca
from dpca._study import flags, result_of


def test_flags_render_every_value_as_the_command_line_reads_it():
    got = flags(
        dict(
            psd_repair=np.bool_(True),
            baseline=False,
            delta=None,
            epsilon=np.float32(0.5),
            label="-x",
            classes=np.array(["a", "b"]),
            k=np.int64(3),
        )
    )
    assert got == ["--psd-repair", "--epsilon=0.5", "--label=-x", "--classes=a,b", "--k=3"]
    with pytest.raises(ValueError, match="holds a comma"):
        flags(dict(classes=["a,b", "c"]))


def test_outputs_that_cannot_be_read_back_are_kept_and_named(tmp_path, monkeypatch):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "study.json").write_text("{}")

    def broken(*_):
        raise KeyError("budget")

    monkeypatch.setattr(dpca._study, "read_result", broken)
    with pytest.raises(dpca.StudyError, match="its files are in") as err:
        result_of(folder, False, pd.DataFrame(), None)
    kept = str(err.value).rsplit("its files are in ", 1)[1]
    assert kept != str(folder)
    assert (tmp_path / kept / "study.json").read_text() == "{}"


def test_a_config_file_does_not_reach_a_call_from_python(digits, tmp_path, monkeypatch):
    config = tmp_path / "dpca.toml"
    config.write_text("[local]\ndelta = 0.25\n")
    monkeypatch.setenv("DPCA_CONFIG", str(config))
    result = dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, owners=2, k=2, key_bits=2048)
    assert result.study["delta"] != 0.25
