"""Each CPU kernel against the NumPy reference, on fresh random inputs."""
import numpy as np
import pytest

from tinypaged.batch.attention_metadata import AttentionMetadata
from tinypaged.kernels import cpu, reference
from tinypaged.kernels.cpu.cache_ops import keys_from_rows

RTOL = ATOL = 2e-5  # float32, different summation order


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("seed", range(3))
def test_rms_norm_rope_silu(seed):
    rng = np.random.default_rng(seed)
    x, w, r = rand(rng, 7, 48), rand(rng, 48), rand(rng, 7, 48)
    np.testing.assert_allclose(cpu.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5),
                               rtol=RTOL, atol=ATOL)
    want_h, want_r = reference.add_rms_norm(x, r, w, 1e-5)
    got_h, got_r = cpu.add_rms_norm(x, r.copy(), w, 1e-5)
    np.testing.assert_allclose(got_h, want_h, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got_r, want_r, rtol=RTOL, atol=ATOL)
    first_h, first_r = cpu.add_rms_norm(x, None, w, 1e-5)
    np.testing.assert_allclose(first_h, reference.rms_norm(x, w, 1e-5), rtol=RTOL, atol=ATOL)
    assert first_r is x
    cos, sin = reference.rope_tables(64, 16, 10000.0)
    q, positions = rand(rng, 5, 3, 16), rng.integers(0, 64, 5)
    np.testing.assert_allclose(cpu.rope(q, positions, cos, sin),
                               reference.rope(q, positions, cos, sin), rtol=RTOL, atol=ATOL)
    gate, up = rand(rng, 4, 30) * 4, rand(rng, 4, 30)
    np.testing.assert_allclose(cpu.silu_mul(gate, up), reference.silu_mul(gate, up),
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(cpu.gelu_tanh_mul(gate, up), reference.gelu_tanh_mul(gate, up),
                               rtol=RTOL, atol=ATOL)


def test_the_activations_read_views_of_one_array_whether_or_not_they_are_its_halves():
    """gate_up's halves go to the in-place kernel; views of one array that are not its
    halves (swapped, offset, narrower) must not: each equals the reference."""
    rng = np.random.default_rng()
    whole, wider = rand(rng, 5, 2 * 24) * 4, rand(rng, 5, 2 * 24 + 3) * 4
    for gate, up in ((whole[:, :24], whole[:, 24:]), (whole[:, 24:], whole[:, :24]),
                     (wider[:, 1:25], wider[:, 25:49]), (wider[:, :24], wider[:, 24:48]),
                     (whole[:, :20], whole[:, 24:44]), (whole[:3, :24], whole[:3, 24:])):
        for op in ("silu_mul", "gelu_tanh_mul"):
            np.testing.assert_allclose(getattr(cpu, op)(gate, up), getattr(reference, op)(gate, up),
                                       rtol=RTOL, atol=ATOL)
    assert cpu._whole_of(whole[:, :24], whole[:, 24:]) is whole
    assert cpu._whole_of(whole[:, 24:], whole[:, :24]) is None
    assert cpu._whole_of(wider[:, :24], wider[:, 24:48]) is None


def test_the_activations_exp_holds_over_float32s_range():
    """silu and GeGLU take e^x from fast_exp (a vectorisable polynomial, not libm):
    gates from -100 to 100, where e^x under- and overflows, against float64."""
    from tinypaged.kernels.cpu.fast_exp import exp32
    from numba import njit
    x = np.concatenate([np.linspace(-100, 100, 20001), [-87.3, 88.7, 0.0, -0.0, 1e-30]]) \
        .astype(np.float32)
    got = njit(lambda v: np.array([exp32(e) for e in v], dtype=np.float32))(x)
    want = np.exp(np.clip(x, -87.33, 88.0).astype(np.float64))
    assert (np.abs(got - want) <= np.spacing(want.astype(np.float32))).all()  # 1 ulp
    gate = np.concatenate([x, -x]).reshape(2, -1)
    up = np.ones_like(gate)
    for op in ("silu_mul", "gelu_tanh_mul"):
        want = getattr(reference, op)(gate.astype(np.float64), up.astype(np.float64))
        got = getattr(cpu, op)(gate, up)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)  # (tanh(u) = -1 in float64
        # below u = -19: the reference gives 0 where the exp form gives the value, < 1e-15)


def test_rope_tables_match_the_dense_rotation():
    cos, sin = reference.rope_tables(32, 8, 500.0)
    positions = np.array([0, 3, 31])
    x = rand(np.random.default_rng(1), 3, 2, 8)
    dense_cos, dense_sin = reference.rope_cos_sin(positions, 8, 500.0)
    np.testing.assert_allclose(reference.rope(x, positions, cos, sin),
                               reference.apply_rope(x, dense_cos, dense_sin), rtol=1e-6, atol=1e-6)


def test_rope_tables_in_slabs_are_the_dense_tables_first_halves_bit_for_bit():
    """rope_tables computes a few thousand positions at a time (its float64 temporaries
    at Gemma 3's 32,768 positions were 200 MB); the slab seams change no bit."""
    from tinypaged.kernels.rope import Rope
    for rope in (500.0, Rope(1e6)):
        cos, sin = reference.rope_tables(70, 16, rope, positions_at_once=32)
        dense_cos, dense_sin = reference.rope_cos_sin(np.arange(70), 16, rope)
        assert np.array_equal(cos, dense_cos[:, :8]) and np.array_equal(sin, dense_sin[:, :8])
        assert cos.dtype == np.float32 and cos.flags.c_contiguous


def on_cpu(q, k_cache, *rest):
    """Attention's arguments with K in the CPU backend's layout (cache_ops.py: transposed
    in each block), from a pool held as rows as the reference holds it."""
    return (q, keys_from_rows(k_cache), *rest)


def random_paged_batch(rng, block_size, n_kv, head_dim, context_lens, n_new):
    """A pool with ragged block tables (shuffled block ids), filled with random K/V."""
    tables, next_free = [], list(rng.permutation(64))
    for n in context_lens:
        tables.append([int(next_free.pop()) for _ in range(-(-n // block_size))])
    k_cache = rand(rng, 64, block_size, n_kv, head_dim)
    v_cache = rand(rng, 64, block_size, n_kv, head_dim)
    chunks = [(t, n - new, n) for t, n, new in zip(tables, context_lens, n_new)]
    return k_cache, v_cache, AttentionMetadata.build(chunks, block_size)


@pytest.mark.parametrize("window, scores_scale, softcap", [(None, None, None), (1, None, None),
                                                         (7, None, None), (16, None, None),
                                                         (None, 0.7, 1.5), (7, 0.2, 0.9)])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("n_heads, n_kv", [(4, 2), (4, 4), (6, 1)])
def test_paged_attention_decode_and_prefill(block_size, n_heads, n_kv, window, scores_scale,
                                            softcap):
    """A sliding window masks the keys before it in decode rows, in a prefill over a
    cached prefix and in a whole prefill (7 and 16 end mid-block and at a block's end);
    another scale of the scores (Granite, Gemma) and Gemma 2's soft-capping."""
    rng = np.random.default_rng(block_size * 10 + n_heads + n_kv)
    context_lens = [1, 17, 33, 5]  # 17 and 33: a partially filled last block
    n_new = [1, 1, 9, 5]  # decode, decode, prefill after a cached prefix, whole prefill
    k_cache, v_cache, meta = random_paged_batch(rng, block_size, n_kv, 8, context_lens, n_new)
    q = rand(rng, meta.num_tokens, n_heads, 8)
    args = (q, k_cache, v_cache, meta, window, scores_scale, softcap)
    np.testing.assert_allclose(cpu.paged_attention(*on_cpu(*args)), reference.paged_attention(*args),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("context_lens", [[33], [17, 40], [5, 1, 64]])
@pytest.mark.parametrize("n_heads, n_kv", [(4, 2), (9, 3), (6, 1)])
def test_paged_attention_of_a_few_decode_tokens(context_lens, n_heads, n_kv):
    """Contexts that start, end and cross KV blocks (the kernel takes a block's
    positions at a time), with and without a window."""
    rng = np.random.default_rng(len(context_lens) * 10 + n_kv)
    k_cache, v_cache, meta = random_paged_batch(rng, 16, n_kv, 8, context_lens,
                                                [1] * len(context_lens))
    q = rand(rng, meta.num_tokens, n_heads, 8)
    for window in (None, 7):
        args = (q, k_cache, v_cache, meta, window)
        np.testing.assert_allclose(cpu.paged_attention(*on_cpu(*args)), reference.paged_attention(*args),
                                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("split_keys", [3, 16, 40])
@pytest.mark.parametrize("window, softcap", [(None, None), (7, None), (50, 0.9)])
@pytest.mark.parametrize("n_heads, n_kv, head_dim", [(4, 2, 8), (9, 3, 64), (4, 1, 256)])
def test_paged_attention_tiles_and_key_splits(split_keys, window, softcap, n_heads, n_kv, head_dim):
    """Long prefill chunks (several tiles of a sequence: 16 tokens, or fewer where
    rows x D is large) and long contexts cut into key splits whose partial sums are
    merged: splits that end mid-block, splits a window masks whole for some rows, a
    decode token beside the chunks."""
    rng = np.random.default_rng(split_keys + n_heads + head_dim)
    context_lens, n_new = [100, 61, 130], [1, 40, 37]  # decode; prefill after a prefix; whole
    k_cache, v_cache, meta = random_paged_batch(rng, 16, n_kv, head_dim, context_lens, n_new)
    q = rand(rng, meta.num_tokens, n_heads, head_dim)
    args = (q, k_cache, v_cache, meta, window, None, softcap)
    np.testing.assert_allclose(cpu.paged_attention(*on_cpu(*args), split_keys=split_keys),
                               reference.paged_attention(*args), rtol=RTOL, atol=ATOL)


def test_a_long_decode_context_is_split_over_the_cores_and_merged():
    """One decode token over 700 keys, float16 pool: 2 splits of the default size, and
    the same through 23 splits."""
    from tinypaged.kernels.cpu.attention import SPLIT_KEYS
    rng = np.random.default_rng(700)
    tables = [list(rng.permutation(64)[:44])]
    k = (rand(rng, 64, 16, 2, 64) * 3).astype(np.float16)
    v = rand(rng, 64, 16, 2, 64).astype(np.float16)
    meta = AttentionMetadata.build([(tables[0], 699, 700)], 16)
    q = rand(rng, 1, 8, 64)
    want = reference.paged_attention(q, k, v, meta)
    assert 700 > SPLIT_KEYS
    for split in (SPLIT_KEYS, 31):
        got = cpu.paged_attention(q, keys_from_rows(k.view(np.uint16)), v.view(np.uint16), meta,
                                  split_keys=split)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_paged_attention_finds_its_items_kernel_again_for_another_pool():
    """The items' kernel is called at an address kept per pool dtype (address_call.py):
    float32 and float16 pools in turn, and after the float32 pool's entry is put where
    the float16 pool's belongs (an entry for other types), each equals the reference."""
    from tinypaged.kernels.cpu import attention
    rng = np.random.default_rng()
    k_cache, v_cache, meta = random_paged_batch(rng, 16, 2, 16, [40, 9], [1, 9])
    q = rand(rng, meta.num_tokens, 4, 16)
    pools = {np.float32: (k_cache, v_cache)}
    pools[np.float16] = tuple(a.astype(np.float16) for a in pools[np.float32])

    def check(dtype):
        k, v = pools[dtype]
        held = (k, v) if dtype == np.float32 else (k.view(np.uint16), v.view(np.uint16))
        np.testing.assert_allclose(cpu.paged_attention(*on_cpu(q, *held, meta)),
                                   reference.paged_attention(q, k, v, meta), rtol=RTOL, atol=ATOL)
    for dtype in (np.float32, np.float16, np.float32):
        check(dtype)
    f32, f16 = (np.dtype(np.float32).num,) * 2, (np.dtype(np.uint16).num,) * 2
    attention._RUN_CHUNK_ENTRIES[f16] = attention._RUN_CHUNK_ENTRIES[f32]
    check(np.float16)
    assert attention._RUN_CHUNK_ENTRIES[f16][1] != attention._RUN_CHUNK_ENTRIES[f32][1]


@pytest.mark.parametrize("window", [1, 3, 10])
def test_paged_attention_reference_masks_a_window_as_dense_attention_does(window):
    rng = np.random.default_rng(window)
    block_size, n = 4, 10
    k, v, q = rand(rng, n, 2, 8), rand(rng, n, 2, 8), rand(rng, n, 4, 8)
    k_cache, v_cache = np.zeros((6, block_size, 2, 8), np.float32), np.zeros((6, block_size, 2, 8), np.float32)
    meta = AttentionMetadata.build([([5, 0, 3], 0, n)], block_size)
    reference.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    got = reference.paged_attention(q, k_cache, v_cache, meta, window)
    want = reference.causal_attention(q, k, v, np.arange(n), window)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # and the window is not the whole context: the last query differs from full attention
    assert (window >= n) == np.allclose(got[-1], reference.causal_attention(q, k, v, np.arange(n))[-1])


def test_paged_attention_reference_equals_dense_attention():
    """The reference's paging itself: scattered blocks give contiguous-cache results."""
    rng = np.random.default_rng(9)
    block_size, n = 4, 10
    k, v, q = rand(rng, n, 2, 8), rand(rng, n, 2, 8), rand(rng, n, 4, 8)
    table = [5, 0, 3]
    k_cache, v_cache = np.zeros((6, block_size, 2, 8), np.float32), np.zeros((6, block_size, 2, 8), np.float32)
    meta = AttentionMetadata.build([(table, 0, n)], block_size)
    reference.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    got = reference.paged_attention(q, k_cache, v_cache, meta)
    np.testing.assert_allclose(got, reference.causal_attention(q, k, v, np.arange(n)), rtol=1e-6, atol=1e-6)


def test_rope_write_kv_equals_rope_then_write():
    rng = np.random.default_rng(4)
    cos, sin = reference.rope_tables(32, 8, 10000.0)
    q, k, v = rand(rng, 5, 4, 8), rand(rng, 5, 2, 8), rand(rng, 5, 2, 8)
    positions, slots = rng.integers(0, 32, 5), rng.permutation(24)[:5]
    pools = [*cpu.allocate_kv((6, 4, 2, 8)), *reference.allocate_kv((6, 4, 2, 8))]
    got_q = cpu.rope_write_kv(q, k, v, positions, cos, sin, pools[0], pools[1], slots)
    want_q = reference.rope(q, positions, cos, sin)
    reference.write_kv(pools[2], pools[3], reference.rope(k, positions, cos, sin), v, slots)
    np.testing.assert_allclose(got_q, want_q, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pools[0], keys_from_rows(pools[2]), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(pools[1], pools[3])


@pytest.mark.parametrize("block_size", [1, 16])
def test_write_kv_and_copy_blocks(block_size):
    rng = np.random.default_rng(block_size)
    shape = (2, 8, block_size, 2, 4)  # (L, blocks, ...)
    pools = [*cpu.allocate_kv(shape), *reference.allocate_kv(shape)]
    slots = rng.permutation(8 * block_size)[:6]
    k, v = rand(rng, 6, 2, 4), rand(rng, 6, 2, 4)
    cpu.write_kv(pools[0][1], pools[1][1], k, v, slots)
    reference.write_kv(pools[2][1], pools[3][1], k, v, slots)
    np.testing.assert_array_equal(pools[0], keys_from_rows(pools[2]))
    np.testing.assert_array_equal(pools[1], pools[3])
    pairs = [(int(slots[0] // block_size), 7), (2, 3)]
    cpu.copy_blocks(pools[0], pools[1], pairs)
    reference.copy_blocks(pools[2], pools[3], pairs)
    np.testing.assert_array_equal(pools[0], keys_from_rows(pools[2]))
    np.testing.assert_array_equal(pools[0][:, 7], pools[0][:, pairs[0][0]])


@pytest.mark.parametrize("rows", [1, 3, 4, 9, 64, 65, 130])
def test_linear_paths_match_the_reference(rows, monkeypatch):
    from tinypaged.kernels.cpu import tiles
    from tinypaged.kernels.cpu.linear import LinearWeight
    from tinypaged.formats.quant_kind import BF16, F16, F32

    monkeypatch.setattr(tiles, "TILE_FLOATS", 48 * 16)  # prefill: several float16 tiles
    rng = np.random.default_rng(rows)
    exact = rand(rng, 70, 48).astype(np.float16).astype(np.float32)  # float16 holds it exactly
    inexact = rand(rng, 70, 48)
    tiny = inexact * np.where(np.arange(48) % 7 == 0, np.float32(1e-6), np.float32(1))  # (a real
    bf16 = (tiny.view(np.uint32) & 0xFFFF0000).view(np.float32)  # model's tiny weights: float16's
    #                                                               subnormals cannot hold them)
    x, bias = rand(rng, rows, 48), rand(rng, 70)
    cases = ((exact, F16), (inexact, F32), (exact.astype(np.float16), F16), (bf16, BF16))
    for w, kind in cases:
        held = LinearWeight(w)
        assert held.kind.code == kind and held.nbytes == w.size * (4 if kind == F32 else 2)  # one copy
        np.testing.assert_array_equal(held.dequantize([3, 0]), w[[3, 0]].astype(np.float32))
        np.testing.assert_allclose(cpu.linear(x, held, bias),
                                   reference.linear(x, w.astype(np.float32), bias),
                                   rtol=1e-5, atol=1e-5)


def test_a_tied_lm_head_stays_the_embedding_object():
    from tinypaged.kernels.cpu.linear import prepare_linear_weights

    table = np.ones((8, 4), np.float32)
    held = prepare_linear_weights({"model.embed_tokens.weight": table, "lm_head.weight": table,
                                   "model.norm.weight": np.ones(4, np.float32)})
    assert held["lm_head.weight"] is held["model.embed_tokens.weight"]
    assert held["model.norm.weight"] is not None and held["model.norm.weight"].ndim == 1


def test_f16_bits_widen_exactly_including_subnormals_and_extremes():
    from tinypaged.kernels.cpu.linear import LinearWeight, _gemv_f16
    from tinypaged.formats.quant_kind import F16

    special = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, -6.1e-5, 3.0e-6], np.float16)
    w = np.eye(8, dtype=np.float16) * special  # row i picks element i of x, scaled
    out = np.empty((1, 8), np.float32)
    _gemv_f16(np.ones((1, 8), np.float32), w.view(np.uint16), out)
    np.testing.assert_array_equal(out[0], special.astype(np.float32))
    assert LinearWeight(w.astype(np.float32)).kind.code == F16


def test_fused_projection_ops_compose_the_reference():
    from tinypaged.kernels.cpu.linear import LinearWeight
    rng = np.random.default_rng(8)
    x = rand(rng, 3, 24)
    ws = [rand(rng, n, 24) for n in (16, 8, 8, 20, 20)]
    held = [LinearWeight(w) for w in ws]  # (the CPU's form of a float matrix)
    bs = [rand(rng, n) for n in (16, 8, 8)]
    for got, want in zip(cpu.qkv_proj(x, *held[:3], *bs), reference.qkv_proj(x, *ws[:3], *bs)):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(cpu.gate_up_silu(x, held[3], held[4]),
                               reference.gate_up_silu(x, ws[3], ws[4]), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("form", ["float16", "float32", "q4_1"])
def test_stacked_layer_matrices_multiply_as_the_separate_ones(form):
    from tinypaged.formats.packed import PackedWeight
    from tinypaged.formats.quant_kind import Q4_1
    from tinypaged.kernels.cpu.stack_rows import StackRows

    rng = np.random.default_rng(9)
    names = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight"]
    mats = [rand(rng, n, 64) for n in (16, 8, 8, 20, 20)]
    if form == "float16":
        mats = [m.astype(np.float16).astype(np.float32) for m in mats]
    elif form == "q4_1":
        mats = [PackedWeight.quantize(m, Q4_1) for m in mats]
    weights = {f"model.layers.0.{n}": m for n, m in zip(names, mats)}
    weights["model.layers.1.self_attn.q_proj.weight"] = rand(rng, 16, 64)  # a group left whole
    held = cpu.prepare_weights(weights)
    parts = [held[f"model.layers.0.{n}"] for n in names]
    assert parts[0].stack[0] is parts[2].stack[0] and parts[3].stack[0] is parts[4].stack[0]
    assert not isinstance(held["model.layers.1.self_attn.q_proj.weight"], StackRows)
    dense = reference.prepare_weights(dict(zip(names, mats)))  # packed: x is rounded first
    dense = [dense[n] for n in names]

    def close(got, want):  # float32 accumulation, relative to the products' scale
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    for rows in (1, 5, 70):  # each product path: GEMV, numba GEMM, BLAS (float forms)
        x = rand(rng, rows, 64)
        for got, w in zip([*cpu.qkv_proj(x, *parts[:3]), ], dense[:3]):
            close(got, reference.linear(x, w))
        close(cpu.gate_up_silu(x, *parts[3:]), reference.gate_up_silu(x, *dense[3:]))
        close(cpu.linear(x, parts[1]), reference.linear(x, dense[1]))


def test_a_float16_pool_rounds_on_write_and_widens_on_read():
    """The CPU holds a float16 pool as uint16 bits (numba's CPU target has no float16):
    its writes are the reference's float16 rounding bit for bit, and attention over it
    equals the reference's over a float16 NumPy pool."""
    rng = np.random.default_rng(16)
    k_bits, v_bits = cpu.allocate_kv((1, 64, 16, 2, 8), np.float16)
    k_half, v_half = reference.allocate_kv((1, 64, 16, 2, 8), np.float16)
    assert k_bits.dtype == np.uint16 and k_half.dtype == np.float16
    meta = AttentionMetadata.build([([3, 9], 0, 20), ([40], 0, 1), ([7, 2, 5], 30, 38)], 16)
    k, v = rand(rng, meta.num_tokens, 2, 8) * 300, rand(rng, meta.num_tokens, 2, 8)  # rounding shows
    cpu.write_kv(k_bits[0], v_bits[0], k, v, meta.slot_mapping)
    reference.write_kv(k_half[0], v_half[0], k, v, meta.slot_mapping)
    np.testing.assert_array_equal(k_bits.view(np.float16), keys_from_rows(k_half))
    np.testing.assert_array_equal(v_bits.view(np.float16), v_half)
    assert not np.array_equal(k_half[0].astype(np.float32).reshape(-1, 2, 8)[meta.slot_mapping], k)
    q = rand(rng, meta.num_tokens, 4, 8) / 300
    np.testing.assert_allclose(cpu.paged_attention(q, k_bits[0], v_bits[0], meta),
                               reference.paged_attention(q, k_half[0], v_half[0], meta),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("block_size, head_dim, n_heads, n_kv", [(16, 64, 9, 3), (16, 256, 4, 1),
                                                                 (4, 32, 4, 2), (16, 32, 12, 2)])
def test_an_int8_pool_holds_the_references_rows_and_attends_as_it_does(block_size, head_dim, n_heads,
                                                                       n_kv):
    """kv_cache_dtype="int8": the CPU writes kernels/kv_q8.py's rows bit for bit (K's block
    transposed, its scales' bytes in its last rows), and attention over them, decode
    (the registers' path: key_scores and weigh_keys applying each block's scales) and
    prefill, equals the reference's over its own int8 pool; block size 4 takes the
    loops of a key at a time."""
    rng = np.random.default_rng(head_dim + block_size)
    shape = (1, 64, block_size, n_kv, head_dim)
    (k_pool, v_pool), (k_rows, v_rows) = cpu.allocate_kv(shape, np.int8), reference.allocate_kv(shape, np.int8)
    context = [60, 130, 7] if block_size == 16 else [20, 33, 7]
    tables, free = [], list(rng.permutation(64))
    for n in context:
        tables.append([int(free.pop()) for _ in range(-(-n // block_size))])
    prefill = AttentionMetadata.build([(t, 0, n) for t, n in zip(tables, context)], block_size)
    k, v = rand(rng, prefill.num_tokens, n_kv, head_dim), rand(rng, prefill.num_tokens, n_kv, head_dim)
    cpu.write_kv(k_pool[0], v_pool[0], k, v, prefill.slot_mapping)
    reference.write_kv(k_rows[0], v_rows[0], k, v, prefill.slot_mapping)
    assert np.array_equal(k_pool, keys_from_rows(k_rows)) and np.array_equal(v_pool, v_rows)
    decode = AttentionMetadata.build([(t, n - 1, n) for t, n in zip(tables, context)], block_size)
    for meta in (prefill, decode):
        q = rand(rng, meta.num_tokens, n_heads, head_dim)
        np.testing.assert_allclose(cpu.paged_attention(q, k_pool[0], v_pool[0], meta),
                                   reference.paged_attention(q, k_rows[0], v_rows[0], meta),
                                   rtol=RTOL, atol=ATOL)


def test_rope_write_kv_into_an_int8_pool_rounds_the_rotated_keys():
    """Each rotated key is rounded to its int8 row as it is stored: the rows held equal
    the reference's rounding of rope(k), but where the two rotations' last bits put a
    value on the other side of a rounding step (one step at most)."""
    from tinypaged.kernels.kv_q8 import dequantize_rows
    rng = np.random.default_rng(5)
    cos, sin = reference.rope_tables(32, 64, 10000.0)
    q, k, v = rand(rng, 5, 4, 64), rand(rng, 5, 2, 64), rand(rng, 5, 2, 64)
    positions, slots = rng.integers(0, 32, 5), rng.permutation(24)[:5]
    (k_pool, v_pool), (k_rows, v_rows) = cpu.allocate_kv((6, 4, 2, 64), np.int8), \
        reference.allocate_kv((6, 4, 2, 64), np.int8)
    cpu.rope_write_kv(q, k, v, positions, cos, sin, k_pool, v_pool, slots)
    reference.write_kv(k_rows, v_rows, reference.rope(k, positions, cos, sin), v, slots)
    assert np.array_equal(v_pool, v_rows)
    got, want = dequantize_rows(np.moveaxis(k_pool, -1, -3)), dequantize_rows(k_rows)
    step = np.abs(want).reshape(6, 4, 2, 2, 32).max(axis=-1).repeat(32, axis=-1) / 127
    assert (np.abs(got - want) <= step * 1.01 + 1e-7).all() and np.mean(got == want) > 0.99
