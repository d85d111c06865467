"""vLLM across several nodes: tensor parallelism inside each node, pipeline parallelism across them.

What vLLM does, read from its source (V1 engine) and followed here:

- **Layers per stage.** ``get_pp_indices`` (``vllm/distributed/utils.py``) gives every stage
  n_layer // P decoder layers and hands the remainder out one layer each to the stages counted
  from the second-to-last backwards (the last stage already carries the final norm and the LM
  head); ``VLLM_PP_LAYER_PARTITION`` overrides it. :func:`pipeline_layer_partition` is that rule.
- **What else each stage builds.** A model that supports pipeline parallelism puts a
  ``PPMissingLayer`` in place of what its stage does not hold (``LlamaModel.__init__`` and its
  kin in ``vllm/model_executor/models/``): the token embedding exists on the first stage only
  (and on the last when the LM head is tied to it: the last stage keeps its own copy), the final
  norm and the LM head on the last stage only. Each GPU of a stage holds 1/TP of those tensors,
  as in :func:`app.core.plans.vllm_memory.vllm_weights_per_gpu`.
- **Profiling.** ``GPUModelRunner.profile_run`` runs the dummy sampler on the last stage only; every
  other stage keeps a buffer for the hidden state it receives (``_dummy_run``:
  ``make_empty_intermediate_tensors``) (:func:`app.core.plans.vllm_memory.vllm_activation_bytes`).
- **KV cache.** Each worker turns what its own budget leaves into blocks for its own layers, so
  the stages differ; ``get_kv_cache_configs`` (``vllm/v1/core/kv_cache_utils.py``) then sets every
  worker to the smallest block count of all ("Change the num_blocks of each rank to the smallest
  among all ranks") and shrinks their tensors to match. The plan's KV cache is that minimum, and
  each worker checks on its own that one request of ``max_model_len`` fits
  (``_check_enough_kv_cache_memory``).
- **Between stages** the models pass ``IntermediateTensors`` of ``hidden_states`` and ``residual``
  (:func:`app.core.plans.vllm_memory.vllm_pipeline_state_bytes`); ``GroupCoordinator.send_tensor_dict``
  (``vllm/distributed/parallel_state.py``) has each tensor-parallel rank send 1/TP of it and the
  receivers all-gather it.

The cluster is Ray's: ``ray start --head`` on one node, ``ray start --address=HEAD:PORT`` on the
others, then one ``vllm serve`` on the head node with --pipeline-parallel-size (vLLM's
docs/serving/parallelism_scaling.md). The per-GPU accounting is :mod:`app.core.plans.vllm_memory`'s and
the flags are :class:`app.core.plans.vllm.VllmRequest`'s, shared with the single-node plan; with one node
the plan is :func:`app.core.plans.vllm.vllm_plan`'s. No multi-node run was measured for this: the
figures are the single-node model's, stage by stage.

All byte figures are integers (bytes); nothing here imports Qt.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any

from app.core.common.errors import EstimateError
from app.core.common.units import KIB, MIB
from app.core.hardware.devices import DeviceSpec
from app.core.model.architecture import Architecture
from app.core.plans.rpc import NetworkLink
from app.core.plans.vllm import VllmRequest, VllmServing, vllm_notes, vllm_request
from app.core.plans.vllm_memory import (
    VllmGpu,
    gib_figure,
    kv_blocks,
    start_problems,
    vllm_activation_bytes,
    vllm_gpu,
    vllm_kv_bytes_per_token,
    vllm_non_torch_bytes,
    vllm_pipeline_state_bytes,
    vllm_weights_per_gpu,
)

RAY_HEAD_PORT = 6379  # ray start --head's default port, as vLLM's multi-node examples use it
NETWORK_NEGLIGIBLE_SHARE = 0.05
"""The network's time per decode step is called negligible at this share of the step or less."""


def pipeline_layer_partition(n_layer: int, pipeline_parallel_size: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage, first stage first, as vLLM's ``get_pp_indices`` splits
    them without VLLM_PP_LAYER_PARTITION: n_layer // P each, and one more for each of the
    n_layer % P stages counted from the second-to-last backwards (80 layers over 3 stages: 27, 27,
    26). Raises EstimateError for fewer layers than stages."""
    if pipeline_parallel_size < 1:
        raise EstimateError("Pipeline parallelism needs at least one node.")
    if n_layer < pipeline_parallel_size:
        raise EstimateError(
            f"{n_layer} layers cannot be spread over {pipeline_parallel_size} pipeline stages: every node "
            "needs at least one layer."
        )
    base, remainder = divmod(n_layer, pipeline_parallel_size)
    layers = [base] * pipeline_parallel_size
    for k in range(remainder):
        layers[pipeline_parallel_size - 2 - k] += 1
    return tuple(layers)


@dataclass(frozen=True)
class VllmStage:
    """One pipeline stage: a node whose GPUs (tensor parallel) hold decoder layers
    ``start_layer`` to ``end_layer - 1``. ``stage_gpu_blocks`` is what this stage's own KV budget
    holds; vLLM uses the smallest of all stages everywhere, which is what each GPU's
    ``kv_cache_bytes`` holds."""

    index: int
    start_layer: int
    end_layer: int
    holds_embedding: bool
    holds_lm_head: bool
    """The final norm and the LM head (with tied embeddings, the last stage's own embedding copy)."""
    kv_bytes_per_token: int
    """On each GPU of the stage, for its layers only."""
    block_bytes: int
    stage_gpu_blocks: int
    gpus: tuple[VllmGpu, ...]
    problems: tuple[str, ...]
    """Why this stage's workers would not start, in vLLM's words; empty when they start."""

    @property
    def layers(self) -> int:
        return self.end_layer - self.start_layer

    @property
    def weights_bytes(self) -> int:
        """On each GPU of the stage."""
        return self.gpus[0].weights_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start_layer": self.start_layer,
            "end_layer": self.end_layer,
            "layers": self.layers,
            "holds_embedding": self.holds_embedding,
            "holds_lm_head": self.holds_lm_head,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_bytes": self.block_bytes,
            "stage_gpu_blocks": self.stage_gpu_blocks,
            "gpus": [g.to_json() for g in self.gpus],
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class VllmMultinodePlan(VllmServing):
    """vLLM serving ``model_id`` on ``pipeline_parallel_size`` nodes of ``tensor_parallel_size``
    identical GPUs: tensor parallelism inside each node, one pipeline stage per node.
    ``num_gpu_blocks`` is the smallest of the stages' block counts: what every worker allocates;
    ``command`` is ``vllm serve`` on the head node."""

    pipeline_parallel_size: int
    stages: tuple[VllmStage, ...]
    ray_head_command: str | None
    """On the head node, before ``command``; None with one node (no Ray cluster needed)."""
    ray_worker_command: str | None
    """On every other node."""
    link: NetworkLink
    state_bytes_per_token: int
    """What one token's hidden state takes from one stage to the next (hidden_states + residual)."""
    decode_step_seconds: float
    """A lower bound on one decode step: every stage reads its GPUs' weights once at the GPU's bandwidth."""

    @property
    def gpus(self) -> tuple[VllmGpu, ...]:
        """Every GPU of every node, node by node."""
        return tuple(g for s in self.stages for g in s.gpus)

    @property
    def limiting_stage(self) -> VllmStage:
        """The stage whose own KV budget holds the fewest blocks: it sets everyone's KV cache."""
        return min(self.stages, key=lambda s: s.stage_gpu_blocks)

    @property
    def stage_boundaries(self) -> int:
        return self.pipeline_parallel_size - 1

    @property
    def decode_state_bytes(self) -> int:
        """Bytes crossing each stage boundary in a decode step of ``max_num_seqs`` sequences."""
        return self.state_bytes_per_token * self.max_num_seqs

    @property
    def prefill_state_bytes(self) -> int:
        """Bytes crossing each stage boundary in a prefill step of ``max_num_batched_tokens`` tokens."""
        return self.state_bytes_per_token * self.max_num_batched_tokens

    @property
    def network_seconds_per_step(self) -> float:
        """What the network adds to a decode step of ``max_num_seqs`` sequences over ``link``: per
        stage boundary one round trip and the hidden states at the link's speed."""
        return self.stage_boundaries * _transfer_seconds(self.decode_state_bytes, self.link)

    @property
    def negligible_link_gbit_s(self) -> float | None:
        """The link speed that keeps the network at NETWORK_NEGLIGIBLE_SHARE of the decode step or
        less (at ``link``'s round trip); 0 with one node, None when the round trips alone exceed it."""
        if self.stage_boundaries == 0:
            return 0.0
        room = NETWORK_NEGLIGIBLE_SHARE * self.decode_step_seconds / self.stage_boundaries - self.link.rtt_ms / 1000
        if room <= 0:
            return None
        return self.decode_state_bytes * 8 / room / 1e9

    def to_json(self) -> dict[str, Any]:
        return {
            **self._settings_json({"pipeline_parallel_size": self.pipeline_parallel_size}),
            "num_gpu_blocks": self.num_gpu_blocks,
            "limiting_stage": self.limiting_stage.index,
            **self._capacity_json(),
            "stages": [s.to_json() for s in self.stages],
            "network": {
                "link": self.link.model_dump(),
                "state_bytes_per_token": self.state_bytes_per_token,
                "decode_state_bytes": self.decode_state_bytes,
                "prefill_state_bytes": self.prefill_state_bytes,
                "network_seconds_per_step": self.network_seconds_per_step,
                "decode_step_seconds": self.decode_step_seconds,
                "negligible_link_gbit_s": self.negligible_link_gbit_s,
            },
            "notes": list(self.notes),
            "ray_head_command": self.ray_head_command,
            "ray_worker_command": self.ray_worker_command,
            "command": self.command,
        }

    def summary_lines(self) -> list[str]:
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        lines = [
            f"vLLM runs {self.model_name} ({self.serving_format}) on {pp} nodes x {tp} x {self.gpu_name}: "
            + (f"tensor parallelism over the {tp} GPUs of each node, " if tp > 1 else "one GPU per node, ")
            + "pipeline parallelism across the nodes (each node holds a run of layers)."
            if pp > 1
            else f"vLLM runs {self.model_name} ({self.serving_format}) on one node of {tp} x {self.gpu_name} with "
            "tensor parallelism alone (no pipeline stages).",
        ]
        for s in self.stages:
            g = s.gpus[0]
            extra = [
                part for part, held in (("token embedding", s.holds_embedding), ("LM head", s.holds_lm_head)) if held
            ]
            lines.append(
                f"Node {s.index}: layers {s.start_layer}-{s.end_layer - 1} ({s.layers})"
                f"{' and the ' + ' and the '.join(extra) if extra else ''}; each GPU: weights "
                f"{gib_figure(g.weights_bytes)} + activation peak {gib_figure(g.activation_bytes)} + non-torch "
                f"{gib_figure(g.non_torch_bytes)} + KV cache {gib_figure(g.kv_cache_bytes)} GiB of the "
                f"{gib_figure(g.budget_bytes)} GiB budget ({s.stage_gpu_blocks:,} blocks of its own)."
            )
        if self.num_gpu_blocks > 0:
            lines.append(
                f"KV cache: {self.num_gpu_blocks:,} blocks of {self.block_size} tokens = {self.kv_cache_tokens:,} "
                f"tokens{f', the smallest of the nodes (node {self.limiting_stage.index})' if pp > 1 else ''}; "
                f"{self.max_concurrency:.2f}x concurrency at {self.max_model_len:,} tokens per request."
            )
        if pp > 1:
            need = self.negligible_link_gbit_s
            lines.append(
                f"Network: {self.decode_state_bytes / MIB:.2f} MiB per decode step of {self.max_num_seqs} sequences "
                f"across {'the boundary' if pp == 2 else f'each of the {self.stage_boundaries} boundaries'} between "
                f"nodes, {self.network_seconds_per_step * 1000:.2f} ms in all at {self.link.gbit_s:g} Gbit/s against a "
                "decode step of at least "
                f"{self.decode_step_seconds * 1000:.2f} ms; "
                + (
                    f"{need:,.0f} Gbit/s keeps it under {NETWORK_NEGLIGIBLE_SHARE:.0%}."
                    if need is not None
                    else f"the {self.link.rtt_ms:g} ms round trips alone exceed {NETWORK_NEGLIGIBLE_SHARE:.0%}."
                )
            )
        lines.append(self.outcome_line())
        return lines


def _transfer_seconds(nbytes: int, link: NetworkLink) -> float:
    """One round trip and ``nbytes`` at the link's speed."""
    return link.rtt_ms / 1000 + nbytes * 8 / (link.gbit_s * 1e9)


def vllm_multinode_plan(
    arch: Architecture,
    gpu: DeviceSpec,
    gpus_per_node: int,
    nodes: int,
    *,
    dtype: str = "FP16",
    max_model_len: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = 0.9,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    max_num_batched_tokens: int | None = None,
    model: str | None = None,
    head_address: str = "HEAD_IP",
    link: NetworkLink | None = None,
) -> VllmMultinodePlan:
    """vLLM's plan for ``arch`` on ``nodes`` nodes of ``gpus_per_node`` copies of ``gpu``:
    --tensor-parallel-size ``gpus_per_node``, --pipeline-parallel-size ``nodes``.

    The arguments are :func:`app.core.plans.vllm.vllm_plan`'s; ``head_address`` is the head node's
    address in the Ray commands, ``link`` the network between nodes (default: NetworkLink's).
    Per stage: its layers (``get_pp_indices``), and per GPU the weights of those layers (plus the
    embedding on the first stage, the final norm and LM head on the last), the activation peak,
    non-torch memory, the KV budget and the KV cache; the plan's KV cache is the smallest stage's.
    With ``nodes`` = 1 every figure and the command are vllm_plan's.

    Raises EstimateError for what vllm_plan refuses (the same messages: heads not divisible by
    ``gpus_per_node``, unknown dtype, ...), for fewer than one node, for fewer layers than nodes
    and for an empty head address. Memory shortfalls are not errors: ``problems`` says, in vLLM's
    words, why it would not start and on which node.
    """
    request = vllm_request(
        arch,
        gpu,
        gpus_per_node,
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        model=model,
    )
    partition = pipeline_layer_partition(arch.n_layer, nodes)
    if not head_address.strip():
        raise EstimateError("The head node's address is empty.")
    link = link or NetworkLink()
    tp = gpus_per_node
    stages: list[VllmStage] = []
    start = 0
    for k, count in enumerate(partition):
        stages.append(_stage(arch, gpu, request, tp, nodes, k, range(start, start + count)))
        start += count
    blocks = min(s.stage_gpu_blocks for s in stages)
    # get_kv_cache_configs: every worker allocates the smallest block count, its tensors shrunk to it.
    stages = [replace(s, gpus=tuple(replace(g, kv_cache_bytes=blocks * s.block_bytes) for g in s.gpus)) for s in stages]
    bandwidth = gpu.bandwidth_gb_s * 1e9
    head = f"{head_address.strip()}:{RAY_HEAD_PORT}"
    plan = VllmMultinodePlan(
        **request.plan_fields(),
        model_name=arch.name,
        gpu_name=gpu.name,
        tensor_parallel_size=tp,
        pipeline_parallel_size=nodes,
        total_weights_bytes=sum(s.weights_bytes for s in stages) * tp,
        num_gpu_blocks=blocks,
        stages=tuple(stages),
        problems=_plan_problems(stages),
        notes=(),
        ray_head_command=f"ray start --head --port={RAY_HEAD_PORT}" if nodes > 1 else None,
        ray_worker_command=f"ray start --address={shlex.quote(head)}" if nodes > 1 else None,
        command=request.serve_command(tp, nodes),
        link=link,
        state_bytes_per_token=vllm_pipeline_state_bytes(arch, 1),
        decode_step_seconds=sum(s.weights_bytes for s in stages) / bandwidth,
    )
    return replace(plan, notes=tuple(vllm_notes(arch, tp, request, tp * nodes) + _pipeline_notes(arch, plan)))


def _stage(
    arch: Architecture, gpu: DeviceSpec, request: VllmRequest, tp: int, nodes: int, k: int, layers: range
) -> VllmStage:
    """Stage ``k`` of ``nodes``, holding decoder ``layers``, with its own block count."""
    first, last = k == 0, k == nodes - 1
    per_token = vllm_kv_bytes_per_token(arch, tp, request.kv_dtype_bytes, layers=layers)
    block_bytes = per_token * request.block_size
    line = vllm_gpu(
        gpu.capacity_bytes,
        request.gpu_memory_utilization,
        weights_bytes=vllm_weights_per_gpu(
            arch, request.serving_format, tp, layers=layers, first_stage=first, last_stage=last
        ),
        activation_bytes=vllm_activation_bytes(
            arch, tp, request.max_num_batched_tokens, request.max_num_seqs, first_stage=first, last_stage=last
        ),
        non_torch_bytes=vllm_non_torch_bytes(tp * nodes),
        block_bytes=block_bytes,
    )
    blocks = kv_blocks(line.kv_budget_bytes, block_bytes)
    problems = start_problems(
        arch, line, request.max_model_len, request.block_size, block_bytes, blocks, request.gpu_memory_utilization
    )
    return VllmStage(
        index=k,
        start_layer=layers.start,
        end_layer=layers.stop,
        holds_embedding=first or (last and arch.tied_embeddings),
        holds_lm_head=last,
        kv_bytes_per_token=per_token,
        block_bytes=block_bytes,
        stage_gpu_blocks=blocks,
        gpus=tuple(replace(line, name=f"GPU {i}" if nodes == 1 else f"Node {k} GPU {i}") for i in range(tp)),
        problems=tuple(problems),
    )


def _plan_problems(stages: list[VllmStage]) -> tuple[str, ...]:
    """The stages' problems in stage order: a message every stage gives once as it is, the others
    once per stage, saying which node."""
    if len(stages) == 1:
        return stages[0].problems
    everywhere = set.intersection(*(set(s.problems) for s in stages))
    out: list[str] = [p for p in stages[0].problems if p in everywhere]
    for s in stages:
        out += [
            f"Node {s.index} (layers {s.start_layer}-{s.end_layer - 1}): {p}" for p in s.problems if p not in everywhere
        ]
    return tuple(out)


def _pipeline_notes(arch: Architecture, plan: VllmMultinodePlan) -> list[str]:
    if plan.pipeline_parallel_size == 1:
        return []
    tp, pp = plan.tensor_parallel_size, plan.pipeline_parallel_size
    split = "/".join(str(s.layers) for s in plan.stages)
    out = [
        f"Layers per node {split}, as vLLM's get_pp_indices splits {arch.n_layer} layers over {pp} stages"
        + (
            " (the remainder goes to the nodes before the last, counted backwards); VLLM_PP_LAYER_PARTITION "
            "overrides it."
            if arch.n_layer % pp
            else "."
        ),
        "The first node holds the token embedding, the last the final norm and the LM head"
        + (" and its own copy of the tied embedding" if arch.tied_embeddings else "")
        + "; only the last runs the sampler, so its activation peak is the largest.",
    ]
    limiting = plan.limiting_stage
    spare = [s for s in plan.stages if s.stage_gpu_blocks > limiting.stage_gpu_blocks]
    if spare and plan.num_gpu_blocks > 0:
        most = max(spare, key=lambda s: s.gpus[0].kv_budget_bytes - s.gpus[0].kv_cache_bytes)
        g = most.gpus[0]
        out.append(
            f"Each node sizes its KV blocks from its own memory and vLLM uses the smallest count on all of them "
            f"(get_kv_cache_configs): node {limiting.index} sets it; node {most.index} leaves "
            f"{gib_figure(g.kv_budget_bytes - g.kv_cache_bytes)} GiB of its KV budget per GPU unused."
        )
    if tp == 1:
        out.append(
            "Non-torch memory with pipeline parallelism alone is assumed to be the tensor-parallel allowance "
            "(NCCL's buffers for the stage-to-stage sends); not measured."
        )
    need = plan.negligible_link_gbit_s
    share = f"{NETWORK_NEGLIGIBLE_SHARE:.0%}"
    out += [
        "Every node needs the model files at the same path (download them to the same directory on each, or use "
        "a shared file system) and the same vLLM and Python packages; set VLLM_HOST_IP to each node's address on "
        "a private network.",
        f"Between nodes vLLM sends the hidden state and the residual, 2 x {arch.n_embd:,} x 2 bytes = "
        f"{plan.state_bytes_per_token / KIB:g} KiB per token, once per token and stage boundary: "
        f"{plan.decode_state_bytes / MIB:.2f} MiB per decode step of {plan.max_num_seqs} sequences, "
        f"{plan.prefill_state_bytes / MIB:.0f} MiB per prefill step of {plan.max_num_batched_tokens:,} tokens "
        f"({_transfer_seconds(plan.prefill_state_bytes, plan.link) * 1000:.1f} ms at {plan.link.gbit_s:g} Gbit/s). "
        + (
            f"At {need:,.0f} Gbit/s or more ({plan.link.rtt_ms:g} ms round trip) the decode transfers stay under "
            f"{share} of a decode step (at least {plan.decode_step_seconds * 1000:.2f} ms: every weight read once at "
            f"{plan.gpu_name}'s bandwidth); each of a node's {tp} GPUs sends 1/{tp} of it, so {tp} links of "
            f"{need / tp:,.0f} Gbit/s do as well."
            if need is not None
            else f"Round trips of {plan.link.rtt_ms:g} ms alone exceed {share} of a decode step (at least "
            f"{plan.decode_step_seconds * 1000:.2f} ms): the network is not negligible at any speed."
        ),
    ]
    return out
