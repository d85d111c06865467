"""Models as llama.cpp sees them: the :class:`~app.core.model.architecture.Architecture` record, ggml's
tensor types, the tensors a converted GGUF holds (``layout``), llama.cpp's quantization presets
(``quant``), reading a GGUF header (``gguf_reader``) or a Hugging Face config.json (``hf_config``),
vision projectors, the built-in catalogs, which architectures' rules are proven (``coverage``), and
a model ready to estimate (``source``).

To add an architecture: its hyper-parameters in ``architecture``, its GGUF keys in ``gguf_reader``,
its config.json keys in ``hf_config``, its tensors in ``layout``; its memory rules live in
``app.core.memory``."""
