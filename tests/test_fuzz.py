"""A quick fuzz run: mutated GGUF headers, odd config.json files and command lines, and what files
control (chat templates, suites, kept runs, settings files) never end in a traceback, a hang or a
memory blow-up (scripts/fuzz.py runs the long version and counts)."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_targets import (
    command_case,
    config_case,
    gguf_case,
    kept_run_case,
    mutate_gguf,
    random_command,
    random_config,
    random_suite,
    random_template,
    settings_case,
    small_seeds,
    suite_case,
    template_case,
)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same cases every run: CI stays deterministic
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


_SEEDS: list[bytes] = []


def seeds(folder: Path) -> list[bytes]:
    """Small valid GGUFs of three shapes (dense, tied, MoE), written once."""
    if not _SEEDS:
        _SEEDS.extend(small_seeds(folder))
    return _SEEDS


def _ok(outcome) -> None:
    assert outcome.kind in ("clean", "accepted"), outcome


@fuzz(300)
@given(index=st.integers(0, 2), rng=st.randoms(use_true_random=False))
def test_mutated_gguf_headers(tmp_path, index, rng):
    seed = seeds(tmp_path)[index]
    _ok(gguf_case(mutate_gguf(seed, random.Random(rng.random())), tmp_path / "case.gguf"))


@fuzz(150)
@given(rng=st.randoms(use_true_random=False))
def test_odd_config_json(rng):
    _ok(config_case(random_config(random.Random(rng.random()))))


@fuzz(40)
@given(rng=st.randoms(use_true_random=False))
def test_odd_command_lines(tmp_path: Path, rng):
    _ok(command_case(random_command(random.Random(rng.random()), tmp_path)))


@fuzz(8)
@given(rng=st.randoms(use_true_random=False))
def test_hostile_chat_templates(rng):
    _ok(template_case(random_template(random.Random(rng.random()))))


@fuzz(60)
@given(rng=st.randoms(use_true_random=False))
def test_odd_suites(rng):
    _ok(suite_case(*random_suite(random.Random(rng.random()))))


@fuzz(40)
@given(rng=st.randoms(use_true_random=False))
def test_odd_kept_runs(tmp_path, rng):
    _ok(kept_run_case(random.Random(rng.random()), tmp_path / "data"))


@fuzz(40)
@given(rng=st.randoms(use_true_random=False))
def test_odd_settings_files(tmp_path, rng):
    _ok(settings_case(random.Random(rng.random()), tmp_path / "config"))
