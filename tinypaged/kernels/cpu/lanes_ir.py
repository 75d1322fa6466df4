"""LLVM IR for the decode GEMV on laid-out weights (lanes.py): one group's 16 rows
times one row of x, the rows in the 16 lanes of every vector.

Block after block, in order: 8 chunk dots (each: 4 bytes of each of the 16 rows,
unsigned, times 4 of x's int8 values, broadcast: a vpdpbusd, or AVX2's steps in
byte_dot.py) give the 16 rows' integer dots; the block's float32 steps then run on
the 16 lanes at once, in their order, and are fused into the 16 sums with x's scale
(LANES.md). Each lane computes its row's float steps in order, with no sum across
lanes and no serial chain of adds per row. The high bits (Q5, Q6_K) come from bytes
laid as a chunk's (lanes.py), put in place by a shift and an and, or-ed into the nibbles.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...formats.quant_kind import Q6_K, Q8_0
from .byte_dot import BlockDot, signed_bytes_direct
from .kind_arg import QuantKindType
from .vector_ir import IR_F32, FLOATS, IR_I32, INTS, LANES, X_ROWS, c_array, index, pointer, splat

CHUNKS_PER_BLOCK = 8  # 4 columns a chunk, 32 a block
_WORDS = ir.VectorType(ir.IntType(16), 2 * LANES)


# The GEMV hints the bytes AHEAD bytes past the chunk it reads (the high bits as far on
# in their share of the bytes), and in the second pass over a group's nibbles the next
# group's: the hardware prefetcher follows only the first pass, and memory would idle
# while a group is multiplied (Zen 2, a 37 MB matrix: 27-31 GB/s, 23-24 without)
AHEAD = 8192


def _prefetch_line(context, builder, array_type, array, at):
    """Hints the cache line holding array[at] into the caches (a read, kept close)."""
    i8p = ir.IntType(8).as_pointer()
    hint = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, IR_I32, IR_I32, IR_I32]), "llvm.prefetch.p0i8")
    line = pointer(context, builder, array_type, array, at, ir.IntType(8))
    builder.call(hint, [line, ir.Constant(IR_I32, 0), ir.Constant(IR_I32, 3), ir.Constant(IR_I32, 1)])


def _flat(array_type, dtypes) -> bool:
    return c_array(array_type, dtypes) and array_type.ndim == 1


def _or_bit_bytes(context, builder, fifths_type, fifths, f_at, b, c, nibbles, q6):
    """nibbles (chunk c of block b, 64 bytes as INTS) with its high bits added, from
    bytes (lanes.py's fifths): Q5's fifth (16), Q6_K's bits 4 and 5 (16, 32). The
    64 bytes holding them, shifted so that chunk c's land on bit 4 (and 5) (16-bit
    shifts: what crosses a byte is masked off), and-ed with 0x10 (0x30)."""
    planes = 2 if q6 else 1
    per_byte = 8 // planes  # chunks a byte's bits cover
    v = builder.add(builder.mul(b, index(CHUNKS_PER_BLOCK // per_byte)), index(c // per_byte))
    at = builder.add(f_at, builder.mul(v, index(4 * LANES)))
    bits = builder.load(pointer(context, builder, fifths_type, fifths, at, _WORDS), align=1)
    shift = 4 - planes * (c % per_byte)
    if shift > 0:
        bits = builder.shl(bits, ir.Constant(_WORDS, [shift] * 2 * LANES))
    elif shift < 0:
        bits = builder.lshr(bits, ir.Constant(_WORDS, [-shift] * 2 * LANES))
    keep = 0x30303030 if q6 else 0x10101010
    return builder.or_(nibbles, builder.and_(builder.bitcast(bits, INTS), ir.Constant(INTS, [keep] * LANES)))


def _group_product(x_rows: int, half_group: bool = False):
    """The intrinsic for one group's 16 rows times x_rows consecutive rows of x
    (group_gemv: 1; group_gemm: X_ROWS; group_gemm_wide: WIDE_ROWS). Each chunk of the
    group is made unsigned once, in registers, and taken by every row of x.
    half_group (AVX2, 4-bit kinds: group_half_gemm): 8 of the rows, the caller's offsets
    at the half's first lane; x's rows as interleave_rows lays them out."""
    width = LANES // 2 if half_group else LANES
    floats, ints = ir.VectorType(IR_F32, width), ir.VectorType(IR_I32, width)
    shorts, halfs = ir.VectorType(ir.IntType(16), width), ir.VectorType(ir.HalfType(), width)
    small_ints = ir.VectorType(ir.IntType(8), width)

    def product(typingctx, kind, quants, q_at, xq, x_at, n_blocks, scales, mins, s_at, supers, u_at,
                fifths, f_at, dx, qsum, row_at, acc):
        if not isinstance(kind, QuantKindType):
            return None
        k = kind.kind  # the arrays must be the ones lanes.py lays out for it
        q8, q6, with_min = k.code == Q8_0, k.code == Q6_K, k.has_mins
        with_fifths, with_supers = k.high_bits > 0, k.is_k_quant
        scale_types = (types.int8,) if q6 else (types.uint8,) if with_supers else (types.uint16,)
        if not (_flat(quants, (types.int8,) if q8 else (types.uint8,)) and _flat(xq, (types.int8,))
                and _flat(scales, scale_types) and _flat(dx, (types.float32,))
                and _flat(qsum, (types.float32,) if with_min else (types.int32,))
                and _flat(acc, (types.float32,))
                and (_flat(mins, scale_types) if with_min else isinstance(mins, types.NoneType))
                and (_flat(supers, (types.uint16,)) if with_supers else isinstance(supers, types.NoneType))
                and (_flat(fifths, (types.uint8,)) if with_fifths else isinstance(fifths, types.NoneType))):
            return None
        # Q6_K: int8 sub-scales, d in supers, qsum: half sums (its 32 goes with its sub-scales)
        signed = q8 and signed_bytes_direct()  # Q8_0's bytes as they are, not q + 128
        if half_group and (q8 or q6 or with_fifths):  # (4-bit kinds only: see below)
            return None
        # what the unsigned bytes carry above q: Q8_0 128 (read xor 128), Q4_0 8, Q5_0 16
        offset = 0 if signed or q6 else 128 if q8 else k.offset
        w_max = 128 if signed else 255 if q8 else (16 << k.high_bits) - 1  # a byte's largest
        signature = types.void(kind, quants, types.intp, xq, types.intp, types.intp, scales, mins,
                               types.intp, supers, types.intp, fifths, types.intp, dx, qsum,
                               types.intp, acc)

        def codegen(context, builder, sig, args):
            (q_arr, q_at, x_arr, x_at, n_blocks, s_arr, m_arr, s_at, u_arr, u_at, f_arr, f_at,
             dx_arr, qs_arr, row_at, acc_arr) = args[1:]
            t = sig.args[1:]  # (after the kind)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3),
                                                 f"llvm.fma.v{width}f32")
            totals = [cgutils.alloca_once_value(builder, ir.Constant(floats, [0.0] * width))
                      for _ in range(x_rows)]
            if half_group:  # (through an empty asm: a count LLVM cannot see, or it unrolls
                # the 8 rows' loop and takes the rows one after another again)
                chunk_count = builder.asm(ir.FunctionType(index(0).type, [index(0).type]), "", "=r,0",
                                          [index(CHUNKS_PER_BLOCK)], False)

            def halves(array_type, array, first):
                bits = builder.load(pointer(context, builder, array_type, array, first, shorts), align=2)
                return builder.fpext(builder.bitcast(bits, halfs), floats)

            def scale_and_min(b, first):
                """Block b's 16 scales and mins (None without) in float32 (K-quants: d * sc
                and -(dmin * m), exact)."""
                if not with_supers:
                    return (halves(t[5], s_arr, first),
                            halves(t[6], m_arr, first) if with_min else None)

                def small(array_type, array):
                    ints = builder.load(pointer(context, builder, array_type, array, first,
                                                small_ints), align=1)
                    return builder.uitofp(ints, floats)
                d_at = builder.add(u_at, builder.mul(builder.lshr(b, index(3)), index(2 * LANES)))
                scale = builder.fmul(halves(t[8], u_arr, d_at), small(t[5], s_arr))
                low = builder.fneg(builder.fmul(halves(t[8], u_arr, builder.add(d_at, index(LANES))),
                                                small(t[6], m_arr)))
                return scale, low

            def block(b, chunk0, read, ahead=index(AHEAD)):
                """Block b of the rows, from their chunks chunk0 .. chunk0 + 7, each 64 bytes
                turned into vpdpbusd's unsigned bytes by read (then the high bits of columns
                32b + 4c .. added), times each row of x; one row: the chunks `ahead` bytes on
                hinted into the caches."""
                # Q6_K: the block's halves apart; one row of x: even and odd chunks apart, two
                # chains of vpdpbusd instead of one of eight (its latency bound the GEMV: 3x)
                dots = [[BlockDot(builder, w_max, signed, width) for _ in range(2)] for _ in range(x_rows)]

                def chunk(c, c_at):
                    """Chunk c (an int; None in a loop) at c_at (IR) times each row of x."""
                    at = builder.add(q_at, builder.mul(builder.add(chunk0, c_at), index(4 * LANES)))
                    w = read(builder.load(pointer(context, builder, t[0], q_arr, at, ints), align=1))
                    if x_rows == 1:  # (a chunk is a cache line)
                        _prefetch_line(context, builder, t[0], q_arr, builder.add(at, ahead))
                    if with_fifths:
                        w = _or_bit_bytes(context, builder, t[10], f_arr, f_at, b, c, w, q6)
                        if x_rows == 1 and c % (4 if q6 else 8) == 0:  # a new line of high bits
                            line = builder.add(builder.mul(b, index(2 if q6 else 1)), index(c // 4))
                            far = AHEAD // 2 if q6 else AHEAD // 4  # (their share of the bytes)
                            _prefetch_line(context, builder, t[10], f_arr, builder.add(
                                f_at, builder.add(builder.mul(line, index(4 * LANES)), index(far))))
                    half = c // 4 if q6 else c % 2 if x_rows == 1 else 0
                    # x's rows side by side (interleave_rows): a chunk's 4 columns of every row
                    # in one line at one base, the rest immediates (rows K apart, K a power of
                    # two from 4,096, met in one L1 set and evicted each other: half the rate)
                    x_chunk = builder.add(builder.add(x_at, builder.mul(b, index(32 * x_rows))),
                                          builder.mul(c_at, index(4 * x_rows)))
                    for i in range(x_rows):
                        quad = builder.load(pointer(context, builder, t[2], x_arr,
                                                    builder.add(x_chunk, index(4 * i)), IR_I32), align=1)
                        dots[i][half].add(w, splat(builder, quad, ints))
                # half a group: a block's 8 chunks in a loop (4 bits: their int16 sums cannot
                # overflow), each row's sums carried in a register. Unrolled, LLVM took the
                # rows one after another with the 8 chunks held: 3/4 of this form's rate
                if half_group:
                    carried = [cgutils.alloca_once_value(builder, row[0].zero_pending()) for row in dots]
                    with cgutils.for_range(builder, chunk_count) as loop:
                        for row, sums in zip(dots, carried):
                            row[0].resume(builder.load(sums))
                        chunk(None, loop.index)
                        for row, sums in zip(dots, carried):
                            builder.store(row[0].pending, sums)
                    for row, sums in zip(dots, carried):
                        row[0].resume(builder.load(sums))
                else:
                    for c in range(CHUNKS_PER_BLOCK):
                        chunk(c, index(c))
                dots = [[dot.result() for dot in row] for row in dots]
                if q6:
                    d_at = builder.add(u_at, builder.mul(builder.lshr(b, index(3)), index(LANES)))
                    d = halves(t[8], u_arr, d_at)
                    subs = [sub_scales(b, h) for h in range(2)]
                else:
                    scale, low = scale_and_min(b, builder.add(s_at, builder.mul(b, index(LANES))))
                for i in range(x_rows):
                    at = builder.add(builder.add(row_at, builder.mul(b, index(x_rows))), index(i))
                    x_scale = splat(builder, builder.load(pointer(context, builder, t[12], dx_arr, at)),
                                    floats)
                    if q6:
                        term = builder.fmul(d, q6_dot(b, at, dots[i], subs))
                    else:
                        dot = builder.add(dots[i][0], dots[i][1]) if x_rows == 1 else dots[i][0]
                        x_sum = builder.load(pointer(context, builder, t[13], qs_arr, at))
                        if offset:  # the dot of q itself: sum of (q + offset) x less offset * sum of x
                            dot = builder.sub(dot, splat(builder, builder.mul(x_sum, ir.Constant(IR_I32, offset)),
                                                         ints))
                        term = builder.fmul(scale, builder.sitofp(dot, floats))
                        if with_min:  # fma(min, qsum, scale * dot) (qsum float32:
                            term = builder.call(fma, [low, splat(builder, x_sum, floats), term])  # a broadcast load)
                    builder.store(builder.call(fma, [x_scale, term, builder.load(totals[i])]), totals[i])

            def sub_scales(b, h):
                """Block b's sub-scales of half h, 16 int8 as float32 (exact)."""
                part = builder.add(builder.mul(b, index(2)), index(h))
                subs = builder.load(pointer(context, builder, t[5], s_arr,
                                            builder.add(s_at, builder.mul(part, index(LANES))),
                                            small_ints), align=1)
                return builder.sitofp(subs, floats)

            def q6_dot(b, at, dots, subs):
                """Q6_K's exact block dot, as float32, from its halves' sums of q x (q = 0 .. 63);
                x's sums of 16 values of this row's block b, times 32, at qsum[2 at + h]
                (a broadcast load, not a multiply and a broadcast from a register). Each centred
                half is sum of (q - 32) x, |.| <= 16 * 32 * 127, so each product with an int8
                sub-scale is below 2^23 and their sum below 2^24: the float multiply and fma
                are exact, the integer dot's bits, without two vpmulld (2 uops each) a row."""
                centred = []
                for h in range(2):
                    x_half = builder.load(pointer(context, builder, t[13], qs_arr,
                                                  builder.add(builder.mul(at, index(2)), index(h))))
                    exact = builder.sub(dots[h], splat(builder, x_half, ints))
                    centred.append(builder.sitofp(exact, floats))
                return builder.call(fma, [centred[0], subs[0], builder.fmul(centred[1], subs[1])])

            def repeated(value):
                return ir.Constant(ints, [value] * width)
            if signed:
                with cgutils.for_range(builder, n_blocks) as loop:
                    block(loop.index, builder.mul(loop.index, index(CHUNKS_PER_BLOCK)), lambda w: w)
            elif q8:  # bytes xor 128: q + 128, unsigned, as vpdpbusd takes them
                with cgutils.for_range(builder, n_blocks) as loop:
                    block(loop.index, builder.mul(loop.index, index(CHUNKS_PER_BLOCK)),
                          lambda w: builder.xor(w, repeated(0x80808080)))
            else:  # low nibbles: blocks 0 .. nb/2 - 1; high nibbles: the rest, from the same chunks
                upper = builder.lshr(n_blocks, index(1))
                with cgutils.for_range(builder, upper) as loop:
                    block(loop.index, builder.mul(loop.index, index(CHUNKS_PER_BLOCK)),
                          lambda w: builder.and_(w, repeated(0x0F0F0F0F)))
                with cgutils.for_range(builder, upper) as loop:
                    block(builder.add(loop.index, upper), builder.mul(loop.index, index(CHUNKS_PER_BLOCK)),
                          lambda w: builder.and_(builder.lshr(w, repeated(4)), repeated(0x0F0F0F0F)),
                          builder.mul(n_blocks, index(4 * LANES * CHUNKS_PER_BLOCK // 2)))  # the next group
            for i in range(x_rows):
                out = pointer(context, builder, t[15], acc_arr, index(i * width), floats)
                builder.store(builder.load(totals[i]), out, align=4)
            return context.get_dummy_value()
        return signature, codegen
    product.__name__ = product.__qualname__ = f"group_product_{x_rows}{'_half' if half_group else ''}"
    return intrinsic(product)


group_gemv = _group_product(1)
group_gemv.__doc__ = """acc[0 .. 15] = the product of the group's 16 rows of a weight of the
GGML kind `kind` (kind_arg.py: one machine code per kind; the arrays must be that
kind's) (bytes from quants[q_at], flat) with one row of x: its int8 values from
xq[x_at], its block scales and sums dx[row_at + b], qsum[row_at + b] (int32; float32
for the kinds with mins); the group's scales (and mins) of block b at
scales[s_at + 16 b + j]: float16 bits, or with supers given (Q4_K, Q5_K) 6-bit
integers times the super-block's d (and dmin) at supers[u_at + 32 (b / 8) (+ 16) + j];
Q5_x's and Q5_K's fifth bits in bytes from fifths[f_at] (flat, or None). Q6_K (int8
scales: two sub-scales a block at scales[s_at + 16 (2b + h) + j], d at
supers[u_at + 16 (b / 8) + j], bits 4 and 5 in fifths): qsum holds 32 times x's
sums of 16 values, block b's at [2 (row_at + b) + h], and the block's dot is
sa (S_a - 32 xa) + sb (S_b - 32 xb), exact (LANES.md has the float steps).
quants int8: Q8_0; uint8 the others."""
group_gemm = _group_product(X_ROWS)
group_gemm.__doc__ = """group_gemv for X_ROWS rows of x, side by side as interleave_rows lays out a pass
(x_at, row_at: the pass's first value and block): acc[16 i .. 16 i + 15] is row i's
product."""


WIDE_ROWS = 16  # rows of x a pass of group_gemm_wide
group_gemm_wide = _group_product(WIDE_ROWS)
group_gemm_wide.__doc__ = """group_gemm for WIDE_ROWS rows of x: each chunk of the group loaded and made
unsigned once for 16 rows' vpdpbusd; 16 accumulators and the chunk still fit the 32
zmm registers (32 rows spill). With AVX2 they spill to the stack, but the chunk's
unpacking is shared by more rows: 4 or 8 rows a pass were slower (Q6_K 49 and 64
against 72 GMAC/s, Q4_K 98 and 112 against 114). The same bits."""


# AVX2, 4-bit kinds: a group's halves (8 rows, one ymm) apart, HALF_ROWS rows of x a
# pass (8 where 8 or 16 are left), each row's int16 sums in a register beside the chunk
# and its product, x's 4 bytes at one base plus immediates. 16 rows of both halves
# (group_gemm_wide) spill ~230 loads and stores a block. Zen 2, Q4_K, 32 rows: 120 ->
# 130 GMAC/s (12 rows alone 69 a core; without the float epilogue that all blocks need,
# 108: vpmaddubsw's port). Q5 and Q6_K flush their int16 sums every 4 or 2 chunks, and
# ran slower this way: they keep group_gemm_wide.
HALF_ROWS = 12
group_half_gemm = _group_product(HALF_ROWS, half_group=True)
group_half_gemm.__doc__ = """group_gemm for half a group of a 4-bit kind (Q4_0, Q4_1, Q4_K: its 8 lanes at the
offsets given, q_at + 32 h, s_at + 8 h, u_at + 8 h for half h) and HALF_ROWS rows of x,
interleaved (lanes_product.interleave_rows; x_at, row_at: the pass's first value and
block): acc[8 i .. 8 i + 7] is row i's product. AVX2 only. The same bits."""
group_half_gemm_8 = _group_product(X_ROWS, half_group=True)
group_half_gemm_8.__doc__ = "group_half_gemm for X_ROWS rows of x."


@intrinsic
def prefetch(typingctx, array, start, stop):
    """Hints the cache lines of array's elements start .. stop - 1 (flat, C-contiguous)
    into the caches (llvm.prefetch: a read, kept close), so that a group's bytes
    arrive while the group before it is multiplied."""
    if not c_array(array, tuple(types.number_domain)) or array.ndim != 1:
        return None
    signature = types.void(array, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        arr, start, stop = args
        size = context.get_abi_sizeof(context.get_data_type(sig.args[0].dtype))
        length = builder.mul(builder.sub(stop, start), index(size))
        lines = builder.udiv(builder.add(length, index(63)), index(64))
        with cgutils.for_range(builder, lines) as loop:
            at = builder.add(start, builder.udiv(builder.mul(loop.index, index(64)), index(size)))
            _prefetch_line(context, builder, sig.args[0], arr, at)
        return context.get_dummy_value()
    return signature, codegen


@intrinsic
def store_lanes(typingctx, acc, acc_at, out, out_at):
    """out[out_at .. + 15] = acc[acc_at .. + 15] (both flat float32) in one vector store
    (numba's loop over the 16 stayed scalar)."""
    if not (_flat(acc, (types.float32,)) and _flat(out, (types.float32,))):
        return None
    signature = types.void(acc, types.intp, out, types.intp)

    def codegen(context, builder, sig, args):
        acc_arr, acc_at, out_arr, out_at = args
        value = builder.load(pointer(context, builder, sig.args[0], acc_arr, acc_at, FLOATS), align=4)
        builder.store(value, pointer(context, builder, sig.args[2], out_arr, out_at, FLOATS), align=4)
        return context.get_dummy_value()
    return signature, codegen
