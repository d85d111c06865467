"""How fast a placed model runs: the speed model's formula (``model``) with constants fitted on
published llama-bench results, the prediction for an estimate (``predict``), what a live run
measured (``measure``) with the llama.cpp defaults it uses, and latency under load (``loadsim``)."""
