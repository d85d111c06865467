"""vLLM across nodes: tensor parallelism inside each node, pipeline parallelism across them."""

from __future__ import annotations

import json

import pytest

from app.core.common.errors import EstimateError
from app.core.common.units import GIB, MIB
from app.core.model.catalog import find_device, find_model
from app.core.model.quant import find_serving_format, serving_weights_bytes
from app.core.plans.rpc import NetworkLink
from app.core.plans.vllm import vllm_plan
from app.core.plans.vllm_memory import vllm_activation_bytes, vllm_weights_per_gpu
from app.core.plans.vllm_pipeline import NETWORK_NEGLIGIBLE_SHARE, pipeline_layer_partition, vllm_multinode_plan

H100 = find_device("h100-sxm")
A100 = find_device("a100-80gb")
RTX_4090 = find_device("rtx-4090")


@pytest.mark.parametrize(
    ("n_layer", "stages", "layers"),
    [
        # vLLM's own cases (tests/distributed/test_pipeline_partition.py, test_uneven_auto_partition).
        (2, 2, (1, 1)),
        (3, 2, (2, 1)),
        (3, 3, (1, 1, 1)),
        (4, 3, (1, 2, 1)),
        (5, 3, (2, 2, 1)),
        # The remainder goes to the stages before the last, from the second-to-last backwards.
        (126, 2, (63, 63)),
        (80, 3, (27, 27, 26)),
        (80, 6, (13, 13, 13, 14, 14, 13)),
    ],
)
def test_layers_are_partitioned_as_get_pp_indices_does(n_layer: int, stages: int, layers: tuple[int, ...]) -> None:
    assert pipeline_layer_partition(n_layer, stages) == layers


@pytest.mark.parametrize(
    ("model_id", "gpu_id", "tp", "kwargs"),
    [
        ("llama-3.1-70b", "a100-80gb", 4, {}),
        ("llama-3.1-70b", "a100-80gb", 2, {"max_model_len": 131072}),  # does not start: same message
        ("llama-3.1-405b", "h100-sxm", 8, {"dtype": "FP8", "kv_cache_dtype": "fp8"}),
        ("llama-3.1-8b", "a100-80gb", 2, {"dtype": "AWQ-4bit", "max_num_seqs": 64}),
        ("qwen3-0.6b", "rtx-4090", 1, {"block_size": 32}),
        ("deepseek-v2-lite", "a100-80gb", 2, {"max_num_seqs": 64}),
    ],
)
def test_one_node_is_the_single_node_plan(model_id: str, gpu_id: str, tp: int, kwargs: dict) -> None:
    arch, gpu = find_model(model_id), find_device(gpu_id)
    args = {"max_model_len": 8192, "max_num_seqs": 256} | kwargs
    single = vllm_plan(arch, gpu, tp, **args)
    plan = vllm_multinode_plan(arch, gpu, tp, 1, **args)
    assert plan.gpus == single.gpus  # every per-GPU figure, names included
    (stage,) = plan.stages
    assert (stage.start_layer, stage.end_layer) == (0, arch.n_layer)
    assert stage.holds_embedding and stage.holds_lm_head
    assert stage.kv_bytes_per_token == single.kv_bytes_per_token and stage.block_bytes == single.block_bytes
    assert plan.num_gpu_blocks == single.num_gpu_blocks and plan.kv_cache_tokens == single.kv_cache_tokens
    assert plan.total_weights_bytes == single.total_weights_bytes
    assert plan.problems == single.problems and plan.notes == single.notes
    assert plan.command == single.command
    assert plan.ray_head_command is None and plan.ray_worker_command is None
    assert plan.network_seconds_per_step == 0 and plan.negligible_link_gbit_s == 0
    shared = set(single.to_json()) - {"gpus", "kv_bytes_per_token", "block_bytes"}
    assert {k: plan.to_json()[k] for k in shared} == {k: single.to_json()[k] for k in shared}


@pytest.fixture(scope="module")
def plan_405b():
    """Llama 3.1 405B at FP8 on 2 nodes of 8 H100 80GB."""
    return vllm_multinode_plan(
        find_model("llama-3.1-405b"),
        H100,
        8,
        2,
        dtype="FP8",
        max_model_len=8192,
        max_num_seqs=256,
        head_address="10.0.0.1",
    )


def test_405b_on_two_h100_nodes_splits_its_layers_and_weights(plan_405b) -> None:
    arch = find_model("llama-3.1-405b")
    first, last = plan_405b.stages
    assert (plan_405b.tensor_parallel_size, plan_405b.pipeline_parallel_size) == (8, 2)
    assert [(s.start_layer, s.end_layer) for s in plan_405b.stages] == [(0, 63), (63, 126)]
    assert (first.holds_embedding, first.holds_lm_head) == (True, False)
    assert (last.holds_embedding, last.holds_lm_head) == (False, True)
    assert [g.name for g in plan_405b.gpus] == [f"Node {k} GPU {i}" for k in (0, 1) for i in range(8)]

    # The first node's GPUs hold 1/8 of the embedding (128,256 rows / 8 = 16,032), the last node's
    # 1/8 of the LM head (the same size) and the final norm (16,384 x 2 bytes, on every GPU).
    assert last.weights_bytes - first.weights_bytes == 16384 * 2
    embedding_shard = 16032 * 16384 * 2
    fp8 = find_serving_format("FP8")
    assert first.weights_bytes == vllm_weights_per_gpu(arch, fp8, 8, layers=range(63), last_stage=False)
    assert first.weights_bytes - embedding_shard == pytest.approx(
        vllm_weights_per_gpu(arch, fp8, 8, layers=range(63, 126), first_stage=False, last_stage=False), abs=1
    )
    # Every tensor is on exactly one node: the 16 GPUs hold what 8 GPUs of one node would (to the byte
    # lost in rounding each GPU's sum), about the 410 GB of the FP8 checkpoint, norms counted per GPU.
    one_node = vllm_weights_per_gpu(arch, fp8, 8)
    assert plan_405b.total_weights_bytes == 8 * (first.weights_bytes + last.weights_bytes)
    assert abs(plan_405b.total_weights_bytes - 8 * one_node) <= 16
    assert plan_405b.total_weights_bytes == pytest.approx(serving_weights_bytes(arch, fp8), rel=0.001)
    assert plan_405b.total_weights_bytes / 1e9 == pytest.approx(410.5, abs=0.1)
    assert first.weights_bytes / GIB == pytest.approx(23.89, abs=0.01)


def test_405b_kv_cache_is_the_smallest_stage(plan_405b) -> None:
    first, last = plan_405b.stages
    # 63 layers x 8 KV heads / 8 GPUs x 128 x (K + V) x 2 bytes on every GPU of either node.
    assert first.kv_bytes_per_token == last.kv_bytes_per_token == 63 * 1 * 128 * 2 * 2 == 32256
    # Only the last node samples (256 sequences over the 128,256-entry vocabulary) and it keeps a
    # buffer for the 8,192 hidden states and residuals it receives: the largest activation peak.
    arch = find_model("llama-3.1-405b")
    assert first.gpus[0].activation_bytes == vllm_activation_bytes(arch, 8, 8192, 256, last_stage=False)
    assert last.gpus[0].activation_bytes == vllm_activation_bytes(arch, 8, 8192, 256) + 2 * 8192 * 16384 * 2
    assert last.stage_gpu_blocks < first.stage_gpu_blocks
    assert plan_405b.limiting_stage is last
    assert plan_405b.num_gpu_blocks == min(first.stage_gpu_blocks, last.stage_gpu_blocks) == 92981
    assert plan_405b.kv_cache_tokens == 92981 * 16 == 1_487_696
    # vLLM sets every worker to the smallest block count: node 0 leaves part of its KV budget unused.
    for s in plan_405b.stages:
        assert all(g.kv_cache_bytes == 92981 * s.block_bytes for g in s.gpus)
    spare = first.gpus[0].kv_budget_bytes - first.gpus[0].kv_cache_bytes
    assert spare > (first.stage_gpu_blocks - 92981) * first.block_bytes
    assert plan_405b.starts and plan_405b.max_concurrent_sequences == 181
    assert any("node 1 sets it" in n for n in plan_405b.notes)


def test_405b_commands(plan_405b) -> None:
    assert plan_405b.ray_head_command == "ray start --head --port=6379"
    assert plan_405b.ray_worker_command == "ray start --address=10.0.0.1:6379"
    cmd = plan_405b.command.split()
    assert cmd[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-405B"]
    for flag, value in (
        ("--tensor-parallel-size", "8"),
        ("--pipeline-parallel-size", "2"),
        ("--distributed-executor-backend", "ray"),
        ("--quantization", "fp8"),
    ):
        assert cmd[cmd.index(flag) + 1] == value, flag
    # Every other flag is the single-node command's, built in the same place.
    single = vllm_plan(find_model("llama-3.1-405b"), H100, 8, dtype="FP8", max_model_len=8192, max_num_seqs=256)
    assert plan_405b.command.replace(" --pipeline-parallel-size 2 --distributed-executor-backend ray", "") == (
        single.command
    )
    assert any("model files at the same path" in n for n in plan_405b.notes)


def test_405b_network_between_the_nodes(plan_405b) -> None:
    # hidden_states + residual: 2 x 16,384 x 2 bytes per token; 256 sequences per decode step.
    assert plan_405b.state_bytes_per_token == 65536
    assert plan_405b.decode_state_bytes == 256 * 65536 == 16 * MIB
    assert plan_405b.prefill_state_bytes == 8192 * 65536
    # At the default 10 Gbit/s and 0.2 ms round trip: 13.6 ms against a decode step of at least
    # 15.3 ms (each node's GPUs read their 25.7 GB of weights at 3,350 GB/s).
    assert plan_405b.link == NetworkLink()
    assert plan_405b.network_seconds_per_step == pytest.approx(0.0002 + 16 * MIB * 8 / 10e9)
    assert plan_405b.decode_step_seconds == pytest.approx(2 * 25.657e9 / 3350e9, rel=1e-4)
    need = plan_405b.negligible_link_gbit_s
    assert need == pytest.approx(237, abs=1)
    faster = vllm_multinode_plan(
        find_model("llama-3.1-405b"),
        H100,
        8,
        2,
        dtype="FP8",
        max_model_len=8192,
        max_num_seqs=256,
        link=NetworkLink(gbit_s=need, rtt_ms=0.2),
    )
    assert faster.network_seconds_per_step == pytest.approx(NETWORK_NEGLIGIBLE_SHARE * faster.decode_step_seconds)
    assert faster.num_gpu_blocks == plan_405b.num_gpu_blocks  # the link changes no memory figure
    slow = vllm_multinode_plan(
        find_model("llama-3.1-405b"),
        H100,
        8,
        2,
        dtype="FP8",
        max_model_len=8192,
        max_num_seqs=256,
        link=NetworkLink(gbit_s=100, rtt_ms=1.0),
    )
    assert slow.negligible_link_gbit_s is None  # a 1 ms round trip alone is over 5% of 15.3 ms
    assert any("not negligible at any speed" in n for n in slow.notes)


def test_70b_fp16_needs_two_nodes_of_24gb_gpus() -> None:
    arch = find_model("llama-3.1-70b")
    one = vllm_multinode_plan(arch, RTX_4090, 8, 1, max_model_len=131072, max_num_seqs=64)
    two = vllm_multinode_plan(arch, RTX_4090, 8, 2, max_model_len=131072, max_num_seqs=64)
    # One node: 16.43 GiB of weights per GPU leave 4.01 GiB of KV cache, 105,232 tokens.
    assert not one.starts and one.max_concurrent_sequences == 0
    assert one.problems[0].startswith("To serve at least one request with the model's max seq len (131072)")
    assert one.estimated_max_model_len == 105232
    # Two nodes: 40 layers each, half the weights per GPU, four sequences of 131,072 tokens.
    assert [s.layers for s in two.stages] == [40, 40]
    assert two.starts and two.max_concurrent_sequences == 4 and two.kv_cache_tokens == 637_872
    assert two.stages[0].weights_bytes / GIB == pytest.approx(8.21, abs=0.01)
    assert two.stages[0].weights_bytes < one.gpus[0].weights_bytes / 2


def test_a_stage_that_does_not_start_is_named() -> None:
    arch = find_model("llama-3.1-70b")
    base = vllm_multinode_plan(arch, RTX_4090, 4, 2, max_model_len=8192, max_num_seqs=64)
    first, last = base.stages
    # A length just past what the last node's own blocks hold, still within the first node's.
    length = last.stage_gpu_blocks * 16 + 16
    assert length <= first.stage_gpu_blocks * 16
    plan = vllm_multinode_plan(arch, RTX_4090, 4, 2, max_model_len=length, max_num_seqs=64)
    assert plan.stages[0].problems == ()
    (problem,) = plan.problems
    assert problem.startswith(
        f"Node 1 (layers 40-79): To serve at least one request with the model's max seq len ({length})"
    )
    assert f"estimated maximum model length is {last.stage_gpu_blocks * 16}" in problem
    assert "would not start: Node 1" in plan.summary_lines()[-1]


def test_three_nodes_hold_27_27_26_layers() -> None:
    plan = vllm_multinode_plan(find_model("llama-3.1-70b"), A100, 8, 3, max_model_len=8192, max_num_seqs=256)
    assert [(s.start_layer, s.end_layer) for s in plan.stages] == [(0, 27), (27, 54), (54, 80)]
    assert [s.holds_embedding for s in plan.stages] == [True, False, False]
    assert [s.holds_lm_head for s in plan.stages] == [False, False, True]
    # Each node's KV cache counts its own layers: 8 KV heads over 8 GPUs, 128 x (K + V) x 2 bytes.
    assert [s.kv_bytes_per_token for s in plan.stages] == [27 * 512, 27 * 512, 26 * 512]
    assert plan.num_gpu_blocks == min(s.stage_gpu_blocks for s in plan.stages)
    assert plan.stage_boundaries == 2
    assert plan.network_seconds_per_step == pytest.approx(2 * (0.0002 + 256 * 2 * 8192 * 2 * 8 / 10e9))
    assert any("layers per node 27/27/26" in n.lower() and "VLLM_PP_LAYER_PARTITION" in n for n in plan.notes)


def test_tied_embeddings_last_node_keeps_its_own_copy() -> None:
    arch = find_model("qwen3-0.6b")
    assert arch.tied_embeddings
    one = vllm_multinode_plan(arch, RTX_4090, 2, 1, max_model_len=8192, max_num_seqs=64)
    two = vllm_multinode_plan(arch, RTX_4090, 2, 2, max_model_len=8192, max_num_seqs=64)
    first, last = two.stages
    assert first.holds_embedding and last.holds_embedding and last.holds_lm_head
    # The second copy: 151,936 rows / 2 GPUs x 1,024 x 2 bytes on each GPU of the last node.
    assert arch.n_vocab == 151936 and arch.n_embd == 1024
    copy = 151936 // 2 * 1024 * 2
    assert abs(two.total_weights_bytes - one.total_weights_bytes - 2 * copy) <= 4
    assert any("its own copy of the tied embedding" in n for n in two.notes)


def test_invalid_splits_raise_what_vllm_plan_raises() -> None:
    arch = find_model("llama-3.1-8b")
    with pytest.raises(EstimateError) as single:
        vllm_plan(arch, A100, 3, max_model_len=8192, max_num_seqs=256)
    with pytest.raises(EstimateError) as multi:
        vllm_multinode_plan(arch, A100, 3, 2, max_model_len=8192, max_num_seqs=256)
    assert str(multi.value) == str(single.value)
    assert "attention heads (32) must be divisible by tensor parallel size (3)" in str(multi.value)
    with pytest.raises(EstimateError, match="at least one node"):
        vllm_multinode_plan(arch, A100, 2, 0, max_model_len=8192, max_num_seqs=256)
    with pytest.raises(EstimateError, match="32 layers cannot be spread over 33 pipeline stages"):
        vllm_multinode_plan(arch, A100, 2, 33, max_model_len=8192, max_num_seqs=256)
    with pytest.raises(EstimateError, match="address is empty"):
        vllm_multinode_plan(arch, A100, 2, 2, max_model_len=8192, max_num_seqs=256, head_address=" ")


def test_json_and_summary(plan_405b) -> None:
    data = plan_405b.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["pipeline_parallel_size"] == 2 and data["limiting_stage"] == 1
    assert [s["layers"] for s in data["stages"]] == [63, 63]
    for s in data["stages"]:
        for g in s["gpus"]:
            assert all(isinstance(v, int) for k, v in g.items() if k.endswith("_bytes"))
    assert data["kv_cache_tokens"] == 1_487_696
    lines = plan_405b.summary_lines()
    assert all(isinstance(s, str) and s.endswith(".") for s in lines)
    assert lines[1].startswith("Node 0: layers 0-62 (63) and the token embedding; each GPU: weights 23.89")
    assert lines[2].startswith("Node 1: layers 63-125 (63) and the LM head")
    assert "1,487,696 tokens, the smallest of the nodes (node 1)" in lines[3]
    assert "237 Gbit/s keeps it under 5%" in lines[4]


def test_fitscope_plan_nodes_gives_the_multinode_plan_and_its_commands(capsys):
    import json

    from app.cli import main

    args = ["plan", "--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--count", "8", "-c", "131072"]
    assert main([*args, "--nodes", "2", "--head-address", "10.0.0.1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["vllm_multinode"]
    assert plan["tensor_parallel_size"] == 8 and plan["pipeline_parallel_size"] == 2 and plan["starts"]
    assert [s["layers"] for s in plan["stages"]] == [40, 40]
    assert plan["ray_worker_command"] == "ray start --address=10.0.0.1:6379"
    assert "--pipeline-parallel-size 2" in plan["command"]
    # On one node the same model does not start at this context: the text plan says so.
    assert main([*args, "--nodes", "1"]) == 0
    assert "vLLM would not start" in capsys.readouterr().out
    assert main([*args, "--nodes", "0"]) == 2
    assert "--nodes" in capsys.readouterr().err
    assert main([*args, "--nodes", "100"]) == 2
    assert "--nodes: 100 must be from 1 to 64" in capsys.readouterr().err
