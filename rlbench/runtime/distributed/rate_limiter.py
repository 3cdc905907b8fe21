"""Samples-per-insert rate limiting with Reverb's semantics (SampleToInsertRatio).

Inserts may run ahead of samples, and samples ahead of inserts, by at most `error_buffer` sampled
items around the target ratio; sampling waits until `min_size_to_sample` items are stored. Holding
the ratio fixed makes runs with different transports and memories do the same algorithmic work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RateLimiter:
    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float
    inserts: int = 0
    samples: int = 0  # sampled items (a batch of B counts B)

    def __post_init__(self) -> None:
        if self.samples_per_insert <= 0:
            raise ValueError("samples_per_insert must be positive")
        if self.error_buffer < 0:
            raise ValueError("error_buffer must be >= 0")
        offset = self.min_size_to_sample * self.samples_per_insert
        self.min_diff = offset - self.error_buffer
        self.max_diff = offset + self.error_buffer

    def _diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int = 1) -> bool:
        """False when the inserters are too far ahead of the samplers."""
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int, size: int) -> bool:
        return size >= self.min_size_to_sample and self._diff() - n >= self.min_diff

    def inserted(self, n: int) -> None:
        self.inserts += n

    def sampled(self, n: int) -> None:
        self.samples += n

    @property
    def insert_lead(self) -> float:
        """Transitions inserts may run ahead of the ratio before they are held: the slack."""
        return self.error_buffer / self.samples_per_insert

    def achieved(self) -> float:
        return self.samples / self.inserts if self.inserts else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"samples_per_insert_target": self.samples_per_insert, "samples_per_insert_achieved": self.achieved(),
                "min_size_to_sample": self.min_size_to_sample, "error_buffer": self.error_buffer,
                "inserts": self.inserts, "samples": self.samples}
