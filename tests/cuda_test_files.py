"""The test files whose `cuda` tests run on a lent card. The GPU image holds numpy,
numba, numba-cuda, pytest and the core's own dependencies, none of the extras, so
these files import nothing else (test_cuda_test_imports holds them to it);
bench/gpu_check.py runs their cuda tests there."""
ON_THE_GPU_IMAGE = ("test_cuda_kernels.py", "test_cuda_graphs.py", "test_cuda_engine.py",
                    "test_cuda_normed_rows.py", "test_hf_parity.py", "test_lora.py",
                    "test_logprobs.py", "test_embeddings.py")

# the other files with cuda tests, and why their tests stay off the card
LEFT_OFF_THE_CARD = {
    "test_cuda_resources.py": "compile-only (ptx): sm_90 SASS, made without a card",
    "test_kquant.py": "imports gguf, its reference dequantizer",
    "test_rerank.py": "imports httpx and the server's test thread",
    "test_structured.py": "needs llguidance",
    "test_warp_shim.py": "tests the simulator's warp shim",
}
