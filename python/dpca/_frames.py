"""DataFrames in and out of the study's CSV files.

The study reads and writes CSV (the same files as the command line). A frame is
checked here first, so that a bad cell is named by its row label and column, not
by a line of a temporary file.
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

Bounds = Union[Mapping[str, Tuple[float, float]], pd.DataFrame, str, os.PathLike]


def _row(label: object) -> str:
    """A row label as a message shows it: text quoted, a number as itself."""
    return repr(label) if isinstance(label, str) else str(label)


def _first(mask: np.ndarray) -> int:
    return int(np.asarray(mask).argmax())


def check_frame(df: pd.DataFrame, label: Optional[str]) -> None:
    """Raises ``ValueError`` naming the first cell a study would refuse (by its row
    label and column)."""
    if df.shape[0] == 0:
        raise ValueError("the table has no rows")
    names = [str(c) for c in df.columns]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"column {dup!r} appears twice")
    for name in names:
        if name != name.strip() or not name:
            raise ValueError(f"column {name!r}: a name must not be empty or start or end with spaces")
    if label is not None and label not in names:
        raise ValueError(f"label column {label!r} is not a column of the table")
    for pos, col in enumerate(df.columns):
        if str(col) != label:
            _check_feature(df.iloc[:, pos], str(col), df.index)
    if label is not None:
        missing = df.iloc[:, names.index(label)].isna().to_numpy()
        if missing.any():
            raise ValueError(f"row {_row(df.index[_first(missing)])}, column {label!r}: the label is empty")


def _check_feature(values: pd.Series, name: str, index: pd.Index) -> None:
    dtype = values.dtype
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_integer_dtype(dtype):
        numeric = values.astype("float64")
    elif pd.api.types.is_float_dtype(dtype):
        numeric = values.astype("float64")
    elif pd.api.types.is_object_dtype(dtype) or pd.api.types.is_string_dtype(dtype):
        numeric = pd.to_numeric(values, errors="coerce")
        flags = values.map(lambda v: isinstance(v, (bool, np.bool_, complex, np.complexfloating)))
        flags = flags.to_numpy(dtype=bool)
        bad = (numeric.isna() & values.notna()).to_numpy() | flags
        if bad.any():
            at = _first(bad)
            raise ValueError(
                f"row {_row(index[at])}, column {name!r}: {values.iloc[at]!r} is not a number"
            )
        numeric = numeric.astype("float64")
    else:
        raise ValueError(f"column {name!r} holds {dtype} values, not numbers")
    missing = numeric.isna().to_numpy()
    if missing.any():
        raise ValueError(f"row {_row(index[_first(missing)])}, column {name!r}: the cell is empty")
    infinite = ~np.isfinite(numeric.to_numpy(dtype="float64"))
    if infinite.any():
        at = _first(infinite)
        raise ValueError(
            f"row {_row(index[at])}, column {name!r}: {values.iloc[at]!r} is not finite"
        )


def frame_csv(df: pd.DataFrame) -> str:
    """The frame as the study's CSV: a header of column names, no index, booleans as
    0 and 1, and every float in full precision, so the study reads the values the
    frame holds."""
    out = df.copy()
    out.columns = [str(c) for c in df.columns]
    for col in out.columns:
        if pd.api.types.is_bool_dtype(out[col]):
            out[col] = out[col].astype("int64")
    return out.to_csv(index=False, float_format="%.17g")


def write_frame(df: pd.DataFrame, path: Path) -> None:
    """Writes the frame as the study's CSV (:func:`frame_csv`)."""
    path.write_text(frame_csv(df))


def write_bounds(bounds: Bounds, path: Path, features: Optional[Sequence[str]] = None) -> Path:
    """The bounds as the study's bounds file (``feature,lo,hi``); a path is used as
    is. A name that is no feature (of ``features``, where known) is refused with
    the nearest one."""
    if isinstance(bounds, (str, os.PathLike)):
        return Path(bounds)
    if isinstance(bounds, pd.DataFrame):
        rows = list(bounds.itertuples(index=False, name=None))
    else:
        rows = [(name, lo_hi[0], lo_hi[1]) for name, lo_hi in bounds.items()]
    lines = []
    for row in rows:
        if len(row) != 3:
            raise ValueError(f"bounds: {row!r} is not (feature, lo, hi)")
        name, lo, hi = row
        if features is not None and name != "*" and name not in features:
            near = difflib.get_close_matches(str(name), list(features), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"bounds: {name!r} is no feature of the table{hint}")
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise ValueError(f"bounds of {name!r}: ({lo}, {hi}) is not a finite lo <= hi")
        if "," in str(name) or "\n" in str(name):
            raise ValueError(f"bounds: feature name {name!r} holds a comma or a line break")
        lines.append(f"{name},{lo!r},{hi!r}")
    path.write_text("feature,lo,hi\n" + "\n".join(lines) + "\n")
    return path


def like_input(synthetic: pd.DataFrame, template: pd.DataFrame, label: Optional[str]) -> pd.DataFrame:
    """The synthetic rows in the input's column order and dtypes: integers rounded
    (and kept in their type's range), booleans thresholded at one half, the label's
    values read back as the input's (its categories too). A column the study does
    not synthesize (the label of a clustering study) is left out."""
    out = pd.DataFrame(index=synthetic.index)
    for col in template.columns:
        name = str(col)
        if name not in synthetic.columns:
            continue
        target = template[col].dtype
        values = synthetic[name]
        if name == label:
            out[col] = _label_like(values, template[col])
        elif pd.api.types.is_bool_dtype(target):
            out[col] = (values.astype("float64") >= 0.5).astype(target)
        elif pd.api.types.is_integer_dtype(target):
            # A nullable integer dtype (Int64, ...) ranges as its numpy dtype.
            info = np.iinfo(getattr(target, "numpy_dtype", target))
            # The largest floats inside the type's range (its max as a float rounds
            # up past it).
            top = np.nextafter(float(info.max), 0.0)
            bottom = np.nextafter(float(info.min), 0.0)
            rounded = np.rint(values.astype("float64")).clip(bottom, top)
            out[col] = rounded.astype(target)
        elif pd.api.types.is_float_dtype(target):
            out[col] = values.astype(target)
        else:
            out[col] = values.astype("float64")
    return out


def _label_like(values: pd.Series, template: pd.Series) -> pd.Series:
    dtype = template.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        by_text = {str(c): c for c in dtype.categories}
        return pd.Series(
            pd.Categorical([by_text.get(str(v), np.nan) for v in values], dtype=dtype),
            index=values.index,
        )
    if pd.api.types.is_bool_dtype(dtype):
        return values.astype(str).isin(["True", "true", "1"])
    if pd.api.types.is_integer_dtype(dtype):
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all():
            return np.rint(numeric).astype(dtype)
        return values
    if pd.api.types.is_numeric_dtype(dtype):
        return pd.to_numeric(values, errors="coerce").astype(dtype)
    # Text labels come back as the input's own values, matched by their text.
    by_text = {str(v): v for v in pd.unique(template.dropna())}
    return values.astype(str).map(lambda v: by_text.get(v, v))


def feature_columns(df: pd.DataFrame, label: Optional[str]) -> Sequence[str]:
    """The study's features: every column but the label, in order."""
    return [str(c) for c in df.columns if str(c) != label]
