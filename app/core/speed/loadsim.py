"""Latency under load: a discrete-event simulation of a llama-server-like endpoint, driven by the
step timings measured on this machine (``app.adapters.batch_probe``). Pure Python.

Units: times in seconds, rates in tokens (or requests) per second, lengths in tokens.

What is modelled (llama.cpp's ``tools/server``, ``update_slots``):

- The server has ``slots`` parallel sequences (``-np``); memory may allow fewer (``max_slots``,
  from the estimator's KV cache per slot), in which case the result says so.
- Requests wait in one FIFO queue and are admitted to a free slot at the next step boundary
  (the server picks new tasks up between two ``llama_decode`` calls).
- **Continuous batching** (``batching=True``): every step is one ``llama_decode`` call. The batch
  holds first one token for every slot that is generating, then prompt tokens of the slots still
  prefilling, in admission order, until ``n_batch`` tokens. So a new prompt does not pause the
  others: it *lengthens* the step they share, exactly as the server mixes prompt chunks into the
  decode batch. A slot whose last prompt token is in a batch gets its first token from that batch's
  logits; every later token costs one step.
- **No batching** (``batching=False``): one request at a time, FIFO (the server with ``-np 1``).

Cost of one step with ``d`` generating sequences and ``p`` prompt tokens (:meth:`ServiceModel.batch_s`):

- ``p == 0``: ``step(d)``, the measured decode step time for ``d`` sequences, interpolated linearly
  between measured points and extrapolated beyond them with the least-squares slope of all points
  (one point: a constant step, the memory-bound case).
- ``p > 0``: a batch reads the weights once, so its cost is that of a decode step plus the marginal
  cost of each extra token: ``step(max(d, 1)) + (p - [d == 0]) * c``, where
  ``c = (prefill_s - step(1)) / (n - 1)`` is derived from the one-sequence prefill of ``n`` tokens
  (so a lone prompt of the measured length costs exactly the measured prefill). Without the
  measured length the rule falls back to ``step(d) + p / prefill_rate``, which counts the fixed
  per-call cost once per prompt and overestimates batched prefills.

Definitions: time to first token (TTFT) runs from arrival to the end of the step that processed the
prompt's last token (its logits give the first token); end-to-end latency from arrival to the last
token; queue wait from arrival to admission into a slot. Throughput counts generated tokens over the
span from the first arrival to the last completion.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import Field, model_validator

from app.core.common.units import Frozen
from app.core.speed.measure import percentile

__all__ = [
    "BatchTimings",
    "ClosedLoop",
    "Lengths",
    "LoadResult",
    "Poisson",
    "ServiceModel",
    "Trace",
    "simulate",
    "sweep",
    "sweep_rates",
]

_EPS = 1e-12




class BatchTimings(Protocol):
    """What the simulation needs from a measurement (``BatchProfile`` has it)."""

    @property
    def prefill_tokens_per_s(self) -> float: ...

    @property
    def decode_step_s(self) -> Mapping[int, float]: ...

    @property
    def prompt_tokens(self) -> int: ...


class ServiceModel(Frozen):
    """How long one ``llama_decode`` step takes, from single-step measurements (see the module doc)."""

    prefill_tokens_per_s: float = Field(gt=0, description="one sequence's prompt processed in one batch")
    decode_step_s: dict[int, float] = Field(description="sequences advanced together -> seconds per step")
    prefill_measured_tokens: int | None = Field(
        default=None,
        ge=1,
        description="prompt length the prefill rate was measured at; enables the fixed+marginal split",
    )
    n_batch: int = Field(default=2048, ge=1, description="tokens per llama_decode call, as llama-server's -b")

    @model_validator(mode="after")
    def _check_points(self) -> ServiceModel:
        if not self.decode_step_s:
            raise ValueError("decode_step_s needs at least one measured point")
        for n, s in self.decode_step_s.items():
            if n < 1 or not s > 0:
                raise ValueError(f"decode step points need n >= 1 and a positive time (got {n}: {s})")
        return self

    @classmethod
    def from_timings(cls, timings: BatchTimings, *, n_batch: int = 2048) -> ServiceModel:
        """The model for a measurement's single-step timings and prefill rate (nothing end-to-end)."""
        return cls(
            prefill_tokens_per_s=timings.prefill_tokens_per_s,
            decode_step_s=dict(timings.decode_step_s),
            prefill_measured_tokens=timings.prompt_tokens,
            n_batch=n_batch,
        )

    @property
    def slope_s(self) -> float:
        """Least-squares seconds per extra sequence in a decode step (0 for one point; never negative)."""
        pts = sorted(self.decode_step_s.items())
        if len(pts) < 2:
            return 0.0
        mx = sum(n for n, _ in pts) / len(pts)
        my = sum(s for _, s in pts) / len(pts)
        var = sum((n - mx) ** 2 for n, _ in pts)
        cov = sum((n - mx) * (s - my) for n, s in pts)
        return max(cov / var, 0.0)

    def step_s(self, n_seqs: int) -> float:
        """One decode step advancing ``n_seqs`` sequences by a token each (0 sequences: no step)."""
        if n_seqs <= 0:
            return 0.0
        pts = sorted(self.decode_step_s.items())
        lo_n, lo_s = pts[0]
        hi_n, hi_s = pts[-1]
        if n_seqs >= hi_n:
            return hi_s + self.slope_s * (n_seqs - hi_n)
        if n_seqs <= lo_n:
            # Below the measured points: a smaller batch never costs less per sequence than the smallest measured.
            return max(lo_s - self.slope_s * (lo_n - n_seqs), lo_s * n_seqs / lo_n)
        for (n0, s0), (n1, s1) in zip(pts, pts[1:], strict=False):
            if n0 <= n_seqs <= n1:
                return s0 + (s1 - s0) * (n_seqs - n0) / (n1 - n0)
        raise AssertionError("unreachable")

    @property
    def prefill_token_s(self) -> float | None:
        """Marginal seconds per prompt token in a batch, or None when the fixed+marginal split is off."""
        n = self.prefill_measured_tokens
        if n is None or n < 2:
            return None
        marginal = (n / self.prefill_tokens_per_s - self.step_s(1)) / (n - 1)
        return marginal if marginal > 0 else None

    def batch_s(self, n_decode: int, n_prompt: int) -> float:
        """One ``llama_decode`` with ``n_decode`` generating sequences and ``n_prompt`` prompt tokens."""
        if n_prompt <= 0:
            return self.step_s(n_decode)
        marginal = self.prefill_token_s
        if marginal is None:
            return self.step_s(n_decode) + n_prompt / self.prefill_tokens_per_s
        return self.step_s(max(n_decode, 1)) + (n_prompt - (0 if n_decode else 1)) * marginal


class Lengths(Frozen):
    """A token-length distribution: ``fixed`` (values[0]), ``uniform`` (values[0]..values[1] inclusive)
    or ``choice`` (one of values, uniformly)."""

    kind: Literal["fixed", "uniform", "choice"]
    values: tuple[int, ...]

    @model_validator(mode="after")
    def _check(self) -> Lengths:
        need = {"fixed": 1, "uniform": 2}.get(self.kind)
        if need is not None and len(self.values) != need:
            raise ValueError(f"{self.kind} lengths need {need} value(s), got {len(self.values)}")
        if not self.values or min(self.values) < 1:
            raise ValueError("lengths must be at least 1 token")
        if self.kind == "uniform" and self.values[0] > self.values[1]:
            raise ValueError(f"uniform range is empty: {self.values[0]}..{self.values[1]}")
        return self

    @classmethod
    def fixed(cls, n: int) -> Lengths:
        return cls(kind="fixed", values=(n,))

    @classmethod
    def uniform(cls, lo: int, hi: int) -> Lengths:
        return cls(kind="uniform", values=(lo, hi))

    @classmethod
    def choice(cls, values: Sequence[int]) -> Lengths:
        return cls(kind="choice", values=tuple(values))

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.values[0]
        if self.kind == "uniform":
            return rng.randint(self.values[0], self.values[1])
        return rng.choice(self.values)

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.values[0] + self.values[1]) / 2
        return sum(self.values) / len(self.values)


class Poisson(Frozen):
    """Open loop: requests arrive independently at ``rate_per_s`` on average."""

    rate_per_s: float = Field(gt=0)


class ClosedLoop(Frozen):
    """``users`` clients, each sending its next request ``think_time_s`` after the previous one finished."""

    users: int = Field(ge=1)
    think_time_s: float = Field(default=0.0, ge=0)


class Trace(Frozen):
    """Replay: the given requests, each ``(arrival s, prompt tokens, output tokens)``; the length
    distributions and ``n_requests`` of :func:`simulate` do not apply."""

    requests: tuple[tuple[float, int, int], ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Trace:
        for at, n_prompt, n_out in self.requests:
            if at < 0 or n_prompt < 1 or n_out < 1:
                raise ValueError(f"a request needs a time >= 0 and lengths >= 1 (got {at}, {n_prompt}, {n_out})")
        return self


class LoadResult(Frozen):
    """What one simulated load point gives. Times in seconds."""

    batching: bool
    users: int | None = Field(description="closed loop: concurrent users")
    rate_per_s: float | None = Field(description="open loop: mean arrival rate, requests/s")
    think_time_s: float = 0.0
    slots_requested: int
    slots: int = Field(description="parallel sequences actually used")
    slots_capped_by_memory: bool
    n_requests: int
    duration_s: float
    tokens_per_s: float = Field(description="generated tokens / duration")
    requests_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_mean_s: float
    e2e_p50_s: float
    e2e_p95_s: float
    e2e_mean_s: float
    queue_wait_p50_s: float
    queue_wait_p95_s: float
    mean_active_slots: float = Field(description="time-averaged slots holding a request")
    notes: tuple[str, ...] = ()


@dataclass(slots=True)
class _Request:
    arrival: float
    prompt: int
    output: int
    user: int
    admitted: float = 0.0
    first: float = 0.0
    done: float = 0.0


@dataclass(slots=True)
class _Slot:
    req: _Request
    prompt_left: int
    out_left: int
    take: int = 0  # prompt tokens in the current step
    generating: bool = False


def _as_lengths(value: Lengths | int) -> Lengths:
    return value if isinstance(value, Lengths) else Lengths.fixed(value)


def simulate(
    service: ServiceModel,
    arrivals: Poisson | ClosedLoop | Trace,
    *,
    prompt: Lengths | int = 256,
    output: Lengths | int = 128,
    slots: int = 4,
    max_slots: int | None = None,
    batching: bool = True,
    n_requests: int = 500,
    seed: int = 0,
) -> LoadResult:
    """Simulate ``n_requests`` requests through the endpoint and return the latency and throughput
    figures. The same arguments always give the same result."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1 (got {slots})")
    if n_requests < 1:
        raise ValueError(f"n_requests must be at least 1 (got {n_requests})")
    prompt_d, output_d = _as_lengths(prompt), _as_lengths(output)
    notes: list[str] = []
    capped = max_slots is not None and slots > max_slots
    usable = min(slots, max_slots) if max_slots is not None else slots
    if max_slots is not None and max_slots < 1:
        raise ValueError("the KV cache does not hold even one slot (max_slots < 1)")
    if capped:
        notes.append(f"memory holds the KV cache of {usable} slot(s), not the {slots} asked for")
    n_slots = usable if batching else 1
    if n_slots > service.n_batch:
        raise ValueError(f"{n_slots} slots cannot all decode in a batch of {service.n_batch} tokens")
    # Step times by number of generating sequences, looked up instead of recomputed per event.
    step_table = [service.step_s(n) for n in range(n_slots + 1)]

    rng = random.Random(seed)
    pending: list[tuple[float, int, _Request]] = []
    issued = 0

    def issue(at: float, user: int, lengths: tuple[int, int] | None = None) -> None:
        nonlocal issued
        n_prompt, n_out = lengths or (prompt_d.sample(rng), output_d.sample(rng))
        heapq.heappush(pending, (at, issued, _Request(at, n_prompt, n_out, user)))
        issued += 1

    think = 0.0
    if isinstance(arrivals, Trace):
        n_requests = len(arrivals.requests)
        for at, n_prompt, n_out in arrivals.requests:
            issue(at, -1, (n_prompt, n_out))
    elif isinstance(arrivals, Poisson):
        at = 0.0
        for _ in range(n_requests):
            issue(at, -1)
            at += rng.expovariate(arrivals.rate_per_s)
    else:
        for user in range(min(arrivals.users, n_requests)):
            issue(0.0, user)
        think = arrivals.think_time_s
    closed = isinstance(arrivals, ClosedLoop)

    queue: deque[_Request] = deque()
    active: list[_Slot] = []
    finished: list[_Request] = []
    t = 0.0
    busy = 0.0
    while len(finished) < n_requests:
        while pending and pending[0][0] <= t + _EPS:
            queue.append(heapq.heappop(pending)[2])
        while queue and len(active) < n_slots:
            req = queue.popleft()
            req.admitted = t
            active.append(_Slot(req, req.prompt, req.output))
        if not active:
            if not pending:  # cannot happen: every request is issued before the last one finishes
                break
            t = pending[0][0]
            continue

        n_gen = 0
        for s in active:
            if s.generating:
                n_gen += 1
        budget = service.n_batch - n_gen
        n_prompt = 0
        for s in active:
            s.take = 0
            if not s.generating and budget > 0:
                s.take = min(s.prompt_left, budget)
                budget -= s.take
                n_prompt += s.take
        if n_prompt:
            dt = service.batch_s(n_gen, n_prompt)
            k = 1
        else:
            # Only decoding: the batch stays the same until a sequence finishes or a waiting
            # request can take a free slot, so jump over those identical steps at once.
            dt = step_table[n_gen]
            k = min(s.out_left for s in active if s.generating)
            if pending and len(active) < n_slots:
                k = min(k, max(1, math.ceil((pending[0][0] - t) / dt - 1e-9)))
        span = k * dt
        busy += len(active) * span
        t += span

        still: list[_Slot] = []
        for s in active:
            if s.generating:
                s.out_left -= k
            elif s.take:
                s.prompt_left -= s.take
                if s.prompt_left == 0:
                    s.req.first = t
                    s.out_left -= 1
                    s.generating = True
            if s.generating and s.out_left == 0:
                s.req.done = t
                finished.append(s.req)
                if closed and issued < n_requests:
                    issue(t + think, s.req.user)
            else:
                still.append(s)
        active = still

    start = min(r.arrival for r in finished)
    end = max(r.done for r in finished)
    duration = max(end - start, _EPS)
    ttft = [r.first - r.arrival for r in finished]
    e2e = [r.done - r.arrival for r in finished]
    wait = [r.admitted - r.arrival for r in finished]
    generated = sum(r.output for r in finished)

    def pct(values: list[float], q: float) -> float:
        value = percentile(values, q)
        return 0.0 if value is None else value

    return LoadResult(
        batching=batching,
        users=arrivals.users if isinstance(arrivals, ClosedLoop) else None,
        rate_per_s=arrivals.rate_per_s if isinstance(arrivals, Poisson) else None,
        think_time_s=think,
        slots_requested=slots,
        slots=n_slots,
        slots_capped_by_memory=capped,
        n_requests=len(finished),
        duration_s=duration,
        tokens_per_s=generated / duration,
        requests_per_s=len(finished) / duration,
        ttft_p50_s=pct(ttft, 0.50),
        ttft_p95_s=pct(ttft, 0.95),
        ttft_mean_s=sum(ttft) / len(ttft),
        e2e_p50_s=pct(e2e, 0.50),
        e2e_p95_s=pct(e2e, 0.95),
        e2e_mean_s=sum(e2e) / len(e2e),
        queue_wait_p50_s=pct(wait, 0.50),
        queue_wait_p95_s=pct(wait, 0.95),
        mean_active_slots=busy / duration,
        notes=tuple(notes),
    )


def sweep(
    service: ServiceModel,
    users: Sequence[int] = (1, 2, 4, 8),
    *,
    batching: Sequence[bool] = (True, False),
    think_time_s: float = 0.0,
    prompt: Lengths | int = 256,
    output: Lengths | int = 128,
    slots: int = 4,
    max_slots: int | None = None,
    n_requests: int = 500,
    seed: int = 0,
) -> list[LoadResult]:
    """Closed-loop load points for a throughput-against-latency chart: every user count, with and
    without batching (all of ``batching[0]`` first). The other arguments are :func:`simulate`'s."""
    return [
        simulate(
            service,
            ClosedLoop(users=n, think_time_s=think_time_s),
            prompt=prompt,
            output=output,
            slots=slots,
            max_slots=max_slots,
            batching=b,
            n_requests=n_requests,
            seed=seed,
        )
        for b in batching
        for n in users
    ]


def sweep_rates(
    service: ServiceModel,
    rates: Sequence[float],
    *,
    batching: Sequence[bool] = (True, False),
    prompt: Lengths | int = 256,
    output: Lengths | int = 128,
    slots: int = 4,
    max_slots: int | None = None,
    n_requests: int = 500,
    seed: int = 0,
) -> list[LoadResult]:
    """Open-loop (Poisson) load points, like :func:`sweep` but by arrival rate in requests/s."""
    return [
        simulate(
            service,
            Poisson(rate_per_s=r),
            prompt=prompt,
            output=output,
            slots=slots,
            max_slots=max_slots,
            batching=b,
            n_requests=n_requests,
            seed=seed,
        )
        for b in batching
        for r in rates
    ]
