"""Models: configs, the tensors each family reads, loading a HF folder or a GGUF
file whole, the paged forward (llama.py) and the dense reference (reference.py).
Imports formats/, batch/ and kernels/ below it."""
