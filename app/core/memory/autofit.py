"""GPU layers and experts chosen as llama.cpp's own ``--fit`` chooses them.

``common_params_fit_impl`` (vendored llama.cpp, common/fit.cpp; on by default in llama-server)
keeps a free-memory margin on every device (``--fit-target``, 1024 MiB by default), measures
against the memory the devices have free, and when the model does not fit it first moves the
routed expert tensors of MoE models to system memory (``blk.N.ffn_(up|down|gate_up|gate)_(ch|)exps``
overridden to the CPU buffer) and only then takes whole layers off the GPUs. FitScope does the
same with its estimator instead of llama.cpp's dry runs, expressed as the flags that reproduce it:
``-ngl N`` and ``--n-cpu-moe N`` (experts of the first N layers in RAM).

When not even the compute buffers that a GPU build keeps on GPU 0 at ``-ngl 0`` fit (a GPU busy
with other programs), the only run left is on the CPU with the GPU hidden (``--device none``),
which is a CPU build's layout: repacked weights, no GPU buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from app.core.common.units import GIB
from app.core.memory.estimate import estimate
from app.core.memory.records import Estimate, Settings, Target
from app.core.model.architecture import Architecture
from app.core.model.tensors import TensorInfo

DEFAULT_MARGIN_BYTES = GIB  # llama.cpp's --fit-target default (common/common.h, fit_params_target)


class FitPlan(BaseModel):
    """Where the model goes, the estimate of that placement, and the llama-server flags for it."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    estimate: Estimate
    gpu_layers: int = Field(ge=0)
    n_cpu_moe: int = Field(ge=0)
    margin_bytes: int = Field(ge=0)
    gpus_hidden: bool = False
    steps: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        return self.gpu_layers > 0 and not self.gpus_hidden

    @property
    def fully_on_gpu(self) -> bool:
        return self.on_gpu and self.gpu_layers >= self.estimate.n_layer + 1 and self.n_cpu_moe == 0

    def server_flags(self) -> str:
        """The llama-server flags that reproduce this placement (besides the context settings)."""
        if self.gpus_hidden:
            return "--device none -ngl 0"
        flags = [f"-ngl {self.gpu_layers}"]
        if self.n_cpu_moe:
            n_layer = self.estimate.n_layer
            flags.append("--cpu-moe" if self.n_cpu_moe >= n_layer else f"--n-cpu-moe {self.n_cpu_moe}")
        if self.margin_bytes != DEFAULT_MARGIN_BYTES:
            flags.append(f"--fit-target {self.margin_bytes // 1024**2}")
        return " ".join(flags)


def _gpus_keep_margin(est: Estimate, margin_bytes: int) -> bool:
    return all(d.total_bytes + margin_bytes <= d.capacity_bytes for d in est.devices if d.kind == "gpu")


def auto_fit(
    arch: Architecture,
    tensors: Sequence[TensorInfo],
    settings: Settings,
    targets: list[Target],
    margin_bytes: int = DEFAULT_MARGIN_BYTES,
    fixed_cpu_moe: int | None = None,
    cpu_moe_hint: int | None = None,
) -> FitPlan:
    """The placement llama.cpp's ``--fit`` would choose for ``settings`` on ``targets`` (GPU
    capacities are the memory free for the model), keeping ``margin_bytes`` free on every GPU.
    ``settings.gpu_layers`` and ``settings.n_cpu_moe`` are ignored: they are what is chosen, unless
    ``fixed_cpu_moe`` pins the experts kept in system memory (then only layers move).
    ``cpu_moe_hint`` is a guess at the ``--n-cpu-moe`` the search would find: checked with two
    estimates (it keeps the margin, one fewer does not) and used only when right, so the answer is the
    search's either way. Raises EstimateError as :func:`estimate` does."""
    gpus = [t for t in targets if t.kind == "gpu"]
    n_layer = arch.n_layer
    base = settings.model_copy(update={"gpu_layers": "all", "n_cpu_moe": 0})
    if not gpus:
        est = estimate(arch, tensors, base, targets)
        return FitPlan(estimate=est, gpu_layers=0, n_cpu_moe=0, margin_bytes=margin_bytes, steps=("No GPU: CPU only.",))

    tried: dict[tuple[int, int], Estimate] = {}

    def at(layers: int, cpu_moe: int) -> Estimate:
        # The searches below ask some placements twice (the last probe, the answer).
        if (layers, cpu_moe) not in tried:
            update = {"gpu_layers": layers, "n_cpu_moe": cpu_moe}
            tried[layers, cpu_moe] = estimate(arch, tensors, base.model_copy(update=update), targets)
        return tried[layers, cpu_moe]

    def plan(est: Estimate, layers: int, cpu_moe: int, *steps: str) -> FitPlan:
        return FitPlan(
            estimate=est, gpu_layers=layers, n_cpu_moe=cpu_moe, margin_bytes=margin_bytes, steps=tuple(steps)
        )

    margin_words = f"{margin_bytes / GIB:.1f} GiB kept free per GPU"

    def experts_moved(n: int) -> FitPlan:
        return plan(
            at(n_layer + 1, n),
            n_layer + 1,
            n,
            f"The whole model does not fit with {margin_words}.",
            f"Experts of the first {n} of {n_layer} layers moved to system memory; everything else on the GPU.",
        )

    # GPU use shrinks as N grows: where the hint keeps the margin and one fewer does not, no fewer does
    # (the whole model, N = 0, included), so the search below would answer the hint.
    hint = cpu_moe_hint if fixed_cpu_moe is None and arch.moe is not None else None
    if hint is not None and not 0 < hint < n_layer:
        hint = None
    if (
        hint is not None
        and _gpus_keep_margin(at(n_layer + 1, hint), margin_bytes)
        and not _gpus_keep_margin(at(n_layer + 1, hint - 1), margin_bytes)
    ):
        return experts_moved(hint)
    cpu_moe = min(fixed_cpu_moe or 0, n_layer) if arch.moe is not None else 0
    full = at(n_layer + 1, cpu_moe)
    if _gpus_keep_margin(full, margin_bytes):
        return plan(full, n_layer + 1, cpu_moe, f"Every layer on the GPU, {margin_words}.")

    steps: list[str] = [f"The whole model does not fit with {margin_words}."]
    if fixed_cpu_moe is None and arch.moe is not None:
        # Where the hint keeps the margin, every expert in system memory does, and so does one fewer
        # (else it was the answer above).
        hint_fits = hint is not None and _gpus_keep_margin(at(n_layer + 1, hint), margin_bytes)
        if hint_fits or _gpus_keep_margin(at(n_layer + 1, n_layer), margin_bytes):
            # The fewest layers whose experts must leave the GPU.
            lo, hi = 0, n_layer
            if hint is not None:
                lo, hi = (0, hint - 1) if hint_fits else (hint, n_layer)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _gpus_keep_margin(at(n_layer + 1, mid), margin_bytes):
                    hi = mid
                else:
                    lo = mid
            return experts_moved(hi)
        cpu_moe = n_layer
        steps.append("Even with every expert in system memory the GPU is too small; layers move too.")

    lo, hi = 0, n_layer + 1  # hi does not fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _gpus_keep_margin(at(mid, cpu_moe), margin_bytes):
            lo = mid
        else:
            hi = mid
    placed = at(lo, cpu_moe)
    if lo > 0:
        return plan(placed, lo, cpu_moe, *steps, f"{lo} of {n_layer + 1} layers on the GPU, the rest in system memory.")
    if _gpus_keep_margin(placed, margin_bytes):
        return plan(
            placed,
            0,
            cpu_moe,
            *steps,
            "No layer fits on the GPU; it only runs the prompt's large matrix products (-ngl 0).",
        )
    host_only = [t for t in targets if t.kind == "cpu"]
    cpu_only = estimate(arch, tensors, base.model_copy(update={"gpu_layers": 0}), host_only)
    return FitPlan(
        estimate=cpu_only,
        gpu_layers=0,
        n_cpu_moe=0,
        margin_bytes=margin_bytes,
        gpus_hidden=True,
        steps=(
            *steps,
            "Not even -ngl 0 fits: a GPU build keeps compute buffers on GPU 0. Run on the CPU with the GPU hidden "
            "(--device none).",
        ),
    )
