"""Refusals surface as Python exceptions carrying the study's clear messages."""

import numpy as np
import pandas as pd
import pytest

import dpca

QUICK = dict(owners=3, k=3, key_bits=2048)


def test_a_cell_that_is_no_number_names_its_row_and_column(digits):
    frame = digits.copy()
    frame["f5"] = frame["f5"].astype(object)
    frame.loc[17, "f5"] = "seven"
    with pytest.raises(ValueError, match=r"row 17, column 'f5': 'seven' is not a number"):
        dpca.local_study(frame, label="label", bounds={"*": (0, 16)}, **QUICK)


def test_an_empty_cell_names_its_row_and_column(digits):
    frame = digits.astype({"f9": "float64"})
    frame.loc[42, "f9"] = np.nan
    with pytest.raises(ValueError, match=r"row 42, column 'f9': the cell is empty"):
        dpca.local_study(frame, label="label", bounds={"*": (0, 16)}, **QUICK)


def test_a_label_that_is_no_column_is_refused(digits):
    with pytest.raises(ValueError, match="label column 'digit'"):
        dpca.local_study(digits, label="digit", bounds={"*": (0, 16)}, **QUICK)


def test_a_bounds_name_that_is_no_feature_is_refused_with_the_nearest_one(digits, tmp_path):
    with pytest.raises(ValueError, match=r"'f1O' is no feature of the table \(did you mean 'f1"):
        dpca.local_study(digits, label="label", bounds={"f1O": (0, 16), "*": (0, 16)}, **QUICK)
    # A bounds file is the study's to check, and its message names the file's line.
    path = tmp_path / "digits.bounds.csv"
    path.write_text("feature,lo,hi\nf1O,0,16\n*,0,16\n")
    with pytest.raises(dpca.StudyError, match=r"digits.bounds.csv: bounds: line 2: `f1O` is no feature"):
        dpca.local_study(digits, label="label", bounds=path, **QUICK)


def test_a_negative_epsilon_is_refused_by_name(digits):
    with pytest.raises(dpca.StudyError, match="epsilon"):
        dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, epsilon=-1.0, **QUICK)


def test_an_unknown_mechanism_is_refused_with_the_known_ones(digits):
    with pytest.raises(ValueError, match="gaussian"):
        dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, mechanism="gauss", **QUICK)


def test_a_key_below_2048_bits_is_refused(digits):
    with pytest.raises(dpca.StudyError, match="2048"):
        dpca.local_study(digits, label="label", bounds={"*": (0, 16)}, owners=3, k=3, key_bits=1024)


def test_bounds_with_lo_above_hi_are_refused_before_anything_runs(digits):
    with pytest.raises(ValueError, match=r"bounds of 'f3'"):
        dpca.local_study(digits, label="label", bounds={"f3": (5, 1)}, **QUICK)


def test_a_missing_file_names_itself():
    with pytest.raises(dpca.StudyError, match="no-such-table.csv"):
        dpca.local_study("no-such-table.csv", **QUICK)


def test_a_column_of_dates_is_refused_by_name(digits):
    frame = digits.copy()
    frame["when"] = pd.Timestamp("2026-01-01")
    with pytest.raises(ValueError, match=r"column 'when' holds datetime64"):
        dpca.local_study(frame, label="label", bounds={"*": (0, 16)}, **QUICK)
