"""A scikit-learn estimator and a SmartNoise-shaped synthesizer over ``local_study``.

Both run a whole private study per ``fit`` (owners and proxy as processes on
loopback, a fresh key), so they simulate the distributed setting on one machine; a
deployment runs the roles apart (:class:`dpca.Owner`, :class:`dpca.Study`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from ._study import PrivacyLeakWarning, StudyResult, local_study


class DistributedPCA(TransformerMixin, BaseEstimator):
    """Differentially private PCA over rows split among ``owners`` data owners.

    ``fit(X)`` runs one study (``dpca.local_study``): X's rows are dealt to the
    owners, which send only Paillier-encrypted scatter shares; the proxy adds the DP
    noise; the components are those of the noisy centered scatter.

    Each feature is first mapped to [-1, 1] by its public ``bounds`` (a sequence of
    ``(lo, hi)`` per feature, or one pair for all), and each row is clipped to L2
    norm ``row_norm_bound``. ``components_`` and ``explained_variance_`` are in
    those normalized units; ``mean_`` is the DP mean mapped back to X's units, and
    ``transform`` maps X the same way (without the norm clip, like scikit-learn's
    PCA it is linear). Without bounds, or without ``row_norm_bound``, they are
    chosen privately first (as ``local_study`` does): the bounds are then each
    feature's private median plus or minus the scale that holds its range.

    Attributes: ``components_`` (n_components, n_features), ``explained_variance_``,
    ``explained_variance_ratio_``, ``mean_``, ``n_components_``, ``n_features_in_``,
    ``feature_names_in_`` (for frames), ``study_`` (the :class:`dpca.StudyResult`).

    ``noise_free_for_testing`` is a TEST mode (the proxy adds no noise, so nothing
    is private); the command line hides it, and ``local_study`` warns when it is on.
    """

    def __init__(
        self,
        n_components: int = 2,
        *,
        epsilon: float = 1.0,
        delta: Optional[float] = None,
        bounds: Any = None,
        owners: int = 10,
        row_norm_bound: Optional[float] = None,
        mechanism: str = "gaussian",
        key_bits: int = 2048,
        noise_free_for_testing: bool = False,
    ) -> None:
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.bounds = bounds
        self.owners = owners
        self.row_norm_bound = row_norm_bound
        self.mechanism = mechanism
        self.key_bits = key_bits
        self.noise_free_for_testing = noise_free_for_testing

    def fit(self, X: Any, y: Any = None) -> "DistributedPCA":
        """Runs the study on X's rows, dealt evenly among ``owners``; or, given a
        list of arrays or frames (one per owner, same features), on those parts,
        each owner holding its own. y is ignored."""
        parts = None
        # A list of 2-D arrays or frames is one part per owner; a list of rows is X.
        if _is_parts(X):
            widths = {np.asarray(p).shape[1:] for p in X}
            if len(widths) != 1:
                raise ValueError(f"the parts have different numbers of features: {sorted(widths)}")
            parts = [np.asarray(p).shape[0] for p in X]
            X = pd.concat([pd.DataFrame(p) for p in X], ignore_index=True) if all(
                isinstance(p, pd.DataFrame) for p in X
            ) else np.vstack([np.asarray(p) for p in X])
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
        n_features = X.shape[1]
        if not 1 <= int(self.n_components) <= n_features:
            raise ValueError(
                f"n_components={self.n_components} must be between 1 and "
                f"n_features={n_features}"
            )
        given = self._bounds(X)
        names = [f"x{i}" for i in range(n_features)]
        frame = pd.DataFrame(X, columns=names)
        data: Any = frame
        if parts is not None:
            edges = np.cumsum([0] + parts)
            data = [frame.iloc[a:b] for a, b in zip(edges[:-1], edges[1:])]
        result = local_study(
            data,
            # Without bounds the study chooses them privately, and its study.json
            # and report say how (bounds_choice).
            bounds=None if given is None else {n: (a, b) for n, a, b in zip(names, *given)},
            owners=min(int(self.owners), X.shape[0]),
            k=int(self.n_components),
            epsilon=self.epsilon,
            delta=self.delta,
            mechanism=self.mechanism,
            row_norm_bound=self.row_norm_bound,
            key_bits=self.key_bits,
            noise_free_for_testing=self.noise_free_for_testing,
        )
        bounds = np.asarray(result.study["bounds"], dtype=np.float64)
        self._fitted_from(result, bounds[:, 0], bounds[:, 1])
        return self

    def _bounds(self, X: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        n_features = X.shape[1]
        if self.bounds is None:
            return None
        b = np.asarray(self.bounds, dtype=np.float64)
        if b.shape == (2,):
            b = np.tile(b, (n_features, 1))
        if b.shape != (n_features, 2):
            raise ValueError(
                f"bounds must be one (lo, hi) pair or one per feature ({n_features}), "
                f"got shape {b.shape}"
            )
        if not np.all(np.isfinite(b)) or np.any(b[:, 0] > b[:, 1]):
            raise ValueError("bounds must be finite pairs with lo <= hi")
        return b[:, 0], b[:, 1]

    def _fitted_from(self, result: StudyResult, lo: np.ndarray, hi: np.ndarray) -> None:
        k = int(self.n_components)
        self.study_ = result
        self.components_ = result.components.to_numpy().T[:k].copy()
        self.explained_variance_ = result.eigenvalues.to_numpy()[:k].copy()
        self.explained_variance_ratio_ = result.explained_variance_ratio.to_numpy()[:k].copy()
        self.n_components_ = k
        # x in [lo, hi] maps to 2 (x - lo) / (hi - lo) - 1; a constant feature to 0.
        width = hi - lo
        self.scale_ = np.where(width > 0, 2.0 / np.where(width > 0, width, 1.0), 0.0)
        self.offset_ = lo
        mean = result.mean
        normalized = np.zeros(len(lo)) if mean is None else mean.to_numpy()[: len(lo)]
        with np.errstate(divide="ignore", invalid="ignore"):
            self.mean_ = np.where(self.scale_ > 0, lo + (normalized + 1.0) / self.scale_, lo)

    def transform(self, X: Any) -> np.ndarray:
        """Scores of X on the components, in the normalized units."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        centered = (X - self.mean_) * self.scale_
        return centered @ self.components_.T

    def inverse_transform(self, X: Any) -> np.ndarray:
        """Rows in X's units from their scores."""
        check_is_fitted(self)
        Z = np.asarray(X, dtype=np.float64)
        normalized = Z @ self.components_
        with np.errstate(divide="ignore", invalid="ignore"):
            back = np.where(self.scale_ > 0, normalized / self.scale_, 0.0)
        return back + self.mean_

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        # The DP noise is drawn by the proxy from the system's randomness and is
        # never replayable: two fits differ, unless the noise is off (tests).
        tags.non_deterministic = not self.noise_free_for_testing
        tags.input_tags.allow_nan = False
        return tags


def _is_parts(X: Any) -> bool:
    return (
        isinstance(X, list)
        and len(X) > 0
        and all(
            isinstance(p, pd.DataFrame) or (isinstance(p, np.ndarray) and p.ndim == 2)
            for p in X
        )
    )


class PCAGaussSynthesizer:
    """Differentially private synthetic rows in SmartNoise's shape:
    ``PCAGaussSynthesizer(epsilon=1.0, bounds=...).fit(df)`` then ``sample(n)``, or
    ``fit_sample(df)``.

    ``fit`` runs one study (``dpca.local_study``) that releases the noisy scatter
    and DP mean, and keeps the PCA-Gauss model's rows; ``sample(n)`` returns ``n`` of
    them in the frame's columns and dtypes. The model is drawn from once per fit:
    ``fit`` draws ``max_rows`` rows (default 10,000, at least as many as the frame
    has) and ``sample`` deals them out without repeats, refusing more than were
    drawn.
    """

    def __init__(
        self,
        *,
        epsilon: float = 1.0,
        delta: Optional[float] = None,
        bounds: Any = None,
        label: Optional[str] = None,
        task: Optional[str] = None,
        k: int = 10,
        owners: int = 10,
        row_norm_bound: Optional[float] = None,
        row_norm_quantile: Optional[float] = None,
        key_bits: int = 3072,
        max_rows: int = 10_000,
        **study: Any,
    ) -> None:
        self.options: Dict[str, Any] = dict(
            epsilon=epsilon,
            delta=delta,
            bounds=bounds,
            label=label,
            task=task,
            k=k,
            owners=owners,
            row_norm_bound=row_norm_bound,
            row_norm_quantile=row_norm_quantile,
            key_bits=key_bits,
            **study,
        )
        self.max_rows = max_rows
        self.study_: Optional[StudyResult] = None
        self._rows: Optional[pd.DataFrame] = None
        self._taken = 0

    @classmethod
    def create(cls, name: str = "pca-gauss", **kwargs: Any) -> "PCAGaussSynthesizer":
        """SmartNoise's ``Synthesizer.create``: only ``pca-gauss`` is known here."""
        if name not in ("pca-gauss", "pcagauss", "pca_gauss"):
            raise ValueError(f"unknown synthesizer {name!r}; this package has 'pca-gauss'")
        return cls(**kwargs)

    def fit(self, data: pd.DataFrame, **_: Any) -> "PCAGaussSynthesizer":
        """Runs the study on ``data``."""
        rows = max(int(self.max_rows), len(data))
        self.study_ = local_study(data, synthetic=rows, **self.options)
        self._rows = self.study_.synthetic
        self._taken = 0
        return self

    def sample(self, n_rows: int) -> pd.DataFrame:
        """``n_rows`` synthetic rows not handed out before."""
        if self._rows is None:
            raise RuntimeError("fit the synthesizer before sampling")
        if n_rows < 0 or self._taken + n_rows > len(self._rows):
            raise ValueError(
                f"{n_rows} rows asked for, {len(self._rows) - self._taken} left of the "
                f"{len(self._rows)} drawn at fit (raise max_rows)"
            )
        rows = self._rows.iloc[self._taken : self._taken + n_rows].reset_index(drop=True)
        self._taken += n_rows
        return rows

    def fit_sample(self, data: pd.DataFrame, n_rows: Optional[int] = None) -> pd.DataFrame:
        """``fit(data)`` then ``sample(n_rows)``, as many rows as ``data`` by default."""
        self.fit(data)
        return self.sample(len(data) if n_rows is None else n_rows)


__all__: Sequence[str] = ["DistributedPCA", "PCAGaussSynthesizer", "PrivacyLeakWarning"]
