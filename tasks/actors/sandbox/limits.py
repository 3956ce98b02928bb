"""What a run may use: `Limits`, checked when made (the package docstring says how the
jail enforces each)."""

from __future__ import annotations

import dataclasses
import math
import numbers

MIN_MEMORY_MB = 32  # the interpreter alone maps about 12 MB


@dataclasses.dataclass(frozen=True)
class Limits:
    cpu_s: float = 1  # CPU seconds of the whole process tree; fractions are enforced to ~50 ms
    wall_s: float = 2.0
    memory_mb: int = 128
    output_bytes: int = 4096
    processes: int = 16  # processes and threads at once, the first included

    def __post_init__(self):
        for name in ("cpu_s", "wall_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        for name in ("memory_mb", "output_bytes", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
        for name in ("cpu_s", "wall_s", "memory_mb", "output_bytes", "processes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.memory_mb < MIN_MEMORY_MB:
            raise ValueError(f"memory_mb must be at least {MIN_MEMORY_MB} (the interpreter alone needs ~12 MB), "
                             f"got {self.memory_mb}")
