"""A finished live run, from the runner's result to what is shown and kept: the estimate for the
run's own settings on the hardware that ran it, the report, and its place in the run history with
the decode efficiency it measured. ``fitscope run`` and the window's Run tab both call these, so the
same run gives the same figures in both."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from app.adapters.history import Calibration, RunHistory, default_history_path
from app.adapters.rpc_servers import RpcRunOutcome
from app.adapters.run_saving import record_run
from app.core.common.errors import FitScopeError
from app.core.hardware.snapshots import machine_key
from app.core.memory.targets import repack_profile
from app.core.model.source import model_from_gguf
from app.core.report.choices import HardwareChoice, Machine, resolve_targets
from app.core.report.run_vs_estimate import BufferRow, RunReport, estimate_for_run, make_run_report
from app.core.speed.measure import RunResult, SweepRow


def detect_machine(measure_bandwidth: bool = True) -> Machine:
    """This machine now: its GPUs of every vendor (none found: the reason why) and its host, with
    the memory read bandwidth measured when asked (about a second)."""
    from app.adapters.gpus import detect_gpus
    from app.adapters.host import detect_host

    status = detect_gpus()
    return Machine(
        gpus=status.gpus if status.available else (),
        host=detect_host(measure_bandwidth=measure_bandwidth),
        gpu_message=status.message,
    )


def machine_calibration(machine: Machine, history: RunHistory | None = None) -> dict[str, float]:
    """Target name -> the median decode efficiency of the good live runs on ``machine`` (with
    llama-server's thread count; a disturbed run never recorded one), which calibrates its
    estimates in the window and on the command line alike. ``history`` when the caller holds it
    open; else the user's, read only if it exists. {} when there is none or it cannot be read."""
    return {name: c.efficiency for name, c in calibration_of(machine, history).items()}


def calibration_of(machine: Machine, history: RunHistory | None = None) -> dict[str, Calibration]:
    """Target name -> how ``machine``'s estimates are calibrated (median, runs, newest run's date);
    see :func:`machine_calibration`."""
    from app.adapters.cpu_topology import llama_math_threads

    key = machine_key(machine.host, machine.gpus)
    if history is not None:
        return history.calibration(key, llama_math_threads())
    path = default_history_path()
    if not path.is_file():
        return {}
    try:
        opened = RunHistory(path)
    except FitScopeError:
        return {}
    try:
        return opened.calibration(key, llama_math_threads())
    finally:
        opened.close()


def reset_calibration(machine: Machine, history: RunHistory) -> int:
    """Forget every efficiency measured on ``machine`` (its runs stay in the history): its estimates
    go back to the speed model's own figures. Returns how many were forgotten."""
    return history.reset_calibration(machine_key(machine.host, machine.gpus))


def ran_on_gpu(result: RunResult, machine: Machine) -> bool:
    """Whether the run put layers on one of this machine's GPUs."""
    return result.settings.gpu_layers != 0 and result.gpu_offload_supported and bool(machine.gpus)


def finish_run(result: RunResult, machine: Machine, thread_sweep: Sequence[SweepRow] = ()) -> RunReport:
    """The report for ``result``: llama.cpp's buffers and speeds against the estimate for the same
    file and settings on the devices that ran it (this machine's GPUs and RAM, or its CPU). When no
    estimate can be made (the file was removed after the run, say) the measured figures still stand."""
    hardware = HardwareChoice(kind="local" if ran_on_gpu(result, machine) else "cpu")
    try:
        model = model_from_gguf(result.settings.gguf_path)
        targets = resolve_targets(hardware, machine)
        run_estimate = estimate_for_run(result, model.arch, model.tensors, targets, repack_profile(machine.host))
    except (FitScopeError, OSError):
        return make_run_report(result, Path(result.settings.gguf_path).name, None, thread_sweep)
    return make_run_report(result, model.label, run_estimate, thread_sweep)


def save_run(report: RunReport, machine: Machine, history: RunHistory | None = None) -> RunReport:
    """Keeps the run in the history (``history`` when the caller holds it open, else the user's),
    with the efficiency that calibrates this machine's estimates; a copy of the report says where it
    went. A disturbed run (:attr:`RunReport.disturbed`) is kept without its efficiency: it does
    not calibrate. Never raises for a history that cannot be written: the run is kept in a file of
    its own and ``save_message`` says so."""
    efficiency = report.measured_efficiency if report.calibrates else None
    saved = record_run(
        report.result,
        report.estimate_json(),
        (efficiency.target, efficiency.value, efficiency.n_threads) if efficiency is not None else None,
        machine_key(machine.host, machine.gpus),
        history=history,
    )
    return dataclasses.replace(
        report, history_id=saved.history_id, unsaved_path=saved.unsaved_path, save_message=saved.message
    )


def rpc_run_report(outcome: RpcRunOutcome) -> RunReport:
    """A run across RPC servers, held against the RPC plan device by device. Not saved: its speed
    includes the network and must not calibrate this machine."""
    base = make_run_report(outcome.result, Path(outcome.result.settings.gguf_path).name, None)
    return dataclasses.replace(
        base,
        comparison=tuple(
            BufferRow(f"{c.device} {c.buffer}", c.measured_bytes, c.planned_bytes) for c in outcome.checks
        ),
        diagnosis=(*base.diagnosis, outcome.verdict()),
        rpc={
            "servers": list(outcome.endpoints),
            "plan": outcome.plan.to_json(),
            "buffers": [c.to_json() for c in outcome.checks],
            "weights_and_kv_agree": outcome.weights_and_kv_agree,
        },
    )
