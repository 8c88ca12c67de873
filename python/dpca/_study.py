"""``local_study`` and its result: the study of ``user local``, from Python."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import pandas as pd

from . import _native
from ._native import StudyError
from ._frames import Bounds, check_frame, feature_columns, like_input, write_bounds, write_frame

Data = Union[pd.DataFrame, str, os.PathLike, Sequence[pd.DataFrame]]

#: The files a study writes, as the command line writes them.
OUTPUT_FILES = tuple(_native.OUTPUT_FILES)


class PrivacyLeakWarning(UserWarning):
    """Something was read off the data (bounds, or class labels): the result is
    not differentially private in that respect."""


class NoiseFreeWarning(UserWarning):
    """A study ran in the test mode without noise: its release is not private."""


class ClippingWarning(UserWarning):
    """More than a tenth of the rows were longer than the row-norm bound C and
    were shortened to it: the components describe the bound as much as the data."""


def _warning_of(notice: Dict[str, str]):
    """A study's warning (study.json's ``kind`` and command-line ``text``) as this
    package words it: its arguments, not the command line's flags."""
    kind, text = notice.get("kind", ""), notice.get("text", "")
    if kind == "rows_clipped":
        return ClippingWarning(
            text.replace("Choose C from the data privately (--row-norm-quantile 0.9) or set a larger --row-norm-bound.",
                         "Leave row_norm_bound out to choose C privately (row_norm_quantile=0.9), "
                         "or give a larger row_norm_bound.")
            .replace("set a larger --row-norm-bound, or a higher --row-norm-quantile.",
                     "give a larger row_norm_bound, or a higher row_norm_quantile.")
        )
    if kind == "classes_from_data":
        return PrivacyLeakWarning(
            "classes were not given: the class labels are read off the data, and the labels "
            "present are published in the study and in every synthetic row; give classes=[...] "
            "(public labels, fixed before any row is seen)"
        )
    if kind == "bounds_from_data":
        return PrivacyLeakWarning(
            "insecure_bounds_from_data=True: the bounds are read off the data, which leaks its "
            "extremes; leave it out to choose them privately"
        )
    return UserWarning(text)


def raise_warnings(study: Dict[str, Any], stacklevel: int = 3) -> None:
    """Each warning of a finished study (study.json's ``warnings``), once, as a
    Python warning."""
    for notice in study.get("warnings", []):
        warnings.warn(_warning_of(notice), stacklevel=stacklevel)


def check_classes(frame: pd.DataFrame, label: Optional[str], classes: Optional[Sequence[str]]) -> None:
    """Raises ``ValueError`` naming the first row whose label is not one of
    ``classes`` (as the study would, but by the frame's row, not a line of a
    temporary file)."""
    if classes is None or label is None or label not in [str(c) for c in frame.columns]:
        return
    wanted = {str(c) for c in classes}
    cells = frame[label].astype(str).str.strip().to_numpy()
    bad = np.array([c not in wanted for c in cells])
    if bad.any():
        at = int(bad.argmax())
        raise ValueError(
            f"row {frame.index[at]!r}, column {label!r}: label {cells[at]!r} is not one of "
            f"classes={sorted(wanted)!r}"
        )


@dataclass
class StudyResult:
    """What a study released, read back from the files it wrote.

    ``components`` is features x PCs, ``eigenvalues`` and
    ``explained_variance_ratio`` are indexed PC1.., both in the study's normalized
    units (each feature mapped to [-1, 1] by its bounds, rows clipped to norm C).
    ``synthetic`` holds the PCA-Gauss rows in the input's columns and dtypes (label
    included), or is ``None`` when none were asked for. ``study`` is study.json as a
    dict; ``budget`` its privacy budget ledger.
    """

    components: pd.DataFrame
    eigenvalues: pd.Series
    explained_variance_ratio: pd.Series
    synthetic: Optional[pd.DataFrame]
    study: Dict[str, Any]
    files: Dict[str, bytes] = field(repr=False)

    @property
    def budget(self) -> Dict[str, Any]:
        """The privacy budget spent, by block and composed (study.json's ``budget``)."""
        return self.study["budget"]

    @property
    def report_html(self) -> str:
        """The study's report page (report.html), self-contained."""
        return self.files["report.html"].decode("utf-8")

    @property
    def mean(self) -> Optional[pd.Series]:
        """The DP mean in normalized units (``dp-mean`` centering), else ``None``."""
        mean = self.study.get("mean")
        if mean is None:
            return None
        return pd.Series(mean, index=self.study["features"][: len(mean)], name="mean")

    def save(self, folder: Union[str, os.PathLike]) -> Path:
        """Writes the study's files (components.csv, eigenvalues.csv, scatter.csv,
        study.json, report.html and synthetic.csv if any) into ``folder``, byte for
        byte as the study wrote them. Returns the folder."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            (out / name).write_bytes(data)
        return out

    def _repr_html_(self) -> str:
        return self.report_html


def local_study(
    data: Data,
    *,
    label: Optional[str] = None,
    bounds: Optional[Bounds] = None,
    owners: int = 10,
    k: int = 10,
    epsilon: float = 1.0,
    delta: Optional[float] = None,
    mechanism: str = "gaussian",
    centering: str = "dp-mean",
    synthetic: Optional[int] = None,
    task: Optional[str] = None,
    key_bits: int = 3072,
    row_norm_bound: Optional[float] = None,
    row_norm_quantile: Optional[float] = None,
    quantile_budget_share: Optional[float] = None,
    bounds_budget_share: Optional[float] = None,
    insecure_bounds_from_data: bool = False,
    pca_from: Optional[Union[str, os.PathLike]] = None,
    components_from: Optional[Union[str, os.PathLike]] = None,
    classes: Optional[List[str]] = None,
    class_covariance: str = "shared",
    covariance_fit: str = "denoised",
    psd_repair: bool = False,
    out: Optional[Union[str, os.PathLike]] = None,
    noise_free_for_testing: bool = False,
) -> StudyResult:
    """Runs one whole study on this machine, as ``user local`` does: ``data`` is split
    among ``owners`` owner processes, which encrypt their scatter shares under a fresh
    Paillier key and send them over gRPC with mutual TLS to a proxy process on
    loopback; the proxy aggregates and adds the DP noise; this process decrypts only
    the noisy scatter and derives the components (and ``synthetic`` rows of PCA-Gauss
    data).

    ``data`` is a DataFrame, a CSV path, or a list of DataFrames, one per owner
    (same columns; their number, not ``owners``, is then the owners'); ``bounds`` maps each feature to its public
    ``(lo, hi)`` (a dict, a frame of ``feature, lo, hi``, or a bounds CSV path; ``*``
    names every other feature). Without bounds every feature's range, center and
    scale are chosen privately (a marginal histogram study first, spending
    ``bounds_budget_share`` of the budget); ``insecure_bounds_from_data=True`` reads
    them off the data instead, which is not private (:class:`PrivacyLeakWarning`).
    Without ``row_norm_bound`` the row-norm bound C is chosen privately too
    (``row_norm_quantile``, 0.9 by default). Every other argument is the command
    line's flag of the same name (``user local --help``).

    The study's warnings (rows clipped to C, labels read off the data) arrive once
    each, as Python warnings (:class:`ClippingWarning`, :class:`PrivacyLeakWarning`).

    ``noise_free_for_testing`` is a TEST mode: the proxy (started for this study
    only) adds no noise, so nothing is private; it warns (:class:`NoiseFreeWarning`).

    The frame is written to a private temporary folder for the owner processes and
    removed afterwards. Errors raise ``ValueError`` (a bad cell names its row and
    column) or :class:`dpca.StudyError` (the study's own refusal, with its message).
    Ctrl-C stops the study and every process it started.
    """
    with tempfile.TemporaryDirectory(prefix="dpca-") as tmp:
        work = Path(tmp)
        template = None
        slices = [f"--owners={owners}"]
        if isinstance(data, (list, tuple)):
            data, slices = _pooled(data, label)
        if isinstance(data, pd.DataFrame):
            check_frame(data, label)
            check_classes(data, label, classes)
            template = data
            path = work / "data.csv"
            write_frame(data, path)
        else:
            path = Path(data)
        target = Path(out) if out is not None else work / "out"
        args = ["local", f"--data={path}", f"--out={target}"] + slices
        args += study_flags(
            work, template, label, bounds, k=k, epsilon=epsilon, delta=delta,
            mechanism=mechanism, centering=centering, synthetic=synthetic, task=task,
            key_bits=key_bits, row_norm_bound=row_norm_bound,
            row_norm_quantile=row_norm_quantile,
            quantile_budget_share=quantile_budget_share,
            bounds_budget_share=bounds_budget_share,
            insecure_bounds_from_data=insecure_bounds_from_data,
            pca_from=None if pca_from is None else str(pca_from),
            components_from=None if components_from is None else str(components_from),
            classes=classes,
            class_covariance=class_covariance, covariance_fit=covariance_fit,
            psd_repair=psd_repair, noise_free_for_testing=noise_free_for_testing,
        )
        if noise_free_for_testing:
            warnings.warn(
                "noise_free_for_testing: the release carries no noise and is not private "
                "(a test mode, which the command line hides)",
                NoiseFreeWarning,
                stacklevel=2,
            )
        run_user(args)
        if template is None:
            template = _header_of(path)
        result = result_of(target, out is not None, template, label)
        raise_warnings(result.study)
        return result


def _pooled(parts: Sequence[pd.DataFrame], label: Optional[str]):
    """One frame of the owners' parts, in order, and the flag that deals each
    owner its own part back."""
    if not parts:
        raise ValueError("no parts: give one DataFrame per owner")
    for i, part in enumerate(parts):
        if not isinstance(part, pd.DataFrame):
            raise ValueError(f"part {i} is a {type(part).__name__}, not a DataFrame")
    columns = [str(c) for c in parts[0].columns]
    for i, part in enumerate(parts):
        if [str(c) for c in part.columns] != columns:
            raise ValueError(f"part {i} has other columns than part 0")
        check_frame(part, label)
    pooled = pd.concat(parts, ignore_index=True)
    return pooled, ["--slice-rows=" + ",".join(str(len(p)) for p in parts)]


def study_flags(
    work: Path,
    template: Optional[pd.DataFrame],
    label: Optional[str],
    bounds: Optional[Bounds],
    **options: Any,
) -> List[str]:
    """The command line's flags of a study: ``--label``, ``--bounds`` (a dict or
    frame written to a file in ``work``, its names checked against ``template``'s
    features where known), and every option under its flag's name."""
    options["label"] = label
    if bounds is not None:
        features = feature_columns(template, label) if template is not None else None
        options["bounds"] = write_bounds(bounds, work / "bounds.csv", features)
    return flags(options)


def flags(options: Dict[str, Any]) -> List[str]:
    """``--name value`` per option (underscores to dashes): ``None`` and ``False``
    left out, ``True`` the flag alone, a list comma-joined, a float exactly."""
    out: List[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, (bool, np.bool_)):
            if value:
                out.append(flag)
        elif value is None:
            continue
        elif isinstance(value, (list, tuple, np.ndarray, pd.Series, pd.Index)):
            texts = [str(v) for v in list(value)]
            if any("," in t for t in texts):
                raise ValueError(f"{name}: {texts!r}: a value holds a comma")
            if texts:
                out.append(f"{flag}={','.join(texts)}")
        elif isinstance(value, (float, np.floating)):
            out.append(f"{flag}={float(value)!r}")
        else:
            # `--flag=value`, so that a value starting with `-` is not a flag.
            out.append(f"{flag}={value}")
    return out


def run_user(args: List[str]) -> Dict[str, Any]:
    """Runs the ``user`` command line's ``args`` in this process (the proxy and
    owners it starts run as processes of this interpreter: :func:`role_launcher`);
    returns its study.json."""
    return json.loads(_native.run_user(args, role_launcher()))


def role_launcher() -> List[str]:
    """The command that runs a role (``proxy`` or ``owner`` and its flags follow):
    this interpreter, isolated (``-I``: no environment variables of Python's, no
    user site, no current folder on the path), loading this very extension by its
    file and nothing else (not pandas, not whatever a ``dpca/`` folder in the
    current one holds)."""
    native = str(Path(_native.__file__).resolve())
    code = (
        "import importlib.machinery as m, importlib.util as u, sys; "
        f"l = m.ExtensionFileLoader('dpca._native', {native!r}); "
        "s = u.spec_from_file_location('dpca._native', l.path, loader=l); "
        "n = u.module_from_spec(s); l.exec_module(n); "
        "sys.exit(n.role_main(sys.argv[1], sys.argv[2:]))"
    )
    return [sys.executable, "-I", "-c", code]


def result_of(folder: Path, keep: bool, template: pd.DataFrame, label: Optional[str]) -> StudyResult:
    """:func:`read_result`; should that fail, the error names where the files are:
    the study's budget is spent, its release must not be lost. A temporary folder
    (``keep`` false) is first copied to one that stays."""
    try:
        return read_result(folder, template, label)
    except Exception as e:
        kept = folder
        if not keep:
            kept = Path(tempfile.mkdtemp(prefix="dpca-outputs-"))
            shutil.copytree(folder, kept, dirs_exist_ok=True)
        raise StudyError(
            f"the study ran but its outputs could not be read back ({e}); its files are in {kept}"
        ) from e


def read_result(folder: Path, template: pd.DataFrame, label: Optional[str]) -> StudyResult:
    """The result held in a study's output folder. Cells are read as written: no
    text is taken for a missing value (a feature or class called `NA` stays one)."""
    files = {
        name: (folder / name).read_bytes() for name in OUTPUT_FILES if (folder / name).exists()
    }
    study = json.loads(files["study.json"])
    components = pd.read_csv(
        folder / "components.csv", dtype={"feature": str}, keep_default_na=False
    ).set_index("feature")
    eig = pd.read_csv(folder / "eigenvalues.csv")
    index = [f"PC{i}" for i in eig["component"]]
    eigenvalues = pd.Series(eig["eigenvalue"].to_numpy(), index=index, name="eigenvalue")
    ratio = pd.Series(
        eig["explained_variance_ratio"].to_numpy(), index=index, name="explained_variance_ratio"
    )
    synthetic = None
    if (folder / "synthetic.csv").exists():
        raw = pd.read_csv(folder / "synthetic.csv", dtype=str, keep_default_na=False)
        features = [c for c in raw.columns if c != label]
        raw[features] = raw[features].astype("float64")
        synthetic = like_input(raw, template, label)
    return StudyResult(components, eigenvalues, ratio, synthetic, study, files)


def _header_of(path: Path) -> pd.DataFrame:
    """The columns of a CSV input and their dtypes as pandas reads them: names
    trimmed as the study trims them, no text taken for a missing value."""
    frame = pd.read_csv(path, nrows=1000, keep_default_na=False)
    return frame.rename(columns=lambda c: str(c).strip())


def bundled_data() -> Path:
    """The bundled optdigits table (64 pixel counts and the digit label)."""
    return Path(__file__).parent / "data" / "optdigits.csv"


def bundled_bounds() -> Path:
    """Its public bounds: every pixel count in [0, 16]."""
    return Path(__file__).parent / "data" / "optdigits.bounds.csv"
