"""The digits example's data without scikit-learn's import (workers/examples/digits_ddp.py):
the rows read from the file scikit-learn ships, the split kept in digits_split.json, and the
scaling done in numpy are exactly what load_digits, train_test_split and StandardScaler give."""

import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from workers.examples import digits_ddp


def test_the_rows_are_load_digits_own() -> None:
    features, labels = digits_ddp.digits_rows()
    digits = load_digits()
    assert np.array_equal(features, digits.data) and features.dtype == digits.data.dtype
    assert np.array_equal(labels, digits.target) and labels.dtype == np.int64


def test_the_kept_split_and_the_scaling_are_scikit_learns() -> None:
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data,
        digits.target,
        test_size=digits_ddp.TEST_FRACTION,
        stratify=digits.target,
        random_state=digits_ddp.SPLIT_RANDOM_STATE,
    )
    scaler = StandardScaler().fit(x_train)
    data = digits_ddp.load_data()
    kept_x, kept_y = data.train.tensors
    assert np.array_equal(kept_x.numpy(), scaler.transform(x_train).astype(np.float32))
    assert np.array_equal(kept_y.numpy(), y_train)
    assert np.array_equal(data.test_x.numpy(), scaler.transform(x_test).astype(np.float32))
    assert np.array_equal(data.test_y.numpy(), y_test)


def test_without_the_shipped_file_it_loads_through_scikit_learn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(digits_ddp.importlib.util, "find_spec", lambda name: None)
    features, labels = digits_ddp.digits_rows()
    assert features.shape == (1797, 64) and labels.shape == (1797,)


def test_a_trainer_imports_no_scikit_learn() -> None:
    probe = (
        "import sys; import workers.examples.digits_ddp as d; d.load_data(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout
