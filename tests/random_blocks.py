"""Random packed blocks as a GGUF file holds them, for tests that need packed
matrices without the `gguf` package (the CUDA tests run on a GPU image without it).

Each returns the bytes of an (n, k) matrix: random quants and scale bits, random
float16 scales, the first block's scale zero (a block that contributes nothing)."""
import numpy as np

# K-quant kind -> (bytes a 256-weight super-block, where its float16 scales sit:
# d, then dmin where the kind has one)
K_QUANT_BLOCKS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}
# Q5 kind -> bytes a 32-weight block (d, Q5_1's m, the fifth bits, the nibbles)
Q5_BLOCKS = {"Q5_0": 22, "Q5_1": 24}


def random_k_quant(rng, kind: str, n: int, k: int) -> np.ndarray:
    """GGUF bytes of an (n, k) K-quant matrix: random bits (6-bit scales and mins,
    Q6_K's int8 scales of either sign, quants), random float16 super-block scales
    (d of either sign, dmin >= 0), the first super-block's all zero."""
    size, at = K_QUANT_BLOCKS[kind]
    blocks = rng.integers(0, 256, (n * k // 256, size), dtype=np.uint8)
    for offset, spread in zip(at, (0.02, 0.01)):
        value = (rng.standard_normal(len(blocks)) * spread).astype(np.float16)
        value = value if offset == at[0] else np.abs(value)
        value[0] = 0
        blocks[:, offset:offset + 2] = value.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def random_q5(rng, kind: str, n: int, k: int) -> np.ndarray:
    """GGUF bytes of an (n, k) Q5_x matrix: random float16 scales (and mins), random
    fifth bits and nibbles; one block with a zero scale."""
    blocks = rng.integers(0, 256, (n * k // 32, Q5_BLOCKS[kind]), dtype=np.uint8)
    d = (rng.standard_normal(len(blocks)) * 0.02).astype(np.float16)
    d[0] = 0
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    if kind == "Q5_1":  # its float16 minimum
        blocks[:, 2:4] = (rng.standard_normal(len(blocks)) * 0.1).astype(np.float16) \
            .view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)
