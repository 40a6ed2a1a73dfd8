"""Peak resident memory of this process over a block of code, sampled from a background thread."""

from __future__ import annotations

import threading
import time

import psutil


class PeakRSS:
    """``with PeakRSS() as peak: ...`` then ``peak.growth`` is the largest RSS seen minus the RSS
    at entry, in bytes. Sampling every ``interval_s`` misses spikes shorter than that, so the
    figure is a lower bound on the true peak (a 2 ms interval catches anything that lives as long
    as parsing a megabyte takes)."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self._process = psutil.Process()
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start
