"""A GGUF writer and ggml quantisers for tests, written from the format description,
independently of the reader under test."""
from __future__ import annotations

import struct

import numpy as np

# metadata value types
U8, I8, U16, I16, U32, I32, F32_T, BOOL, STRING, ARRAY, U64, I64, F64_T = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32_T: "<f",
        BOOL: "<?", U64: "<Q", I64: "<q", F64_T: "<d"}
# ggml tensor types
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_Q4_K, GGML_BF16 = 0, 1, 2, 3, 8, 12, 30
GGML_Q5_0, GGML_Q5_1, GGML_Q5_K, GGML_Q6_K = 6, 7, 13, 14
GGML_Q2_K = 10  # a type tinypaged does not read
RAW_ONLY = {GGML_Q4_K: (256, 144), GGML_Q5_K: (256, 176), GGML_Q6_K: (256, 210),
            GGML_Q5_0: (32, 22), GGML_Q5_1: (32, 24),
            GGML_Q2_K: (256, 84)}  # no quantiser here: (values, bytes) per block
RAW_TYPES = {"Q4_K": GGML_Q4_K, "Q5_K": GGML_Q5_K, "Q6_K": GGML_Q6_K, "Q5_0": GGML_Q5_0,
             "Q5_1": GGML_Q5_1}
KQUANT_SCALE_OFFSETS = {GGML_Q4_K: (0, 2), GGML_Q5_K: (0, 2), GGML_Q6_K: (208,)}


def random_raw_blocks(rng, ggml_type: int, n_values: int) -> np.ndarray:
    """Random bits for n_values of a block type, with finite float16 scales (K-quants,
    Q5_x); all zero for the other raw types (Q2_K)."""
    per_block, block_bytes = RAW_ONLY[ggml_type]
    n = n_values // per_block
    if ggml_type in (GGML_Q5_0, GGML_Q5_1):  # finite float16 d (and m), random bits
        raw = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
        for offset in ((0,) if ggml_type == GGML_Q5_0 else (0, 2)):
            raw[:, offset:offset + 2] = (rng.standard_normal(n) * 2e-3).astype(np.float16).view(np.uint8).reshape(n, 2)
        return raw
    if ggml_type not in KQUANT_SCALE_OFFSETS:
        return np.zeros((n, block_bytes), dtype=np.uint8)
    raw = rng.integers(0, 256, (n, block_bytes), dtype=np.uint8)
    for offset in KQUANT_SCALE_OFFSETS[ggml_type]:
        scale = (rng.standard_normal(n) * 2e-3).astype(np.float16)  # Q8_0 scales stay normal
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n, 2)
    return raw


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, value) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        item_type, items = value
        return (struct.pack("<IQ", item_type, len(items))
                + b"".join(_value(item_type, v) for v in items))
    return struct.pack(_FMT[vtype], value)


def _blocks(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).reshape(-1, 32)


def quantize_q8_0(x):
    """-> (raw uint8 (n_blocks*34,), exact float32 dequantisation of x's shape)."""
    b = _blocks(x)
    d = np.abs(b).max(axis=1, keepdims=True) / 127.0
    q = np.where(d > 0, np.round(b / np.where(d > 0, d, 1)), 0).astype(np.int8)
    d16 = d.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8), q.view(np.uint8)], axis=1)
    return raw.ravel(), (q * d16.astype(np.float32)).reshape(np.shape(x))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def quantize_q4_0(x):
    b = _blocks(x)
    idx = np.abs(b).argmax(axis=1)
    d = (b[np.arange(len(b)), idx] / -8.0)[:, None]
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0)
    q = np.minimum(15, np.trunc(b * inv + 8.5)).astype(np.uint8)
    d16 = d.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8), _pack_nibbles(q)], axis=1)
    return raw.ravel(), ((q.astype(np.float32) - 8) * d16.astype(np.float32)).reshape(np.shape(x))


def quantize_q4_1(x):
    b = _blocks(x)
    lo, hi = b.min(axis=1, keepdims=True), b.max(axis=1, keepdims=True)
    d = (hi - lo) / 15.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0)
    q = np.minimum(15, np.trunc((b - lo) * inv + 0.5)).astype(np.uint8)
    d16, m16 = d.astype(np.float16), lo.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8), m16.view(np.uint8), _pack_nibbles(q)], axis=1)
    expected = q * d16.astype(np.float32) + m16.astype(np.float32)
    return raw.ravel(), expected.reshape(np.shape(x))


def encode_tensor(x: np.ndarray, ggml_type: int):
    """-> (raw bytes, what a correct reader returns as float32)."""
    x = np.asarray(x, dtype=np.float32)
    if ggml_type == GGML_F32:
        return x.tobytes(), x
    if ggml_type == GGML_F16:
        h = x.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if ggml_type == GGML_BF16:
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16 value
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32)
    quantize = {GGML_Q8_0: quantize_q8_0, GGML_Q4_0: quantize_q4_0, GGML_Q4_1: quantize_q4_1}
    raw, expected = quantize[ggml_type](x)
    return raw.tobytes(), expected


class GGUFWriter:
    def __init__(self, alignment: int = 32, version: int = 3):
        self.alignment, self.version = alignment, version
        self.kv: list[tuple[str, int, object]] = []
        self.tensors: list[tuple[str, tuple[int, ...], int, bytes]] = []
        if alignment != 32:
            self.kv.append(("general.alignment", U32, alignment))

    def add(self, key: str, vtype: int, value) -> None:
        self.kv.append((key, vtype, value))

    def add_tensor(self, name: str, x: np.ndarray, ggml_type: int = GGML_F32) -> np.ndarray:
        raw, expected = encode_tensor(x, ggml_type)
        self.add_raw_tensor(name, np.shape(x), ggml_type, raw)
        return expected

    def add_raw_tensor(self, name: str, shape, ggml_type: int, raw: bytes) -> None:
        self.tensors.append((name, tuple(shape), ggml_type, raw))

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv)))
        for key, vtype, value in self.kv:
            out += _string(key) + struct.pack("<I", vtype) + _value(vtype, value)
        offset, data = 0, bytearray()
        for name, shape, ggml_type, raw in self.tensors:
            dims = list(reversed(shape))  # GGUF lists the fastest dimension first
            out += _string(name) + struct.pack("<I", len(dims))
            out += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ggml_type, offset)
            data += raw
            pad = -len(data) % self.alignment
            data += b"\0" * pad
            offset = len(data)
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out + data)

    def write(self, path) -> None:
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def byte_level_vocab_gguf(path, pre: str) -> None:
    """A GGUF holding only a byte-level BPE vocabulary (GPT-2's 256 byte characters
    and merges that join digits, letters, 'Ġ'-led words and contractions) whose
    tokenizer.ggml.pre is pre: what the pre-tokenizer tests load, here and in
    tools/make_tokenizer_fixtures.py (same bytes in both)."""
    from tokenizers import pre_tokenizers
    merges = [("1", "2"), ("12", "3"), ("4", "5"), ("h", "e"), ("he", "l"), ("hel", "l"),
              ("hell", "o"), ("Ġ", "w"), ("Ġw", "o"), ("Ġwo", "r"), ("Ġwor", "l"), ("Ġworl", "d"),
              ("'", "s"), ("'", "m"), ("Ġ", "Ġ"), ("Ċ", "Ċ"), ("T", "h"), ("Th", "e"), ("Ġ", "1"),
              ("Ġ", "h"), ("Ġh", "e")]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<s>", "</s>"] + alphabet + ["".join(m) for m in merges]
    w = GGUFWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("tokenizer.ggml.model", STRING, "gpt2")
    w.add("tokenizer.ggml.pre", STRING, pre)
    w.add("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.add("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3] + [1] * (len(tokens) - 2)))
    w.add("tokenizer.ggml.merges", ARRAY, (STRING, [f"{a} {b}" for a, b in merges]))
    w.add("tokenizer.ggml.bos_token_id", U32, 0)
    w.add("tokenizer.ggml.eos_token_id", U32, 1)
    w.write(path)


SPM_PIECES = ["▁", "e", "l", "h", "o", "w", "r", "d", "1", "2", "3", "a", "t", "n", "i", "s",
              "ll", "he", "▁h", "▁he", "▁hell", "▁hello", "▁w", "▁wo", "▁wor", "▁world",
              "12", "123", "▁t", "▁th", "▁the", "in", "▁in", ",", ".", "el", "▁hel"]


def sentencepiece_vocab_gguf(path, add_space_prefix: bool, pieces=SPM_PIECES,
                             added: tuple[tuple[str, int], ...] = (),
                             byte_piece: str = "<0x{:02X}>") -> None:
    """A GGUF holding only a SentencePiece BPE vocabulary (tokenizer.ggml.model =
    llama): <unk>, <s>, </s>, the 256 byte pieces, then pieces scored best first (the
    order SentencePiece merges them), as Llama 2's or Gemma's files hold theirs; then
    `added` (piece, type): control (3) or user-defined (4) pieces, Gemma's kinds."""
    tokens = ["<unk>", "<s>", "</s>"] + [byte_piece.format(b) for b in range(256)] + list(pieces)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    tokens += [piece for piece, _ in added]
    types += [kind for _, kind in added]
    scores += [0.0] * len(added)
    w = GGUFWriter()
    w.add("general.architecture", STRING, "llama")
    w.add("tokenizer.ggml.model", STRING, "llama")
    w.add("tokenizer.ggml.pre", STRING, "default")
    w.add("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.add("tokenizer.ggml.token_type", ARRAY, (I32, types))
    w.add("tokenizer.ggml.scores", ARRAY, (F32_T, scores))
    w.add("tokenizer.ggml.unknown_token_id", U32, 0)
    w.add("tokenizer.ggml.bos_token_id", U32, 1)
    w.add("tokenizer.ggml.eos_token_id", U32, 2)
    w.add("tokenizer.ggml.add_space_prefix", BOOL, add_space_prefix)
    w.write(path)
