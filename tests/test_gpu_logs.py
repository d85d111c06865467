"""The estimator against public llama.cpp load logs from real GPUs (tests/data/gpu_load_logs.json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gpu_logs import all_checks, load_logs

LOGS = load_logs(Path(__file__).parent / "data" / "gpu_load_logs.json")


def test_every_log_names_its_source_and_prints_a_buffer():
    assert len(LOGS) >= 25
    for log in LOGS:
        assert log["source"].startswith(("https://github.com/", "http")), log["id"]
        assert log["buffers_mib"], log["id"]
        assert log["log_excerpt"].strip(), log["id"]
    assert len({log["id"] for log in LOGS}) == len(LOGS)


@pytest.fixture(scope="module")
def checks():
    return all_checks(LOGS)


def test_enough_logs_are_compared_buffer_by_buffer(checks):
    kinds = {c.kind for c in checks}
    assert {"weights", "kv", "compute", "host_compute"} <= kinds
    assert len({c.log_id for c in checks}) >= 6 and len(checks) >= 25


def test_weights_and_kv_match_the_logs(checks):
    for c in checks:
        if c.kind == "kv":
            # Exact but for one layer's KV in a 2024 build that placed the output layer last.
            assert abs(c.error_mib) <= 32, c
        if c.kind == "weights":
            # The -ot patterns of these runs also move each layer's router and norm (2 MiB) off the GPU.
            assert abs(c.error_fraction) < 0.015, c
    assert sum(c.error_mib == 0 for c in checks if c.kind == "kv") >= 6


def test_no_compute_buffer_is_underestimated_beyond_five_percent_or_32_mib(checks):
    for c in checks:
        if c.kind in ("compute", "host_compute"):
            assert c.within() or c.error_mib > 0, c
    good = [c for c in checks if c.kind in ("compute", "host_compute") and c.within()]
    # The two-GPU pipeline log (2025-03) predates the scheduler keeping copies of every graph input
    # (the unused embeddings input included) and the logits above them, which the vendored build does
    # (app/core/memory/splits.py, measured over two RPC devices): its three compute buffers are
    # over-estimated, by up to 110 MiB, never under.
    older_pipeline = [c for c in checks if c.log_id.startswith("ollama9068") and c.kind in ("compute", "host_compute")]
    assert len(older_pipeline) == 3
    assert all(0 < c.error_mib <= 110.5 for c in older_pipeline)
    assert len(good) >= 12 - len(older_pipeline)
