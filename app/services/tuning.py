"""The fastest llama-server settings for a model on some hardware, as the CLI and the window show
them: the search of ``app.core.speed.tuning`` on the estimate service's inputs (its ``Controls``,
their context per user, users, build, program and margin; decode quoted where the estimate service
quotes it, ``decode_depth_tokens``), each result's llama-server command, and, on this machine, a live
check of the best settings (llama.cpp run llama-bench style through ``app.adapters.llamacpp_runner``)
against what was predicted for the same prompt and depth.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.core.common.errors import FitScopeError
from app.core.common.units import MIB
from app.core.memory.commands import server_command
from app.core.memory.records import RepackProfile, Target
from app.core.model.source import ModelSource
from app.core.report.choices import (
    Controls,
    HardwareChoice,
    Machine,
    ModelChoice,
    load_model,
    repack_for,
    resolve_targets,
)
from app.core.speed.measure import RunResult, RunSettings, summary
from app.core.speed.predict import estimate_speed
from app.core.speed.tuning import Candidate, Goal, fastest_settings
from app.services.estimate import decode_depth_tokens


@dataclass(frozen=True)
class TunedSetting:
    """One of the best settings: its llama-server command, predicted speeds and what it trades."""

    rank: int
    candidate: Candidate
    command: str
    trades: str

    @property
    def decode_tokens_per_s(self) -> tuple[float, float]:
        r = self.candidate.speed.decode_tokens_per_s
        return r.low, r.high

    @property
    def prefill_tokens_per_s(self) -> tuple[float, float]:
        r = self.candidate.speed.prefill_tokens_per_s
        return r.low, r.high


@dataclass(frozen=True)
class TuneResult:
    model: ModelSource
    targets: tuple[Target, ...]
    goal: Goal
    settings: tuple[TunedSetting, ...]
    search_s: float  # seconds the search took
    prompt_tokens: int = 512  # the prompt the predictions are for

    @property
    def model_label(self) -> str:
        return self.model.label


@dataclass(frozen=True)
class LiveCheck:
    """A best setting run on this machine: predicted against measured decode and prefill (tokens/s),
    both for the check's own prompt and depth."""

    setting: TunedSetting
    predicted_decode: float
    measured_decode: float | None
    predicted_prefill: float
    measured_prefill: float | None

    @property
    def decode_error(self) -> float | None:
        """(predicted - measured) / measured, or None when nothing was measured."""
        if not self.measured_decode:
            return None
        return (self.predicted_decode - self.measured_decode) / self.measured_decode


def tune(
    model: ModelSource,
    controls: Controls,
    targets: Sequence[Target],
    *,
    repack: RepackProfile = "x86-avx2",
    model_path: str = "MODEL.gguf",
    goal: Goal = "decode",
    prompt_tokens: int = 512,
    top: int = 3,
) -> TuneResult:
    """The ``top`` fastest settings for ``model`` with ``controls``' context per user and users on
    ``targets``, keeping their ``fit_margin_mib`` free per GPU. Threads tried: llama.cpp's default
    (the physical cores) and half of them. Raises EstimateError when nothing fits."""
    started = time.perf_counter()
    host = next((t for t in targets if t.kind == "cpu"), None)
    cores = host.cpu_cores if host is not None else None
    threads: list[int | None] = [None]
    if cores and cores >= 4:
        threads.append(cores // 2)
    base = controls.settings(repack)
    found = fastest_settings(
        model.arch,
        model.tensors,
        base,
        list(targets),
        goal=goal,
        prompt_tokens=prompt_tokens,
        top=top,
        margin_bytes=controls.fit_margin_mib * MIB,
        threads=threads,
        depth_tokens=decode_depth_tokens(controls, prompt_tokens),
    )
    elapsed = time.perf_counter() - started
    sliding = model.arch.sliding_window is not None
    out = []
    for i, c in enumerate(found):
        est = c.plan.estimate
        gpu_layers = est.gpu_layers if any(t.kind == "gpu" for t in targets) else 0
        command = server_command(est, model_path, gpu_layers, sliding, c.plan.gpus_hidden)
        out.append(TunedSetting(i + 1, c, command, c.trades(found[0])))
    return TuneResult(model, tuple(targets), goal, tuple(out), elapsed, prompt_tokens)


def check_live(
    result: TuneResult,
    gguf_path: str,
    *,
    prompt_tokens: int | None = None,
    generate_tokens: int = 64,
    repeat: int = 2,
    run: Callable[[RunSettings], RunResult] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> list[LiveCheck]:
    """Run each of ``result``'s settings on this machine (llama-bench style: a ``prompt_tokens``
    prompt, then ``generate_tokens`` tokens, ``repeat`` times) and hold the measured decode and
    prefill against the prediction for that prompt and depth (``prompt_tokens`` defaults to the
    prompt the search was for). ``run`` is the live runner (``run_live`` by default). Raises
    RunError when llama.cpp cannot run a setting."""
    prompt_tokens = prompt_tokens or result.prompt_tokens
    if run is None:
        from app.adapters.llamacpp_runner import run_live

        run = run_live
    model = result.model
    checks = []
    for tuned in result.settings:
        s = tuned.candidate.settings
        est = tuned.candidate.plan.estimate
        live = (
            [t for t in result.targets if t.kind == "cpu"] if tuned.candidate.plan.gpus_hidden else list(result.targets)
        )
        predicted = estimate_speed(
            model.arch,
            model.tensors,
            est,
            live,
            prompt_tokens=prompt_tokens,
            depth_tokens=prompt_tokens + generate_tokens // 2,
            users=s.parallel_sequences,
        )
        settings = RunSettings(
            gguf_path=gguf_path,
            mode="bench",
            context_tokens=max(s.context_tokens, prompt_tokens + generate_tokens + 16),
            batch_tokens=s.batch_tokens,
            ubatch_tokens=s.ubatch_tokens,
            flash_attn=s.flash_attn,
            cache_type_k=s.cache_type_k,
            cache_type_v=s.cache_type_v,
            swa_full=s.swa_full,
            gpu_layers="all" if tuned.candidate.plan.fully_on_gpu else est.gpu_layers,
            n_threads=s.threads,
            prompt_tokens=prompt_tokens,
            max_tokens=generate_tokens,
            repeat=repeat,
        )
        if on_progress is not None:
            on_progress(f"running #{tuned.rank}: {tuned.command}")
        measured = summary(run(settings))
        decode = measured["decode_tokens_per_s"]
        prefill = measured["prefill_tokens_per_s"]
        checks.append(
            LiveCheck(
                tuned,
                predicted.decode_typical,
                decode.median if decode else None,
                predicted.prefill_typical,
                prefill.median if prefill else None,
            )
        )
    return checks


def require_local_file(path: str | None, what: Sequence[str] = ("--gguf",)) -> str:
    """``path``, or FitScopeError: a live check needs a model file on this machine."""
    if not path:
        raise FitScopeError(f"A live check runs the model on this machine: give a GGUF file ({', '.join(what)}).")
    return path


def tune_choice(
    model_choice: ModelChoice,
    hardware: HardwareChoice,
    controls: Controls,
    machine: Machine,
    demo_path: str | None = None,
    goal: Goal = "decode",
    prompt_tokens: int = 512,
) -> TuneResult:
    """``tune`` for what the window shows: its model, hardware and controls on ``machine``. Raises
    FitScopeError (model, hardware) or EstimateError (nothing fits)."""
    model = load_model(model_choice, demo_path)
    targets = resolve_targets(hardware, machine)
    path = str(model.path) if model_choice.kind in ("gguf", "demo") and model.path else "MODEL.gguf"
    return tune(
        model,
        controls,
        targets,
        repack=repack_for(hardware, machine),
        model_path=path,
        goal=goal,
        prompt_tokens=prompt_tokens,
    )
