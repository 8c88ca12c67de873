"""``local_study`` is ``user local``: same study, same files, frames round-trip."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import pandas as pd

import dpca

QUICK = dict(owners=3, k=5, key_bits=2048)


def read_outputs(folder: Path):
    return (
        pd.read_csv(folder / "scatter.csv").to_numpy(),
        pd.read_csv(folder / "eigenvalues.csv").to_numpy(),
        pd.read_csv(folder / "components.csv", index_col="feature"),
    )


def test_local_study_equals_the_command_line_with_the_noise_off(digits, user_bin, tmp_path):
    data = tmp_path / "digits.csv"
    digits.to_csv(data, index=False)
    cli_out = tmp_path / "cli"
    subprocess.run(
        [str(user_bin), "local", "--no-build", "--data", str(data), "--label", "label",
         "--bounds", str(dpca.bundled_bounds()), "--owners", "3", "--k", "5",
         "--key-bits", "2048", "--noise-free-for-testing", "--out", str(cli_out)],
        check=True,
        capture_output=True,
    )
    result = dpca.local_study(
        digits, label="label", bounds=dpca.bundled_bounds(), noise_free_for_testing=True,
        out=tmp_path / "py", **QUICK,
    )
    cli_scatter, cli_eig, cli_components = read_outputs(cli_out)
    py_scatter, py_eig, py_components = read_outputs(tmp_path / "py")
    # No noise: both decrypt the same exact integer sums, so every figure is equal.
    np.testing.assert_array_equal(py_scatter, cli_scatter)
    np.testing.assert_array_equal(py_eig, cli_eig)
    pd.testing.assert_frame_equal(py_components, cli_components)
    pd.testing.assert_frame_equal(result.components, cli_components.rename(index=str))
    np.testing.assert_array_equal(result.eigenvalues.to_numpy(), cli_eig[:, 1])
    cli_study = json.loads((cli_out / "study.json").read_text())
    for key in ("n_rows", "n_features", "features", "bounds", "epsilon", "delta", "mean"):
        assert result.study[key] == cli_study[key], key


def test_the_noise_free_study_is_the_exact_scatter(digits):
    result = dpca.local_study(
        digits, label="label", bounds={"*": (0, 16)}, row_norm_bound=1.0,
        noise_free_for_testing=True, **QUICK
    )
    x = digits.drop(columns="label").to_numpy(dtype=float) / 8.0 - 1.0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x * np.minimum(1.0, 1.0 / norms)
    centered = x - x.mean(axis=0)
    exact = np.linalg.eigvalsh(centered.T @ centered / len(x))[::-1]
    np.testing.assert_allclose(result.eigenvalues.to_numpy(), exact, atol=1e-5)
    np.testing.assert_allclose(result.mean.to_numpy(), x.mean(axis=0), atol=1e-5)


def test_synthetic_rows_keep_the_input_columns_and_dtypes(digits):
    frame = digits.iloc[:, :6].copy()
    frame["ratio"] = (frame["f2"] / 16.0).astype("float32")
    frame["flag"] = frame["f3"] > 8
    frame["label"] = pd.Categorical(digits["label"].map(lambda d: f"digit-{d}"))
    frame = frame[["label", "f2", "ratio", "f3", "flag", "f4", "f5"]]
    bounds = {"f2": (0, 16), "f3": (0, 16), "f4": (0, 16), "f5": (0, 16), "ratio": (0, 1), "flag": (0, 1)}
    result = dpca.local_study(
        frame, label="label", bounds=bounds, synthetic=300, task="classify", owners=3, k=3,
        key_bits=2048,
    )
    synthetic = result.synthetic
    assert list(synthetic.columns) == list(frame.columns)
    assert synthetic.dtypes.to_dict() == frame.dtypes.to_dict()
    assert len(synthetic) == 300
    assert set(synthetic["label"].dropna()) <= set(frame["label"].cat.categories)
    assert synthetic["label"].notna().all()


def test_save_writes_the_files_the_study_wrote(digits, tmp_path):
    result = dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, out=tmp_path / "a", **QUICK)
    saved = result.save(tmp_path / "b")
    for name in ("components.csv", "eigenvalues.csv", "scatter.csv", "study.json", "report.html"):
        assert (saved / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert "<html" in result.report_html
    assert result.budget["epsilon"] == pytest.approx(1.0)
    assert result.budget["epsilon"] <= 1.0
    assert result.study["n_owners"] == 3


def test_parts_are_dealt_to_their_owners(digits, tmp_path):
    parts = [digits.iloc[:50], digits.iloc[50:450], digits.iloc[450:]]
    result = dpca.local_study(
        parts, label="label", bounds={"*": (0, 16)}, k=3, key_bits=2048,
        noise_free_for_testing=True, out=tmp_path / "parts",
    )
    assert result.study["n_owners"] == 3
    assert result.study["owner_rows"] == [50, 400, 150]
    whole = dpca.local_study(
        digits, label="label", bounds={"*": (0, 16)}, owners=3, k=3, key_bits=2048,
        noise_free_for_testing=True, out=tmp_path / "whole",
    )
    assert (tmp_path / "parts" / "scatter.csv").read_bytes() == (tmp_path / "whole" / "scatter.csv").read_bytes()
    with pytest.raises(ValueError, match="part 1 has other columns"):
        dpca.local_study([digits, digits.drop(columns="f3")], label="label", **QUICK)


def test_names_and_classes_that_pandas_would_take_for_missing_stay_as_written(digits):
    frame = digits[["f2", "f3", "f4"]].rename(columns={"f2": "NA"})
    frame["Int"] = digits["f5"].astype("Int64")
    frame["label"] = np.where(digits["label"] < 5, "NA", "None")
    result = dpca.local_study(
        frame, label="label", bounds={"*": (0, 16)}, synthetic=200, task="classify",
        owners=3, k=2, key_bits=2048,
    )
    assert list(result.components.index) == ["NA", "f3", "f4", "Int"]
    assert set(result.synthetic["label"]) <= {"NA", "None"}
    assert result.synthetic["label"].notna().all()
    assert result.synthetic.dtypes["Int"] == frame.dtypes["Int"]
    assert list(result.synthetic.columns) == list(frame.columns)


def test_the_noise_free_test_mode_warns(digits):
    with pytest.warns(dpca.NoiseFreeWarning):
        dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, noise_free_for_testing=True, **QUICK)


def test_a_first_try_chooses_bounds_and_c_privately_and_warns_of_nothing(digits, recwarn):
    result = dpca.local_study(
        digits, label="label", synthetic=300, classes=[str(d) for d in range(10)], **QUICK
    )
    study = result.study
    assert study["task"] == "classify"
    assert study["bounds_from_data"] is False
    assert len(study["bounds_choice"]["scaling"]["features"]) == 64
    assert study["row_norm_choice"]["chosen"] == study["row_norm_bound"]
    assert result.synthetic["label"].notna().all()
    leaks = [w for w in recwarn if issubclass(w.category, (dpca.PrivacyLeakWarning, dpca.ClippingWarning))]
    assert not leaks, [str(w.message) for w in leaks]


def test_clipping_warns_once_in_python_terms(digits, capfd):
    with pytest.warns(dpca.ClippingWarning) as caught:
        result = dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, row_norm_bound=0.05, **QUICK)
    clipping = [w for w in caught if issubclass(w.category, dpca.ClippingWarning)]
    assert len(clipping) == 1
    message = str(clipping[0].message)
    assert "row_norm_bound" in message and "--row-norm" not in message, message
    assert result.study["clipped_rows"] == len(digits)
    # Raised once, as a warning: not printed by the study as well.
    assert "WARNING" not in capfd.readouterr().err


def test_classes_that_miss_a_label_are_refused_naming_the_frames_row(digits):
    with pytest.raises(ValueError, match=r"row 2, column 'label': label '7' is not one of classes") as refused:
        dpca.local_study(digits, label="label", synthetic=10, classes=["0", "1"], **QUICK)
    assert "dpca-" not in str(refused.value), "no temporary folder named"


def test_bounds_read_off_the_data_warn_as_a_leak(digits):
    with pytest.warns(dpca.PrivacyLeakWarning, match="insecure_bounds_from_data=True"):
        result = dpca.local_study(digits, label="label", insecure_bounds_from_data=True, **QUICK)
    assert result.study["bounds_from_data"] is True
