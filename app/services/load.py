"""Latency and throughput under load, from this machine's measured batching speeds: how many
requests of the longest length memory can hold at once, then the simulated load points.
``fitscope load`` and the window's Load tab both call ``simulate_load``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.adapters.batch_probe import BatchProfile
from app.core.speed.loadsim import Lengths, LoadResult, ServiceModel, sweep, sweep_rates


@dataclass(frozen=True)
class LoadSimulation:
    max_slots: int  # slots of the longest request the memory holds (llama-server's -np cap)
    points: tuple[LoadResult, ...]


def simulate_load(
    profile: BatchProfile,
    slots_for: Callable[[int], int],
    *,
    prompt: Lengths | int,
    output: Lengths | int,
    longest_tokens: int,
    slots: int,
    n_requests: int,
    users: Sequence[int] = (),
    rates: Sequence[float] = (),
    think_time_s: float = 0.0,
) -> LoadSimulation:
    """The load points for ``users`` (closed loop, with ``think_time_s`` between a user's requests)
    or, when given, arrival ``rates`` in requests/s (open loop). ``slots_for(tokens)`` says how many
    slots of ``tokens`` fit in memory (the estimator, reading the model file: this is the slow part)."""
    max_slots = slots_for(longest_tokens)
    service = ServiceModel.from_timings(profile)
    cap = max(max_slots, 1)
    if rates:
        points = sweep_rates(
            service, rates, prompt=prompt, output=output, slots=slots, max_slots=cap, n_requests=n_requests
        )
    else:
        points = sweep(
            service,
            users,
            think_time_s=think_time_s,
            prompt=prompt,
            output=output,
            slots=slots,
            max_slots=cap,
            n_requests=n_requests,
        )
    return LoadSimulation(max_slots, tuple(points))
