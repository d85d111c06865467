"""The estimator: how much memory llama.cpp allocates, per device, for a model, settings and devices.

``estimate`` holds the records (llama.cpp's settings, the devices, the per-device breakdown) and the
one function that fills them; the KV cache and recurrent state, the compute buffers and the layer
placement each follow the llama.cpp function they name. ``limits`` answers the largest context,
users and GPU layers that fit; ``autofit`` places layers and experts as llama.cpp's ``--fit`` does;
``backends`` what a GPU build changes; ``targets`` turns hardware into the estimator's devices;
``commands`` writes the llama-server command for an estimate.

"How is the KV cache sized?" is answered here, and only here."""
