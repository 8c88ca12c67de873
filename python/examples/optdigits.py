"""The README's optdigits example, checked.

The README's call, on a seeded 80/20 split of the bundled optdigits table, through
the real protocol (10 owner processes, a proxy, mutual TLS on loopback), at
epsilon 1: once with the public bounds 0..16 as the README gives them, once with no
bounds at all (every feature's bounds then chosen privately). C is chosen
privately in both. For each, the synthetic digits must be usable and look like
digits:

- a logistic regression trained on the synthetic rows reaches at least 85% of the
  accuracy of one trained on the real rows, on the real held-out rows (both on
  the pixel counts over 16, so a classifier sees what a person would);
- the synthetic pixels' spread (their standard deviation over every pixel of
  every row) is within a factor 2 of the real one (grey digits, all pixels near
  the mean, fail it).

Run: python examples/optdigits.py [--key-bits 3072]. It exits non-zero when a
check fails.
"""

import argparse
import sys

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

import dpca

ACCURACY_OF_REAL = 0.85
SPREAD_FACTOR = 2.0


def accuracy(train: pd.DataFrame, test: pd.DataFrame) -> float:
    """Logistic regression on the pixel counts over 16, scored on `test`."""
    model = LogisticRegression(max_iter=2000)
    model.fit(train.drop(columns="label").to_numpy(dtype=float) / 16.0, train["label"])
    return float(model.score(test.drop(columns="label").to_numpy(dtype=float) / 16.0, test["label"]))


def spread(frame: pd.DataFrame) -> float:
    return float(frame.drop(columns="label").to_numpy(dtype=float).std())


def check(name: str, synthetic: pd.DataFrame, train: pd.DataFrame, test: pd.DataFrame) -> bool:
    real_acc, synth_acc = accuracy(train, test), accuracy(synthetic, test)
    real_sd, synth_sd = spread(train), spread(synthetic)
    ok = synth_acc >= ACCURACY_OF_REAL * real_acc and 1 / SPREAD_FACTOR <= synth_sd / real_sd <= SPREAD_FACTOR
    print(
        f"{name}: synthetic-trained accuracy {synth_acc:.3f} ({synth_acc / real_acc:.2f} of the real rows' "
        f"{real_acc:.3f}); pixel spread {synth_sd:.2f} against {real_sd:.2f} ({synth_sd / real_sd:.2f}x)"
        f"{'' if ok else '  <- FAILS'}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key-bits", type=int, default=3072)
    args = parser.parse_args()
    df = pd.read_csv(dpca.bundled_data())
    order = np.random.default_rng(7).permutation(len(df))
    cut = int(0.8 * len(df))
    train, test = df.iloc[order[:cut]], df.iloc[order[cut:]]
    ok = True
    for name, bounds in [("public bounds 0..16", {"*": (0, 16)}), ("no bounds (chosen privately)", None)]:
        # The README's call.
        result = dpca.local_study(
            train, label="label", bounds=bounds, owners=10, k=10, epsilon=1.0,
            synthetic=len(train), task="classify", classes=[str(d) for d in range(10)],
            key_bits=args.key_bits,
        )
        ok &= check(name, result.synthetic, train, test)
        print(f"  C = {result.study['row_norm_bound']:.3f}; epsilon {result.budget['epsilon']:.3f} in all")
    if not ok:
        print("a check failed", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
