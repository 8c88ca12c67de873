"""Private distributed PCA and differentially private synthetic data, from pandas.

``local_study`` runs the whole protocol on this machine (owners and proxy as
processes over gRPC with mutual TLS, a fresh Paillier key), as ``user local`` does;
``Owner`` and ``Study`` are the deployed roles (an owner contributing a DataFrame
held in memory, a data user's study at a proxy elsewhere); ``dpca.sklearn`` has a
scikit-learn estimator and a synthesizer over ``local_study``.
"""

from ._native import StudyError
from ._roles import Owner, Study, Tls, dev_certs
from ._study import (
    ClippingWarning,
    NoiseFreeWarning,
    PrivacyLeakWarning,
    StudyResult,
    bundled_bounds,
    bundled_data,
    local_study,
)

__all__ = [
    "ClippingWarning",
    "NoiseFreeWarning",
    "Owner",
    "PrivacyLeakWarning",
    "Study",
    "StudyError",
    "StudyResult",
    "Tls",
    "bundled_bounds",
    "bundled_data",
    "dev_certs",
    "local_study",
]
