"""Confidence intervals for evaluation metrics: pure functions of counts or per-episode values.

All intervals are two-sided at 95% by default (``z = Z95``, the 0.975 quantile of the standard normal, 1.96).
Each function returns an :class:`Interval` ``(estimate, low, high)``; undefined quantities are ``nan``
(a rate over zero trials, a standard deviation of fewer than two values).

Which interval for which metric (``ragen.evaluation.report``):

* rates (success, format): :func:`wilson_interval`; good coverage at any n and near 0 or 1, where the Wald
  interval ``p +- z*sqrt(p(1-p)/n)`` collapses to a point;
* means (episode reward, turns): :func:`mean_interval`, the normal interval ``mean +- z*s/sqrt(n)``;
* difference of two rates: :func:`newcombe_difference`, Newcombe's hybrid score interval for two independent
  proportions, built from the two Wilson intervals;
* difference of two means over the same episodes (shared seeds): :func:`paired_difference`, the normal interval
  of the mean per-episode difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054


class Interval(NamedTuple):
    """A point estimate and its confidence interval ``[low, high]``."""

    estimate: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        """True when ``low <= value <= high`` (False when the bounds are undefined)."""
        return self.low <= value <= self.high


def wilson_interval(successes: int, n: int, z: float = Z95) -> Interval:
    """Wilson score interval of a binomial proportion ``p = successes / n`` (Wilson 1927).

    ``center = (p + z^2/(2n)) / (1 + z^2/n)`` and
    ``half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/(4n^2))``; the interval is ``center +- half``.
    Written in counts, ``(k + z^2/2) / (n + z^2) +- z / (n + z^2) * sqrt(k(n-k)/n + z^2/4)``, which at n = 0
    gives the uninformative ``[0, 1]`` (the estimate is then ``nan``). Bounds are clipped to ``[0, 1]`` against
    rounding. Example: 8/10 -> [0.4902, 0.9433]; 0/10 -> [0, 0.2775].
    """
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"wilson_interval needs 0 <= successes <= n, got successes={successes}, n={n}")
    z2 = z * z
    spread = successes * (n - successes) / n if n > 0 else 0.0
    center = (successes + z2 / 2) / (n + z2)
    half = z / (n + z2) * math.sqrt(spread + z2 / 4)
    estimate = successes / n if n > 0 else math.nan
    return Interval(estimate, max(0.0, center - half), min(1.0, center + half))


def mean_interval(values: Sequence[float], z: float = Z95) -> Interval:
    """Normal interval of a mean: ``mean +- z * s / sqrt(n)`` with the sample standard deviation ``s`` (n - 1).

    The central limit theorem makes it fit for sums of bounded per-episode quantities at the n used here
    (tens to hundreds of episodes). Fewer than two values leave ``s`` undefined: the bounds are ``nan``.
    Example: [1, 2, 3, 4] -> mean 2.5, s = 1.2910, interval [1.2348, 3.7652].
    """
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    mean = math.fsum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan)
    s = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = z * s / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def sample_std(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator); ``nan`` for fewer than two values."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def newcombe_difference(successes_1: int, n_1: int, successes_2: int, n_2: int, z: float = Z95) -> Interval:
    """Interval for ``p2 - p1`` of two independent proportions: Newcombe's hybrid score interval.

    Newcombe (1998), "Interval estimation for the difference between independent proportions: comparison of
    eleven methods", Statistics in Medicine 17:873-890, method 10. With the Wilson intervals ``[l_i, u_i]`` of
    ``p_i`` and ``d = p2 - p1``::

        low  = d - sqrt((p2 - l2)^2 + (u1 - p1)^2)
        high = d + sqrt((u2 - p2)^2 + (p1 - l1)^2)

    It stays inside [-1, 1], is never a single point, and behaves well near 0 and 1. Used for success and format
    rates although the two models play the same seeds: treating the samples as independent ignores their positive
    correlation, so the interval is conservative (wider than a paired one), and the format rate is over turns,
    which do not pair up between models. Newcombe's example: 56/70 vs 48/80 -> p1 - p2 = 0.2, [0.0524, 0.3339].
    """
    p1, l1, u1 = wilson_interval(successes_1, n_1, z)
    p2, l2, u2 = wilson_interval(successes_2, n_2, z)
    d = p2 - p1
    return Interval(d, d - math.hypot(p2 - l2, u1 - p1), d + math.hypot(u2 - p2, p1 - l1))


def paired_difference(values_1: Sequence[float], values_2: Sequence[float], z: float = Z95) -> Interval:
    """Interval for the mean of ``values_2[i] - values_1[i]``: :func:`mean_interval` of the paired differences.

    For two models evaluated on the same episodes (same env seeds, position i = seed i), the per-episode
    difference removes the variance the episodes themselves contribute (hard vs easy seeds), so the interval is
    tighter than one for two independent means. Identical values give ``[0, 0]``.
    """
    if len(values_1) != len(values_2):
        raise ValueError(f"paired_difference needs equally many values, got {len(values_1)} and {len(values_2)}")
    return mean_interval([b - a for a, b in zip(values_1, values_2, strict=True)], z)
