"""The one estimate service: for a model, a machine and the user's choices, where llama.cpp puts the
model, how much memory each device needs, how fast it runs and how far it stretches.

Every screen that shows such a figure takes it from :func:`answer`: ``fitscope estimate`` (text and
JSON), the window's verdict and charts, the compare table, the quantization ladder, the HTML
export and the hardware advisor's rows. One rule each:

- **Placement.** ``-ngl auto`` places the model as llama.cpp's ``--fit`` does
  (:func:`app.core.memory.autofit.auto_fit`: ``fit_margin_mib`` kept free per GPU, experts to
  system memory before layers). When nothing fits, the estimate shows every layer on the GPUs, which
  says how far they are from enough. A fixed ``-ngl`` is taken as given.
- **Speed.** Decode per user half-way through each user's context (every user talking at once),
  prefill and time to first token for ``prompt_tokens``; calibrated by the decode efficiencies live
  runs measured on this machine, when there are some.
- **Limits**, the same for any number of users chosen, so "up to N people" never moves with N:
  with GPUs and ``-ngl auto``, when the model fits them fully (one user, the shortest context),
  a user counts when everything stays on the GPUs with the margin ("gpu" scope); otherwise when
  auto-fit finds any placement that fits ("any"). With a fixed ``-ngl``, the estimate at that
  ``-ngl`` must fit ("fixed"); on a CPU, host memory ("cpu").
  :attr:`Limits.users_that_fit` counts users at the chosen context per user,
  :attr:`Limits.largest_context_per_user_tokens` the context per user for the chosen users.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from app.core.common.errors import EstimateError
from app.core.common.units import MIB
from app.core.memory.autofit import FitPlan, auto_fit
from app.core.memory.commands import MODEL_PLACEHOLDER, server_command, tensor_split
from app.core.memory.estimate import estimate
from app.core.memory.limits import max_gpu_layers
from app.core.memory.records import MAX_CONTEXT_TOKENS, Estimate, RepackProfile, Target, estimate_json
from app.core.model.source import ModelSource
from app.core.report.choices import MAX_USERS, MIN_CONTEXT_TOKENS, Controls
from app.core.report.verdict import Budget, budget_of
from app.core.speed.predict import SpeedEstimate, estimate_speed

Placement = Literal["gpu", "partial", "cpu", "none"]
LimitScope = Literal["gpu", "any", "fixed", "cpu"]


@dataclass(frozen=True)
class Limits:
    """How far a placement stretches (see the module docstring for ``scope``)."""

    scope: LimitScope
    users_that_fit: int
    """Users, each with the chosen context per user, that fit; 0 when not one (at most MAX_USERS)."""
    largest_context_per_user_tokens: int
    """For the chosen number of users; 0 when not even the shortest context fits."""
    most_gpu_layers: int | None = None
    """The most layers that fit the GPUs with no margin at all (None: not asked, or no GPU)."""


@dataclass(frozen=True)
class Answer:
    """Everything one estimate says. ``estimate`` is the placed estimate (host memory only when the
    GPUs had to be hidden); ``gpu_layers`` / ``n_cpu_moe`` are the llama.cpp flags that give it."""

    model: ModelSource
    controls: Controls
    targets: tuple[Target, ...]
    estimate: Estimate
    placement: Placement
    gpu_layers: int
    n_cpu_moe: int
    gpus_hidden: bool
    fit_plan: FitPlan | None
    speed: SpeedEstimate
    limits: Limits | None

    @property
    def fits(self) -> bool:
        return self.estimate.fits

    @property
    def budget(self) -> Budget:
        """The memory that limits: the GPUs together when layers are on them, else host memory."""
        return budget_of(self.estimate)

    @property
    def has_gpus(self) -> bool:
        return any(t.kind == "gpu" for t in self.targets)

    def model_file(self, model_path: str | None = None) -> str:
        return model_file(self.model, model_path)

    def command(self, model_path: str | None = None) -> str:
        """The llama-server command that runs this placement."""
        return server_command(
            self.estimate,
            self.model_file(model_path),
            self.gpu_layers if self.has_gpus and not self.gpus_hidden else 0,
            self.model.arch.sliding_window is not None,
            self.gpus_hidden,
            tensor_split([d.capacity_bytes for d in self.estimate.devices if d.kind == "gpu"]),
        )

    def to_json(self, model_path: str | None = None) -> dict[str, Any]:
        """The answer as ``fitscope estimate --json`` prints it: bytes as unrounded integers,
        ``context_tokens`` as llama.cpp's ``-c``, speeds in tokens/s as ``{"low", "high"}``."""
        s, lim, plan = self.speed, self.limits, self.fit_plan
        out: dict[str, Any] = {
            "model": self.model.label,
            "architecture": self.model.arch.arch,
            "quant": self.model.quant,
            **estimate_json(self.estimate),
            "context_per_user_tokens": self.controls.context_per_user_tokens,
            "users": self.controls.users,
            "placement": self.placement,
            "n_cpu_moe": self.n_cpu_moe,
            "gpus_hidden": self.gpus_hidden,
            "users_that_fit": lim.users_that_fit if lim else None,
            "largest_context_per_user_tokens": lim.largest_context_per_user_tokens if lim else None,
            "limit_scope": lim.scope if lim else None,
            "most_gpu_layers": lim.most_gpu_layers if lim else None,
            "decode_tokens_per_s": s.decode_tokens_per_s.as_dict(),
            "decode_total_tokens_per_s": s.decode_total_tokens_per_s.as_dict(),
            "decode_depth_tokens": s.depth_tokens,
            "prefill_tokens_per_s": s.prefill_tokens_per_s.as_dict(),
            "prompt_tokens": s.prompt_tokens,
            "ttft_s": s.ttft_s.as_dict(),
            "auto_fit": None,
            "assumptions": list(self.estimate.assumptions) + list(s.assumptions),
            "llama_server_command": self.command(model_path),
        }
        if plan is not None:
            out["auto_fit"] = {
                "gpu_layers": plan.gpu_layers,
                "n_cpu_moe": plan.n_cpu_moe,
                "margin_bytes": plan.margin_bytes,
                "gpus_hidden": plan.gpus_hidden,
                "steps": list(plan.steps),
            }
        return out

    def portable(self) -> Answer:
        """This answer without the model's tensor list, for sending between processes."""
        if not self.model.tensors:
            return self
        return replace(self, model=replace(self.model, tensors=()))


def model_file(model: ModelSource | None, model_path: str | None = None) -> str:
    """The GGUF a command loads: ``model_path``, else the model's own file, else a placeholder to
    edit (a Hugging Face model's path is its config.json, which llama.cpp cannot load)."""
    if model_path:
        return model_path
    path = model.path if model is not None else None
    return str(path) if path is not None and path.suffix.lower() == ".gguf" else MODEL_PLACEHOLDER


def placement_of(est: Estimate) -> Placement:
    """Where an estimate runs: all on the GPUs, partly in system memory, on the CPU alone, or nowhere."""
    if not est.fits:
        return "none"
    gpus = [d for d in est.devices if d.kind == "gpu"]
    if not gpus or est.gpu_layers == 0:
        return "cpu"
    if est.gpu_layers < est.n_layer + 1 or est.cpu_moe_layers > 0:
        return "partial"
    return "gpu"


def decode_depth_tokens(controls: Controls, prompt_tokens: int) -> int:
    """Where in a conversation decode speed is quoted: half-way through each user's context (at
    least the prompt)."""
    per_user = controls.context_per_user_tokens
    return max(per_user // 2, min(prompt_tokens, per_user))


def check_request(model: ModelSource, controls: Controls) -> None:
    """Settings no llama.cpp run can have. Raises EstimateError with the reason."""
    arch = model.arch
    n_ctx = controls.n_ctx_tokens
    if n_ctx > 4 * max(arch.n_ctx_train, 1) and n_ctx > 1 << 20:
        raise EstimateError(
            f"A context of {n_ctx:,} tokens is far beyond what {model.label} was trained for "
            f"({arch.n_ctx_train:,}); choose at most {arch.n_ctx_train:,}."
        )
    p = controls.projector
    if p is not None and p.n_embd_text != arch.n_embd:
        # mtmd refuses it: "mismatch between text model (n_embd = ...) and mmproj".
        raise EstimateError(
            f"The vision projector {p.name} outputs width {p.n_embd_text}, but {model.label} takes {arch.n_embd}: "
            "it belongs to another model (llama-server refuses it)."
        )


def place(
    model: ModelSource,
    targets: Sequence[Target],
    controls: Controls,
    repack: RepackProfile = "x86-avx2",
    cpu_moe_hint: int | None = None,
) -> tuple[Estimate, FitPlan | None]:
    """The placed estimate for ``controls`` (see the module docstring), with auto-fit's plan when
    it chose the placement. Raises EstimateError for settings llama.cpp refuses."""
    arch, tensors = model.arch, model.tensors
    has_gpu = any(t.kind == "gpu" for t in targets)
    if controls.gpu_layers != "auto" or not has_gpu:
        layers = controls.gpu_layers if has_gpu and controls.gpu_layers != "auto" else "all"
        return estimate(arch, tensors, controls.settings(repack, layers if has_gpu else "all"), list(targets)), None
    settings = controls.settings(repack)
    plan = auto_fit(
        arch,
        tensors,
        settings,
        list(targets),
        controls.fit_margin_mib * MIB,
        fixed_cpu_moe=controls.n_cpu_moe,
        cpu_moe_hint=cpu_moe_hint,
    )
    if plan.estimate.fits:
        return plan.estimate, plan
    # Nothing that fits: every layer on the GPUs, which says how far they are from enough.
    return estimate(arch, tensors, settings, list(targets)), plan


def answer(
    model: ModelSource,
    targets: Sequence[Target],
    controls: Controls,
    *,
    repack: RepackProfile = "x86-avx2",
    prompt_tokens: int = 512,
    efficiency: Mapping[str, float] | None = None,
    limits: bool = True,
    most_gpu_layers: bool = False,
    cpu_moe_hint: int | None = None,
) -> Answer:
    """The one estimate (module docstring). ``efficiency`` maps a target name to a decode
    efficiency measured on this machine; ``limits`` computes :class:`Limits` (a few dozen more
    estimates); ``most_gpu_layers`` adds the most layers the GPUs hold with no margin;
    ``cpu_moe_hint`` speeds up auto-fit without changing its answer. Raises EstimateError."""
    check_request(model, controls)
    est, plan = place(model, targets, controls, repack, cpu_moe_hint)
    hidden = plan is not None and plan.gpus_hidden and plan.estimate.fits
    placed_targets = tuple(t for t in targets if t.kind == "cpu") if hidden else tuple(targets)
    has_gpu = any(t.kind == "gpu" for t in placed_targets)
    speed = estimate_speed(
        model.arch,
        model.tensors,
        est,
        list(placed_targets),
        prompt_tokens=min(prompt_tokens, est.settings.context_tokens),
        depth_tokens=decode_depth_tokens(controls, prompt_tokens),
        measured_efficiency=dict(efficiency) if efficiency else None,
        users=controls.users,
    )
    found = compute_limits(model, targets, controls, repack, with_gpu_layers=most_gpu_layers) if limits else None
    return Answer(
        model=model,
        controls=controls,
        targets=placed_targets,
        estimate=est,
        placement=placement_of(est),
        gpu_layers=est.gpu_layers if has_gpu else 0,
        n_cpu_moe=est.cpu_moe_layers,
        gpus_hidden=hidden,
        fit_plan=plan,
        speed=speed,
        limits=found,
    )


# -- limits ----------------------------------------------------------------------------------------


def limit_scope(
    model: ModelSource, targets: Sequence[Target], controls: Controls, repack: RepackProfile = "x86-avx2"
) -> LimitScope:
    """Which rule counts a user or a context as fitting (module docstring)."""
    if not any(t.kind == "gpu" for t in targets):
        return "cpu"
    if controls.gpu_layers != "auto":
        return "fixed"
    shortest = controls.model_copy(update={"users": 1, "context_per_user_tokens": MIN_CONTEXT_TOKENS})
    return "gpu" if _on_gpus(model, targets, shortest, repack) else "any"


def _on_gpus(model: ModelSource, targets: Sequence[Target], controls: Controls, repack: RepackProfile) -> bool:
    """Everything on the GPUs (experts pinned to RAM stay there), the margin kept, host memory enough."""
    est = estimate(model.arch, model.tensors, controls.settings(repack, "all"), list(targets))
    margin = controls.fit_margin_mib * MIB
    gpus_ok = all(d.total_bytes + margin <= d.capacity_bytes for d in est.devices if d.kind == "gpu")
    return gpus_ok and est.fits


def fits_in_scope(
    scope: LimitScope, model: ModelSource, targets: Sequence[Target], controls: Controls, repack: RepackProfile
) -> bool:
    """Whether ``controls`` fit by the rule of ``scope``; False for settings llama.cpp refuses."""
    if controls.n_ctx_tokens > MAX_CONTEXT_TOKENS:
        return False
    try:
        if scope == "gpu":
            return _on_gpus(model, targets, controls, repack)
        if scope == "any":
            est, _ = place(model, targets, controls, repack)
            return est.fits
        layers = controls.gpu_layers if scope == "fixed" else "all"
        return estimate(model.arch, model.tensors, controls.settings(repack, layers), list(targets)).fits
    except EstimateError:
        return False


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] with fits(n) (fits shrinks as n grows); low - 1 when none."""
    if not fits(low):
        return low - 1
    if fits(high):
        return high
    lo, hi = low, high
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def users_that_fit(
    model: ModelSource,
    targets: Sequence[Target],
    controls: Controls,
    repack: RepackProfile = "x86-avx2",
    scope: LimitScope | None = None,
) -> int:
    """Users, each with ``controls.context_per_user_tokens``, that fit (0..MAX_USERS)."""
    scope = scope or limit_scope(model, targets, controls, repack)
    per_user = controls.context_per_user_tokens

    def fits(n: int) -> bool:
        at = controls.model_copy(update={"users": n, "kv_unified": False})
        return per_user * n <= MAX_CONTEXT_TOKENS and fits_in_scope(scope, model, targets, at, repack)

    return max(_largest(fits, 1, MAX_USERS), 0)


def largest_context_per_user(
    model: ModelSource,
    targets: Sequence[Target],
    controls: Controls,
    repack: RepackProfile = "x86-avx2",
    scope: LimitScope | None = None,
) -> int:
    """The largest context per user (a multiple of 256, up to the trained context) that fits for
    ``controls.users`` users; 0 when not even 256 tokens do."""
    scope = scope or limit_scope(model, targets, controls, repack)
    top = min(model.arch.n_ctx_train, MAX_CONTEXT_TOKENS // controls.users) // 256
    if top < 1:
        return 0

    def fits(blocks: int) -> bool:
        at = controls.model_copy(update={"context_per_user_tokens": blocks * 256})
        return fits_in_scope(scope, model, targets, at, repack)

    return max(_largest(fits, 1, top), 0) * 256


def compute_limits(
    model: ModelSource,
    targets: Sequence[Target],
    controls: Controls,
    repack: RepackProfile = "x86-avx2",
    with_gpu_layers: bool = False,
) -> Limits:
    scope = limit_scope(model, targets, controls, repack)
    most = None
    if with_gpu_layers and any(t.kind == "gpu" for t in targets):
        most = max_gpu_layers(model.arch, model.tensors, controls.settings(repack), list(targets))
    return Limits(
        scope=scope,
        users_that_fit=users_that_fit(model, targets, controls, repack, scope),
        largest_context_per_user_tokens=largest_context_per_user(model, targets, controls, repack, scope),
        most_gpu_layers=most,
    )
