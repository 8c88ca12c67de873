"""The deployed roles from Python: an owner contributing a DataFrame held in memory,
and a data user's study at a proxy that runs elsewhere."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pandas as pd

from . import _native
from ._frames import Bounds, check_frame, frame_csv
from ._study import StudyResult, _header_of, flags, raise_warnings, result_of, run_user, study_flags

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class Tls:
    """A party's mutual-TLS files: the CA that signs every party, and this party's
    certificate and key (PEM), as ``user dev-certs`` or your own CA writes them."""

    ca: PathLike
    cert: PathLike
    key: PathLike

    @classmethod
    def in_folder(cls, folder: PathLike, name: str) -> "Tls":
        """``name``'s files in a folder of ``dev_certs`` (``ca.pem``, ``NAME.pem``,
        ``NAME.key``)."""
        base = Path(folder)
        return cls(base / "ca.pem", base / f"{name}.pem", base / f"{name}.key")

    def flags(self) -> List[str]:
        """The transport flags of a program."""
        return [f"--tls-ca={self.ca}", f"--tls-cert={self.cert}", f"--tls-key={self.key}"]


def _transport(tls: Optional[Tls], insecure_plaintext: bool) -> List[str]:
    if tls is not None and insecure_plaintext:
        raise ValueError("give tls or insecure_plaintext, not both")
    if tls is None and not insecure_plaintext:
        raise ValueError("tls is required (insecure_plaintext=True runs without it, for tests)")
    return tls.flags() if tls is not None else ["--insecure-plaintext"]


def dev_certs(
    folder: PathLike,
    *,
    owners: Sequence[str],
    users: Sequence[str] = ("user",),
    proxy_hosts: Sequence[str] = ("localhost", "127.0.0.1"),
) -> Path:
    """Writes a throwaway development CA and certificates for the proxy (``proxy``,
    valid for ``proxy_hosts``), the operator, the users and the owners into
    ``folder`` (as ``user dev-certs``): for trying the roles out, not for a
    deployment, whose parties keep their own keys. Returns the folder."""
    _native.dev_certs(str(folder), list(proxy_hosts), list(users), list(owners))
    return Path(folder)


class Owner:
    """A data owner: ``Owner(proxy="https://proxy:50051", tls=Tls(...),
    budget_cap=(2.0, 1e-5)).contribute(df, invitation="invitation.toml")``.

    The frame's rows go from memory to the encryption: they are never written to
    disk. ``budget_cap`` is this data set's (epsilon, delta) over all studies, which
    the proxy enforces; ``accept_risks`` names weaker protections this owner takes
    part in (``owner --help``: ``mask-centering``, ``wishart-unproven``).
    """

    def __init__(
        self,
        proxy: str,
        *,
        budget_cap: Tuple[float, float],
        tls: Optional[Tls] = None,
        owner_id: Optional[str] = None,
        accept_risks: Sequence[str] = (),
        retry_for: float = 60.0,
        insecure_plaintext: bool = False,
    ) -> None:
        self.proxy = proxy
        self.budget_cap = budget_cap
        self.transport = _transport(tls, insecure_plaintext)
        self.owner_id = owner_id
        self.accept_risks = list(accept_risks)
        self.retry_for = retry_for

    def contribute(
        self,
        data: pd.DataFrame,
        *,
        invitation: Optional[PathLike] = None,
        study: Optional[str] = None,
        key_fingerprint: Optional[str] = None,
        label: Optional[str] = None,
        name: str = "DataFrame",
    ) -> Dict[str, Any]:
        """Encrypts this frame's share and sends it to the study the invitation
        names (or ``study`` with the user's ``key_fingerprint``, obtained out of
        band). Returns the owner's report: rows, ciphertexts, bytes, the budget the
        proxy holds for this data set. ``name`` is what messages call the table."""
        if invitation is None and (study is None or key_fingerprint is None):
            raise ValueError("give an invitation, or a study and the user's key_fingerprint")
        check_frame(data, label)
        args = [f"--proxy={self.proxy}", f"--data={name}", "--quiet"]
        cap = f"{float(self.budget_cap[0])!r},{float(self.budget_cap[1])!r}"
        args += flags(
            dict(
                invitation=None if invitation is None else str(invitation),
                study=study,
                key_fingerprint=key_fingerprint,
                label=label,
                owner_id=self.owner_id,
                budget_cap=cap,
                retry_for=float(self.retry_for),
            )
        )
        for risk in self.accept_risks:
            args += ["--accept-risk", risk]
        args += self.transport
        report, notices = _native.contribute(args, frame_csv(data).encode("utf-8"))
        # The program's own warnings, as Python warnings: a notebook may not show
        # a process's standard error.
        for notice in notices:
            warnings.warn(notice, stacklevel=2)
        return json.loads(report)


class Study:
    """A data user's study at a proxy that runs elsewhere, with invited owners:
    ``Study(proxy=..., tls=Tls(...), schema=df_or_columns, owners=["hospital-a",
    ...], max_rows=100_000, bounds=...).run()``.

    ``schema`` gives the table's columns in the owners' order: a DataFrame (its
    header only), a list of names, or a CSV path; the user never sees rows.
    ``invitation`` is where the owners' invitation file is written (else its study
    id and key fingerprint are printed). Every other argument is ``user study``'s
    flag of the same name. ``run()`` waits for the owners and returns the same
    :class:`dpca.StudyResult` as ``local_study``.
    """

    def __init__(
        self,
        proxy: str,
        *,
        schema: Union[pd.DataFrame, Sequence[str], PathLike],
        owners: Sequence[str],
        max_rows: int,
        tls: Optional[Tls] = None,
        bounds: Optional[Bounds] = None,
        label: Optional[str] = None,
        invitation: Optional[PathLike] = None,
        quorum: Optional[int] = None,
        min_owners: Optional[int] = None,
        deadline_minutes: int = 60,
        out: Optional[PathLike] = None,
        insecure_plaintext: bool = False,
        **study: Any,
    ) -> None:
        self.proxy = proxy
        self.schema = schema
        self.owners = list(owners)
        self.transport = _transport(tls, insecure_plaintext)
        self.bounds = bounds
        self.label = label
        self.remote = dict(
            max_rows=max_rows,
            invitation=None if invitation is None else str(invitation),
            quorum=quorum,
            min_owners=min_owners,
            deadline_minutes=deadline_minutes,
        )
        self.out = out
        self.study = study

    def _template(self) -> pd.DataFrame:
        if isinstance(self.schema, pd.DataFrame):
            template = self.schema.iloc[:0]
        elif isinstance(self.schema, (str, os.PathLike)):
            template = _header_of(Path(self.schema)).iloc[:0]
        else:
            template = pd.DataFrame(columns=[str(c) for c in self.schema])
        for name in template.columns:
            if str(name) != str(name).strip() or not str(name):
                raise ValueError(f"schema: column {str(name)!r} is empty or starts or ends with spaces")
        return template

    def run(self) -> StudyResult:
        """Opens the study, invites the owners, waits for them, decrypts the noisy
        release and writes the outputs. Ctrl-C stops it."""
        with tempfile.TemporaryDirectory(prefix="dpca-") as tmp:
            work = Path(tmp)
            template = self._template()
            schema = work / "schema.csv"
            template.to_csv(schema, index=False)
            target = Path(self.out) if self.out is not None else work / "out"
            args = ["study", f"--proxy={self.proxy}", f"--schema={schema}", f"--out={target}"]
            args += flags(dict(owners=self.owners))
            args += flags(dict(self.remote))
            args += study_flags(work, template, self.label, self.bounds, **self.study)
            args += self.transport
            run_user(args)
            result = result_of(target, self.out is not None, template, self.label)
            raise_warnings(result.study)
            return result
