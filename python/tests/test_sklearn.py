"""The scikit-learn estimator and the synthesizer over local_study."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.decomposition import PCA
from sklearn.utils.estimator_checks import parametrize_with_checks

import dpca
from dpca.sklearn import DistributedPCA, PCAGaussSynthesizer, PrivacyLeakWarning


def low_rank(n=400, m=6, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)) @ rng.normal(size=(2, m)) + 0.1 * rng.normal(size=(n, m))
    return np.clip(x, -4, 4)


def test_without_noise_the_estimator_is_scikit_learns_pca():
    x = low_rank()
    # Same bounds for every feature and C large enough that no row is clipped: the
    # study's PCA is PCA of x scaled by one constant.
    est = DistributedPCA(
        n_components=3, bounds=(-4, 4), owners=4, row_norm_bound=10.0,
        noise_free_for_testing=True,
    ).fit(x)
    ref = PCA(n_components=3).fit(x)
    signs = np.sign(np.sum(est.components_ * ref.components_, axis=1))
    np.testing.assert_allclose(est.components_ * signs[:, None], ref.components_, atol=1e-4)
    np.testing.assert_allclose(est.mean_, ref.mean_, atol=1e-4)
    scale = 2.0 / 8.0
    # explained_variance_ is S/N in the normalized units; scikit-learn's divides by N - 1.
    n = len(x)
    np.testing.assert_allclose(
        est.explained_variance_, ref.explained_variance_ * scale**2 * (n - 1) / n, rtol=1e-4
    )
    np.testing.assert_allclose(est.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-4)
    z = est.transform(x)
    np.testing.assert_allclose(z * signs, ref.transform(x) * scale, atol=1e-4)
    np.testing.assert_allclose(est.inverse_transform(z), ref.inverse_transform(ref.transform(x)), atol=1e-3)


def test_a_frame_keeps_its_feature_names_and_missing_bounds_are_chosen_privately():
    frame = pd.DataFrame(low_rank(200, 4), columns=["a", "b", "c", "d"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        est = DistributedPCA(n_components=2, owners=2).fit(frame)
    # Nothing was read off the data: a marginal study chose every feature's
    # bounds, and the record says how.
    assert est.study_.study["bounds_from_data"] is False
    chosen = est.study_.study["bounds_choice"]["scaling"]["features"]
    assert len(chosen) == 4
    for c, b in zip(chosen, est.study_.study["bounds"]):
        assert b == pytest.approx([c["center"] - c["scale"], c["center"] + c["scale"]])
    assert list(est.feature_names_in_) == ["a", "b", "c", "d"]
    assert est.transform(frame).shape == (200, 2)
    with pytest.raises(ValueError, match="features"):
        est.transform(frame.iloc[:, :3].to_numpy())


def test_bounds_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="one per feature"):
        DistributedPCA(bounds=[(0, 1), (0, 1)]).fit(low_rank(50, 3))


def test_the_synthesizer_samples_rows_in_the_frames_shape():
    frame = pd.DataFrame(low_rank(300, 4), columns=["a", "b", "c", "d"]).astype("float32")
    frame["n"] = (frame["a"] * 10).round().astype("int32")
    synth = PCAGaussSynthesizer.create(
        "pca-gauss", epsilon=1.0, bounds={"*": (-4, 4), "n": (-40, 40)}, k=2, owners=3,
        key_bits=2048, max_rows=500,
    )
    rows = synth.fit_sample(frame)
    assert rows.shape == frame.shape
    assert rows.dtypes.to_dict() == frame.dtypes.to_dict()
    more = synth.sample(200)
    assert len(more) == 200
    with pytest.raises(ValueError, match="left"):
        synth.sample(1)


# scikit-learn's own checks: every fit below is a whole study (2048-bit key, two
# owner processes), without noise so that results can be compared across fits.
@parametrize_with_checks(
    [DistributedPCA(n_components=1, owners=2, noise_free_for_testing=True)],
    expected_failed_checks=lambda est: {},
)
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        warnings.simplefilter("ignore", dpca.NoiseFreeWarning)
        check(estimator)


def test_fit_on_parts_gives_each_owner_its_own_rows():
    x = low_rank(300, 5)
    parts = [x[:40], x[40:250], x[250:]]
    est = DistributedPCA(
        n_components=2, bounds=(-4, 4), row_norm_bound=10.0, noise_free_for_testing=True
    ).fit(parts)
    assert est.study_.study["owner_rows"] == [40, 210, 50]
    whole = DistributedPCA(
        n_components=2, bounds=(-4, 4), owners=3, row_norm_bound=10.0, noise_free_for_testing=True
    ).fit(x)
    # Without noise the pooled sums are the same however the rows are dealt.
    np.testing.assert_allclose(est.components_, whole.components_, atol=1e-9)
    with pytest.raises(ValueError, match="features"):
        DistributedPCA(bounds=(-4, 4)).fit([x[:10], x[10:20, :4]])
