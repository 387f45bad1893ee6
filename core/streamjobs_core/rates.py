"""Offered load of generator sources: rate, cumulative count and its inverse.

Generators stamp record g at `time_of(g)` and pace emission by `count_at`, so
both must be pure functions of the profile: any worker, at any offset, and the
test oracle see the same times.
"""

from __future__ import annotations

import math

import numpy as np

from streamjobs_core.spec import RateProfile

# Cells per period of the sine inverse's lookup table, uniform in count: fine
# enough that, for periods up to about a day, one Newton step from the
# interpolated start meets _SINE_TOL_S except right next to zero-rate instants.
_SINE_CELLS = 16384
# Accepted error of the sine inverse (seconds): far below the 1 ms resolution of
# event times and far below the time between two consecutive records.
_SINE_TOL_S = 1e-9


class RateCurve:
    """Records per second (all partitions) against seconds since the job start."""

    def __init__(self, profile: RateProfile) -> None:
        self._profile = profile
        if profile.profile == "sine":
            self._init_sine(profile)
            return
        rate = profile.records_per_second
        if profile.profile == "constant":
            knots = [(0.0, rate)]
        elif profile.profile == "steps":
            knots = [(0.0, rate), *((step.at_s, step.records_per_second) for step in profile.steps)]
        else:
            end = profile.spike_at_s + profile.spike_duration_s
            knots = [(0.0, rate), (profile.spike_at_s, profile.spike_records_per_second), (end, rate)]
        # Segment i runs at _rates[i] from _starts[i]; zero-length segments (a
        # step at 0 s, equal atS) are harmless: side="right" lookups skip them.
        self._starts = np.array([t for t, _ in knots], dtype=np.float64)
        self._rates = np.array([r for _, r in knots], dtype=np.float64)
        self._counts = np.concatenate(([0.0], np.cumsum(self._rates[:-1] * np.diff(self._starts))))

    def _init_sine(self, profile: RateProfile) -> None:
        self._mean = profile.records_per_second
        self._amplitude = profile.amplitude
        self._period = profile.period_s
        self._omega = 2.0 * math.pi / profile.period_s
        self._per_period = self._mean * self._period
        r = np.linspace(0.0, self._per_period, _SINE_CELLS + 1)
        # The phase count exceeds mean*tau by between 0 and 2*amplitude/omega.
        lo = np.clip((r - 2.0 * self._amplitude / self._omega) / self._mean, 0.0, self._period)
        hi = np.clip(r / self._mean, 0.0, self._period)
        self._cell_times = self._sine_bisect(r, lo, hi)

    def rate_at(self, t_s: float) -> float:
        if t_s < 0:
            return 0.0
        if self._profile.profile == "sine":
            return self._mean + self._amplitude * math.sin(self._omega * t_s)
        return float(self._rates[np.searchsorted(self._starts, t_s, side="right") - 1])

    def count_at(self, t_s: float) -> float:
        t = max(t_s, 0.0)
        if self._profile.profile == "sine":
            # Whole periods contribute exactly mean*period; reducing the phase
            # keeps cos() accurate and matches the reduction in time_of.
            k = math.floor(t / self._period)
            return k * self._per_period + float(self._sine_phase_count(np.asarray(t - k * self._period)))
        i = np.searchsorted(self._starts, t, side="right") - 1
        return float(self._counts[i] + self._rates[i] * (t - self._starts[i]))

    def time_of(self, counts: np.ndarray) -> np.ndarray:
        c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
        if self._profile.profile == "sine":
            return self._sine_time_of(c)
        i = np.searchsorted(self._counts, c, side="right") - 1
        return self._starts[i] + (c - self._counts[i]) / self._rates[i]

    def _sine_phase_count(self, tau: np.ndarray) -> np.ndarray:
        return self._mean * tau + self._amplitude / self._omega * (1.0 - np.cos(self._omega * tau))

    def _sine_bisect(self, r: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        # 64 halvings take any bracket within a period down to the last ulp;
        # slow but sure where the rate nears zero and Newton's method stalls.
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            below = self._sine_phase_count(mid) < r
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return 0.5 * (lo + hi)

    def _sine_time_of(self, c: np.ndarray) -> np.ndarray:
        k = np.floor(c / self._per_period)
        r = c - k * self._per_period
        # Table cell j brackets the root (the count strictly increases, even
        # where the rate touches zero); interpolation gives a close start.
        u = r * (_SINE_CELLS / self._per_period)
        j = np.minimum(u.astype(np.intp), _SINE_CELLS - 1)
        lo, hi = self._cell_times[j], self._cell_times[j + 1]
        x = lo + (hi - lo) * (u - j)
        theta = self._omega * x
        cos = np.cos(theta)
        rate = self._mean + self._amplitude * np.sin(theta)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = (self._mean * x + self._amplitude / self._omega * (1.0 - cos) - r) / rate
            # Newton's error after a step is about f''/(2f') * step**2; the
            # factor 8 (not 1/2) covers the cubic shape next to a zero-rate
            # instant, where that estimate runs low by up to 6x.
            error = 8.0 * np.abs(self._amplitude * self._omega * cos) / rate * step**2
        x = x - step
        # NaN/inf (zero rate) compare False and so fall back to bisection too.
        unsure = ~((x >= lo) & (x <= hi) & (error <= _SINE_TOL_S))
        if unsure.any():
            x[unsure] = self._sine_bisect(r[unsure], lo[unsure], hi[unsure])
        return k * self._period + x
