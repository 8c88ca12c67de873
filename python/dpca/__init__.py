"""Private distributed PCA and differentially private synthetic data, from pandas.

``local_study`` runs the whole protocol on this machine (owners and proxy as
processes over gRPC with mutual TLS, a fresh Paillier key), as ``user local`` does;
``dpca.sklearn`` has a scikit-learn estimator and a synthesizer over it.
"""

from ._native import StudyError
from ._study import StudyResult, bundled_bounds, bundled_data, local_study

__all__ = [
    "StudyError",
    "StudyResult",
    "bundled_bounds",
    "bundled_data",
    "local_study",
]
