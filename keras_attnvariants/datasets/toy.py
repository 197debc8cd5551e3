"""Toy data from the papers."""

import numpy as np


def two_gaussian_clusters(seed=0):
    """DNAS paper Appendix E: 500 points around [1.8, 0.7] followed by 50
    around [-1, -1], covariance 0.1 I. Returns a `(550, 2)` float64 array."""
    rng = np.random.default_rng(seed)
    big = rng.normal([1.8, 0.7], np.sqrt(0.1), size=(500, 2))
    small = rng.normal([-1.0, -1.0], np.sqrt(0.1), size=(50, 2))
    return np.concatenate([big, small])


def self_attention_steps(points, normalize, steps=4):
    """`x <- A(x x^T) x` with Q = K = V = I, `steps` times (Appendix E).

    Returns the points before and after each step.
    """
    history = [points]
    for _ in range(steps):
        points = normalize(points @ points.T) @ points
        history.append(points)
    return history
