"""One model over several GPUs or machines: llama.cpp's layer split over identical GPUs
(``layer_split``), llama.cpp's RPC backend across machines (``rpc``), and vLLM with tensor
parallelism (``vllm``, its memory accounting in ``vllm_memory``) or across nodes (``vllm_pipeline``)."""
