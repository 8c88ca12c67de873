"""``local_study`` and its result: the study of ``user local``, from Python."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import pandas as pd

from . import _native
from ._frames import Bounds, check_frame, feature_columns, like_input, write_bounds, write_frame

Data = Union[pd.DataFrame, str, os.PathLike, Sequence[pd.DataFrame]]

#: The files a study writes, as the command line writes them.
OUTPUT_FILES = tuple(_native.OUTPUT_FILES)


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
    (same columns; ``owners`` is then their number); ``bounds`` maps each feature to its public
    ``(lo, hi)`` (a dict, a frame of ``feature, lo, hi``, or a bounds CSV path; ``*``
    names every other feature). Without bounds they are read off the data, which is
    not private: for demonstrations only. Every other argument is the command line's
    flag of the same name (``user local --help``).

    The frame is written to a private temporary folder for the owner processes and
    removed afterwards. Errors raise ``ValueError`` (a bad cell names its row and
    column) or :class:`dpca.StudyError` (the study's own refusal, with its message).
    Ctrl-C stops the study and every process it started.
    """
    with tempfile.TemporaryDirectory(prefix="dpca-") as tmp:
        work = Path(tmp)
        template = None
        slices = ["--owners", str(owners)]
        if isinstance(data, (list, tuple)):
            data, slices = _pooled(data, label)
        if isinstance(data, pd.DataFrame):
            check_frame(data, label)
            template = data
            path = work / "data.csv"
            write_frame(data, path)
        else:
            path = Path(data)
        target = Path(out) if out is not None else work / "out"
        args = ["local", "--data", str(path), "--out", str(target)] + slices
        args += study_flags(
            work, template, label, bounds, k=k, epsilon=epsilon, delta=delta,
            mechanism=mechanism, centering=centering, synthetic=synthetic, task=task,
            key_bits=key_bits, row_norm_bound=row_norm_bound,
            row_norm_quantile=row_norm_quantile, classes=classes,
            class_covariance=class_covariance, covariance_fit=covariance_fit,
            psd_repair=psd_repair, noise_free_for_testing=noise_free_for_testing,
        )
        run_user(args)
        if template is None:
            template = _header_of(path)
        return read_result(target, template, label)


def _pooled(parts: Sequence[pd.DataFrame], label: Optional[str]):
    """One frame of the owners' parts, in order, and the flag that deals each
    owner its own part back."""
    if not parts:
        raise ValueError("no parts: give one DataFrame per owner")
    columns = [str(c) for c in parts[0].columns]
    for i, part in enumerate(parts):
        if not isinstance(part, pd.DataFrame):
            raise ValueError(f"part {i} is a {type(part).__name__}, not a DataFrame")
        if [str(c) for c in part.columns] != columns:
            raise ValueError(f"part {i} has other columns than part 0")
        check_frame(part, label)
    pooled = pd.concat(parts, ignore_index=True)
    return pooled, ["--slice-rows", ",".join(str(len(p)) for p in parts)]


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
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            if value:
                out += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, float):
            out += [flag, repr(float(value))]
        else:
            out += [flag, str(value)]
    return out


def run_user(args: List[str]) -> Dict[str, Any]:
    """Runs the ``user`` command line's ``args`` in this process (the proxy and
    owners it starts run as processes of this interpreter, ``dpca._role``); returns
    its study.json."""
    return json.loads(_native.run_user(args, role_launcher()))


def role_launcher() -> List[str]:
    """The command that runs a role (``proxy`` or ``owner`` and its flags follow):
    this interpreter, importing this very package first whatever the current folder
    holds (a source checkout's ``dpca/`` has no extension)."""
    home = str(Path(__file__).resolve().parent.parent)
    code = (
        f"import sys; sys.path.insert(0, {home!r}); "
        "from dpca._role import main; sys.exit(main())"
    )
    return [sys.executable, "-c", code]


def read_result(folder: Path, template: pd.DataFrame, label: Optional[str]) -> StudyResult:
    """The result held in a study's output folder."""
    files = {
        name: (folder / name).read_bytes() for name in OUTPUT_FILES if (folder / name).exists()
    }
    study = json.loads(files["study.json"])
    components = pd.read_csv(folder / "components.csv", index_col="feature")
    components.index = components.index.astype(str)
    eig = pd.read_csv(folder / "eigenvalues.csv")
    index = [f"PC{i}" for i in eig["component"]]
    eigenvalues = pd.Series(eig["eigenvalue"].to_numpy(), index=index, name="eigenvalue")
    ratio = pd.Series(
        eig["explained_variance_ratio"].to_numpy(), index=index, name="explained_variance_ratio"
    )
    synthetic = None
    if (folder / "synthetic.csv").exists():
        raw = pd.read_csv(folder / "synthetic.csv", dtype=str if label else None)
        if label:
            features = [c for c in raw.columns if c != label]
            raw[features] = raw[features].astype("float64")
        synthetic = like_input(raw, template, label)
    return StudyResult(components, eigenvalues, ratio, synthetic, study, files)


def _header_of(path: Path) -> pd.DataFrame:
    """The columns of a CSV input and their dtypes as pandas reads them."""
    return pd.read_csv(path, nrows=1000)


def bundled_data() -> Path:
    """The bundled optdigits table (64 pixel counts and the digit label)."""
    return Path(__file__).parent / "data" / "optdigits.csv"


def bundled_bounds() -> Path:
    """Its public bounds: every pixel count in [0, 16]."""
    return Path(__file__).parent / "data" / "optdigits.bounds.csv"
