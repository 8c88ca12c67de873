"""The README's optdigits figures, reproduced from Python.

Two private studies at epsilon 1 on the bundled optdigits table, each through the
real protocol (10 owner processes, a proxy, mutual TLS on loopback):

1. the captured variance tr(V_k^T S V_k) / tr(U_k^T S U_k) of the k = 10 private
   components V_k against the exact ones U_k, S the scatter of the normalized,
   clipped rows (the command line's figure: 0.900, sd 0.009, from
   `cargo run --release -p dpca-bench --bin utility -- --epsilons 1`);
2. the accuracy of a logistic regression trained on PCA-Gauss synthetic rows (k = 20,
   a seeded 80/20 split) and scored on the real held-out rows (the command line's
   figures: 0.901 over 10 repetitions, 0.914 in the README's run, against 0.956
   for the real training rows).

Run: python examples/optdigits.py [--key-bits 3072]. It exits non-zero when a
figure falls outside the command line's, widened by its noise.
"""

import argparse
import sys

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

import dpca

CAPTURED, CAPTURED_SD = 0.900, 0.009
ACCURACY = 0.901


def normalized(frame: pd.DataFrame) -> np.ndarray:
    """The study's preprocessing: pixels in [0, 16] to [-1, 1], rows clipped to norm 1."""
    x = frame.to_numpy(dtype=float) / 8.0 - 1.0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, 1.0 / norms)


def captured_variance(table: pd.DataFrame, key_bits: int) -> float:
    result = dpca.local_study(
        table, label="label", bounds=dpca.bundled_bounds(), owners=10, k=10,
        epsilon=1.0, key_bits=key_bits,
    )
    x = normalized(table.drop(columns="label"))
    centered = x - x.mean(axis=0)
    s = centered.T @ centered
    v = result.components.to_numpy()
    u = np.linalg.eigh(s)[1][:, ::-1][:, :10]
    return float(np.trace(v.T @ s @ v) / np.trace(u.T @ s @ u))


def synthetic_accuracy(table: pd.DataFrame, key_bits: int):
    rng = np.random.default_rng(7)
    order = rng.permutation(len(table))
    cut = int(0.8 * len(table))
    train, test = table.iloc[order[:cut]], table.iloc[order[cut:]]
    result = dpca.local_study(
        train, label="label", bounds=dpca.bundled_bounds(), owners=10, k=20,
        epsilon=1.0, synthetic=len(train), task="classify", key_bits=key_bits,
    )

    # As the command line's scoring: every row (synthetic, real training, real test)
    # through the study's public preprocessing before the learner sees it.
    def score(rows: pd.DataFrame) -> float:
        model = LogisticRegression(max_iter=2000)
        model.fit(normalized(rows.drop(columns="label")), rows["label"])
        return float(model.score(normalized(test.drop(columns="label")), test["label"]))

    return score(result.synthetic), score(train), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key-bits", type=int, default=3072)
    args = parser.parse_args()
    table = pd.read_csv(dpca.bundled_data())
    captured = captured_variance(table, args.key_bits)
    accuracy, real, result = synthetic_accuracy(table, args.key_bits)
    print(f"captured variance, k = 10:  {captured:.3f}  (command line: {CAPTURED:.3f}, sd {CAPTURED_SD})")
    print(f"synthetic-trained accuracy: {accuracy:.3f}  (command line: {ACCURACY:.3f}); real rows: {real:.3f}")
    print(f"budget spent: epsilon {result.budget['epsilon']:.3f}, delta {result.budget['delta']:.2e}")
    ok = abs(captured - CAPTURED) <= 5 * CAPTURED_SD and abs(accuracy - ACCURACY) <= 0.05
    if not ok:
        print("a figure is outside the command line's, widened by its noise", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
