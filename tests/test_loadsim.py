"""The load simulation (pure, fast) and the batching probe it is driven by (real llama.cpp on a tiny
model): hand-computed cases, the shape of throughput and latency as load grows, memory-capped
slots, determinism, speed, and simulated against measured batched runs."""

from __future__ import annotations

import time

import pytest

from app.core.speed.loadsim import (
    ClosedLoop,
    Lengths,
    LoadResult,
    Poisson,
    ServiceModel,
    Trace,
    simulate,
    sweep,
    sweep_rates,
)

# 10 ms per step whatever the batch: the ideal case for batching, where throughput grows with slots.
CONSTANT = ServiceModel(prefill_tokens_per_s=1_000_000, decode_step_s={1: 0.01})


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-9, abs=1e-12)


# -- the service model ---------------------------------------------------------------------------


def test_step_times_interpolate_between_measured_points_and_extrapolate_with_the_fitted_slope():
    service = ServiceModel(prefill_tokens_per_s=500, decode_step_s={1: 0.010, 2: 0.012, 4: 0.020})
    assert service.step_s(0) == 0
    assert service.step_s(1) == approx(0.010) and service.step_s(4) == approx(0.020)
    assert service.step_s(3) == approx(0.016)  # halfway between 2 and 4
    slope = service.slope_s  # least squares through (1, 10), (2, 12), (4, 20) ms: 24/7 ms per sequence
    assert slope == approx(0.024 / 7)
    assert service.step_s(8) == approx(0.020 + 4 * slope)
    # One point: a constant step (memory-bound decoding).
    assert CONSTANT.step_s(1) == CONSTANT.step_s(7) == 0.01


def test_a_prompt_batch_costs_one_step_plus_a_marginal_cost_per_token():
    # One 100-token prompt measured at 200 ms; a one-sequence step takes 10 ms.
    service = ServiceModel(prefill_tokens_per_s=500, decode_step_s={1: 0.010, 2: 0.014}, prefill_measured_tokens=100)
    marginal = (0.2 - 0.01) / 99
    assert service.prefill_token_s == approx(marginal)
    assert service.batch_s(0, 100) == approx(0.2)  # the measured prefill, exactly
    assert service.batch_s(0, 300) == approx(0.01 + 299 * marginal)  # three prompts in one batch
    assert service.batch_s(2, 50) == approx(0.014 + 50 * marginal)  # a prompt chunk riding with 2 decodes
    assert service.batch_s(2, 0) == approx(0.014)
    # Without the measured length: every prompt token at the one-sequence rate, on top of the step.
    naive = service.model_copy(update={"prefill_measured_tokens": None})
    assert naive.batch_s(0, 300) == approx(0.6) and naive.batch_s(2, 50) == approx(0.014 + 0.1)


def test_the_service_model_is_built_from_single_step_timings_only():
    class Timings:
        prefill_tokens_per_s = 640.0
        decode_step_s = {1: 0.014, 4: 0.032}  # a plain stand-in for BatchProfile
        prompt_tokens = 64

    service = ServiceModel.from_timings(Timings(), n_batch=512)
    assert service.decode_step_s == {1: 0.014, 4: 0.032}
    assert service.prefill_measured_tokens == 64 and service.n_batch == 512
    assert service.batch_s(0, 64) == approx(0.1)


def test_impossible_inputs_are_refused():
    with pytest.raises(ValueError):
        ServiceModel(prefill_tokens_per_s=100, decode_step_s={})
    with pytest.raises(ValueError):
        ServiceModel(prefill_tokens_per_s=100, decode_step_s={0: 0.01})
    with pytest.raises(ValueError):
        Lengths.uniform(10, 5)
    with pytest.raises(ValueError):
        simulate(CONSTANT, ClosedLoop(users=1), slots=0)
    with pytest.raises(ValueError):
        simulate(CONSTANT, ClosedLoop(users=1), max_slots=0)


# -- hand-computed runs --------------------------------------------------------------------------


def test_one_request_by_hand():
    # Prompt 100 tokens at 1000 tok/s: its logits give the first token at 0.1 s; the other 9 tokens
    # take a 10 ms step each.
    service = ServiceModel(prefill_tokens_per_s=1000, decode_step_s={1: 0.01})
    r = simulate(service, ClosedLoop(users=1), prompt=100, output=10, n_requests=1)
    assert r.n_requests == 1
    assert r.ttft_p50_s == approx(0.1) and r.ttft_p95_s == approx(0.1) and r.ttft_mean_s == approx(0.1)
    assert r.e2e_p50_s == approx(0.19) and r.e2e_mean_s == approx(0.19)
    assert r.queue_wait_p50_s == 0 and r.queue_wait_p95_s == 0
    assert r.duration_s == approx(0.19)
    assert r.tokens_per_s == approx(10 / 0.19) and r.requests_per_s == approx(1 / 0.19)
    assert r.mean_active_slots == approx(1.0)


def test_a_prompt_longer_than_the_batch_is_prefilled_in_chunks():
    # llama-server's -b 64: a 100-token prompt takes two llama_decode calls, each paying the fixed cost.
    service = ServiceModel(prefill_tokens_per_s=1000, decode_step_s={1: 0.01}, prefill_measured_tokens=100, n_batch=64)
    marginal = (0.1 - 0.01) / 99
    r = simulate(service, ClosedLoop(users=1), prompt=100, output=3, n_requests=1)
    assert r.ttft_mean_s == approx((0.01 + 63 * marginal) + (0.01 + 35 * marginal))
    assert r.e2e_mean_s == approx(r.ttft_mean_s + 2 * 0.01)


def test_two_requests_by_hand_with_and_without_batching():
    service = ServiceModel(prefill_tokens_per_s=1000, decode_step_s={1: 0.01, 2: 0.02})
    # Batching: both 10-token prompts in one 20 ms batch, then two shared 20 ms steps.
    b = simulate(service, ClosedLoop(users=2), prompt=10, output=3, slots=2, n_requests=2)
    assert b.ttft_mean_s == approx(0.02) and b.e2e_mean_s == approx(0.06) and b.duration_s == approx(0.06)
    assert b.tokens_per_s == approx(100) and b.queue_wait_p95_s == 0
    # One at a time: A runs 0..0.03 (10 ms prompt, 2 steps), B waits 30 ms and runs 0.03..0.06.
    s = simulate(service, ClosedLoop(users=2), prompt=10, output=3, slots=2, n_requests=2, batching=False)
    assert s.slots == 1
    assert s.ttft_mean_s == approx((0.01 + 0.04) / 2) and s.e2e_mean_s == approx((0.03 + 0.06) / 2)
    assert s.queue_wait_p50_s == approx(0.015) and s.duration_s == approx(0.06)


def test_a_prompt_lengthens_the_shared_step_instead_of_pausing_the_others():
    # A (prompt 10, 5 tokens) arrives at 0; B (prompt 10, 2 tokens) at 25 ms, while A decodes.
    service = ServiceModel(prefill_tokens_per_s=1000, decode_step_s={1: 0.01, 2: 0.02})
    trace = Trace(requests=((0.0, 10, 5), (0.025, 10, 2)))
    r = simulate(service, trace, slots=2)
    # 0-10 ms: A's prompt (first token). 10-30 ms: two A steps; B arrives mid-step and waits 5 ms
    # for the boundary. 30-50 ms: one batch with A's decode and B's whole prompt (10 + 10 ms): A's
    # 4th token, B's first. 50-70 ms: one shared step finishes both.
    assert r.n_requests == 2 and r.users is None and r.rate_per_s is None
    assert r.queue_wait_p50_s == approx(0.0025) and r.queue_wait_p95_s == approx(0.95 * 0.005)  # waits 0 and 5 ms
    assert r.ttft_p50_s == approx((0.01 + 0.025) / 2)
    assert r.e2e_p50_s == approx((0.07 + 0.045) / 2) and r.duration_s == approx(0.07)
    assert r.tokens_per_s == approx(7 / 0.07)
    assert r.mean_active_slots == approx((0.03 * 1 + 0.04 * 2) / 0.07)


# -- shape of the curves -------------------------------------------------------------------------


def test_batching_throughput_grows_with_users_up_to_the_slots_then_plateaus():
    results = sweep(CONSTANT, users=[1, 2, 4, 8, 16], batching=[True], prompt=16, output=100, slots=4)
    rate = {r.users: r.tokens_per_s for r in results}
    assert rate[1] == pytest.approx(100, rel=0.02)  # one token per 10 ms step
    assert rate[2] == pytest.approx(2 * rate[1], rel=0.05)
    assert rate[4] == pytest.approx(4 * rate[1], rel=0.05)
    assert rate[8] == pytest.approx(rate[4], rel=0.05) and rate[16] == pytest.approx(rate[4], rel=0.05)
    assert [r.mean_active_slots for r in results][-1] == pytest.approx(4, rel=0.02)
    # Beyond the slots, requests queue: the wait grows with the users.
    waits = [r.queue_wait_p50_s for r in results]
    assert waits[:3] == [0, 0, 0] and waits[3] > 0 and waits[4] > waits[3]


def test_without_batching_throughput_is_the_single_sequence_rate_whatever_the_users():
    results = sweep(CONSTANT, users=[1, 2, 4, 8], batching=[False], prompt=16, output=100, slots=4)
    for r in results:
        assert r.slots == 1 and not r.batching
        assert r.tokens_per_s == pytest.approx(results[0].tokens_per_s, rel=0.01)
        assert r.mean_active_slots == pytest.approx(1, rel=0.01)
    assert results[-1].e2e_p50_s == pytest.approx(8 * results[0].e2e_p50_s, rel=0.05)


def test_percentiles_are_ordered():
    service = ServiceModel(prefill_tokens_per_s=700, decode_step_s={1: 0.014, 2: 0.025, 4: 0.032})
    for arrivals in (Poisson(rate_per_s=1.5), ClosedLoop(users=6, think_time_s=0.5)):
        for batching in (True, False):
            r = simulate(
                service,
                arrivals,
                prompt=Lengths.uniform(16, 400),
                output=Lengths.uniform(8, 128),
                slots=4,
                batching=batching,
                n_requests=300,
                seed=1,
            )
            assert r.n_requests == 300
            assert 0 < r.ttft_p50_s <= r.ttft_p95_s
            assert 0 < r.e2e_p50_s <= r.e2e_p95_s
            assert 0 <= r.queue_wait_p50_s <= r.queue_wait_p95_s
            assert r.ttft_p50_s <= r.e2e_p50_s and r.ttft_p95_s <= r.e2e_p95_s


def test_time_to_first_token_grows_with_the_arrival_rate():
    service = ServiceModel(prefill_tokens_per_s=700, decode_step_s={1: 0.014, 2: 0.025, 4: 0.032})
    results = sweep_rates(service, rates=[0.2, 1, 2, 3, 4], batching=[True], prompt=64, output=64, slots=4, seed=2)
    ttft = [r.ttft_mean_s for r in results]
    p95 = [r.ttft_p95_s for r in results]
    assert ttft == sorted(ttft) and ttft[-1] > 3 * ttft[0]
    assert p95 == sorted(p95)
    assert [r.rate_per_s for r in results] == [0.2, 1, 2, 3, 4] and all(r.users is None for r in results)


def test_slots_capped_by_memory_are_reported_and_used():
    capped = simulate(CONSTANT, ClosedLoop(users=8), prompt=16, output=50, slots=8, max_slots=3)
    assert capped.slots_capped_by_memory and capped.slots == 3 and capped.slots_requested == 8
    assert any("3 slot" in note for note in capped.notes)
    assert capped.mean_active_slots <= 3 + 1e-9
    assert capped.tokens_per_s == pytest.approx(300, rel=0.05)
    fits = simulate(CONSTANT, ClosedLoop(users=8), prompt=16, output=50, slots=8, max_slots=8)
    assert not fits.slots_capped_by_memory and fits.slots == 8 and fits.notes == ()


def test_the_same_seed_gives_the_same_result():
    service = ServiceModel(prefill_tokens_per_s=700, decode_step_s={1: 0.014, 2: 0.025, 4: 0.032})
    kwargs = {"prompt": Lengths.choice([32, 128, 512]), "output": Lengths.uniform(16, 256), "slots": 4}
    a = simulate(service, Poisson(rate_per_s=2), seed=7, **kwargs)
    b = simulate(service, Poisson(rate_per_s=2), seed=7, **kwargs)
    c = simulate(service, Poisson(rate_per_s=2), seed=8, **kwargs)
    assert a == b and a != c
    assert sweep(service, seed=7, **kwargs) == sweep(service, seed=7, **kwargs)


def test_a_sweep_of_eight_points_of_500_requests_is_fast():
    service = ServiceModel(prefill_tokens_per_s=700, decode_step_s={1: 0.014, 2: 0.025, 4: 0.032})
    start = time.process_time()  # CPU time: what the sweep costs, whatever else the machine runs
    results = sweep(
        service, users=[1, 2, 4, 8], prompt=Lengths.uniform(32, 512), output=Lengths.uniform(16, 256), slots=4
    )
    took = time.process_time() - start
    assert len(results) == 8 and all(isinstance(r, LoadResult) and r.n_requests == 500 for r in results)
    assert [(r.batching, r.users) for r in results] == [(b, n) for b in (True, False) for n in (1, 2, 4, 8)]
    assert took < 1.0, f"the sweep took {took:.2f} s"
    # The chart's story: batching serves more and waits less once several users share the server.
    with_b, without = results[3], results[7]
    assert with_b.tokens_per_s > 1.3 * without.tokens_per_s and with_b.e2e_p50_s < without.e2e_p50_s


# -- against real batched llama.cpp --------------------------------------------------------------


@pytest.mark.llamacpp
def test_measured_batching_on_a_tiny_model_is_plausible_and_the_simulation_reproduces_it(tmp_path):
    from app.adapters.batch_probe import measure_batching
    from tests.support.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=128, n_ff=256)
    # One thread: with every core in use, a core taken by another process (a parallel test run)
    # stalls ggml's thread barrier for a scheduler slice at each sync, and the sub-millisecond steps
    # of this model become noise. One thread is slower but steady.
    profile = measure_batching(path, parallel=(1, 2), prompt_tokens=32, gen_tokens=16, n_ctx=256, n_threads=1, repeat=3)
    assert profile.parallel == (1, 2) and profile.llama_cpp_version == "0.3.36" and profile.n_threads == 1
    assert profile.prefill_tokens_per_s > 0 and profile.load_s > 0
    assert all(s > 0 for s in profile.decode_step_s.values())
    # A step advancing two sequences costs more than one advancing one, and less than three times as
    # much. Whether it gives more tokens per second is a property of the CPU, not of the probe: this
    # model measured 1.14-1.22x here on one thread and 0.89x on another machine; q8_0 and f16 models
    # of 512 wide measured 0.6-0.75x here. scripts/bench_load_model.py prints the figure.
    steps = profile.decode_step_s
    assert 0.9 * steps[1] < steps[2] < 3 * steps[1]
    assert profile.decode_tokens_per_s[2] == pytest.approx(2 / steps[2])
    assert len(profile.runs) == 6
    for run in profile.runs:
        assert len(run.ttft_s) == len(run.e2e_s) == run.parallel
        assert all(0 < t <= e <= run.wall_s + 1e-9 for t, e in zip(run.ttft_s, run.e2e_s, strict=True))

    # Fed the single-step timings only, the simulation lands near the measured run (about 16% low
    # on an idle machine: this model's prefill is far from linear in tokens, which the fixed +
    # marginal rule cannot see). The 20% target is scripts/bench_load_model.py's, on the demo
    # model; here a factor of two, which other work on the machine cannot break.
    service = ServiceModel.from_timings(profile, n_batch=profile.n_batch)
    measured, _, _ = profile.median_run_figures(2)
    sim = simulate(service, ClosedLoop(users=2), prompt=32, output=16, slots=2, n_requests=2)
    assert measured / 2 < sim.tokens_per_s < measured * 2


@pytest.mark.llamacpp
def test_the_probe_explains_what_it_cannot_measure(tmp_path):
    from app.adapters.batch_probe import BatchProbeError, measure_batching
    from app.core.common.errors import FitScopeError
    from tests.support.tiny_gguf import write_tiny_llama

    with pytest.raises(BatchProbeError, match="does not exist"):
        measure_batching(tmp_path / "missing.gguf")
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    with pytest.raises(BatchProbeError, match="need a context of 384 tokens"):
        measure_batching(path, parallel=(1, 4), prompt_tokens=64, gen_tokens=32, n_ctx=256)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(FitScopeError, match="could not load"):
        measure_batching(broken, parallel=(1,), prompt_tokens=4, gen_tokens=2, n_ctx=64)
