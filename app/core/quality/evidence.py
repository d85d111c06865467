"""How sure a comparison of pass rates can be: intervals, a paired test, and the prompts needed.

With ten prompts, 80% against 70% is one prompt: noise. A pass rate gets a Wilson score interval
(95%); two variants answered the same prompts, so they are compared with McNemar's exact test on
the prompts where they disagree; when the test cannot tell them apart, the number of prompts a
difference of that size would need (80% power, 5% two-sided; Connor's formula for paired
proportions) says how much more evidence it takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959964
Z_POWER_80 = 0.841621


def wilson_interval(passed: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The 95% Wilson score interval of a pass rate (0..1); (0, 1) when nothing was checked."""
    if n <= 0:
        return 0.0, 1.0
    p = passed / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: prompts only A passed, and only B."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def prompts_needed(only_a: int, only_b: int, n: int) -> int | None:
    """Prompts a paired comparison needs to show a difference of the size seen (80% power, 5%
    two-sided); None when no difference was seen at all."""
    if n <= 0 or only_a == only_b:
        return None
    discordant = (only_a + only_b) / n
    delta = abs(only_a - only_b) / n
    root = Z_95 * math.sqrt(discordant) + Z_POWER_80 * math.sqrt(max(discordant - delta * delta, 0.0))
    return math.ceil((root / delta) ** 2)


@dataclass(frozen=True)
class PairedVerdict:
    """Whether two variants' results on the same prompts differ beyond chance."""

    n: int
    only_a: int
    only_b: int
    p_value: float

    @property
    def distinguishable(self) -> bool:
        return self.p_value < 0.05

    def sentence(self, a: str, b: str) -> str:
        if self.distinguishable:
            better = a if self.only_a > self.only_b else b
            return f"{better} is better than {b if better == a else a} beyond chance (p = {self.p_value:.3f})."
        needed = prompts_needed(self.only_a, self.only_b, self.n)
        about = (
            f"; about {needed:,} prompts would be needed to tell a difference of this size"
            if needed
            else "; they passed and failed the same prompts"
        )
        return f"{a} and {b} are not distinguishable with {self.n} prompts (p = {self.p_value:.2f}){about}."


def paired(results_a: dict[str, bool], results_b: dict[str, bool]) -> PairedVerdict:
    """McNemar on the prompts both variants answered (prompt id -> passed)."""
    common = results_a.keys() & results_b.keys()
    only_a = sum(1 for k in common if results_a[k] and not results_b[k])
    only_b = sum(1 for k in common if results_b[k] and not results_a[k])
    return PairedVerdict(len(common), only_a, only_b, mcnemar_p(only_a, only_b))
