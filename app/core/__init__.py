"""The pure core: estimation, catalogs, GGUF reading and the speed model.

Nothing in this package imports Qt; tests/test_layers.py enforces it.
"""
