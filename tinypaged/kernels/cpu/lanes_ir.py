"""LLVM IR for the packed products on laid-out weights (lanes.py): one group's 16 rows
(or half of them) times a pass of x's rows, the group's rows in the lanes of every
vector (LANES.md walks through one block).

A call takes views, not (array, offset) pairs: the group's arrays from its first
element (`W_VIEWS`, lanes.py's layout) and the pass's rows of x from theirs
(`X_VIEWS`, as lanes_product._gemm_x lays them out: a chunk's 4 columns of every row side
by side). What differs by kind is written once, in two places: `_unpack` (a chunk's
64 bytes to the unsigned bytes the byte dot takes, high bits added) and the
`_Epilogue`s (a block's integer dots to the float term LANES.md's contract adds).
The byte dot itself is byte_dot.BlockDot, one per instruction set.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ...formats.quant_kind import Q6_K, Q8_0, QuantKind
from .byte_dot import LANES_ISA, BlockDot, signed_bytes_direct
from .cache_hints import TO_L1, TO_L2, prefetch_line
from .kind_arg import QuantKindType
from .vector_ir import IR_F32, IR_I32, FLOATS, LANES, X_ROWS, c_array, index, pointer, splat

CHUNKS_PER_BLOCK = 8  # 4 columns a chunk, 32 a block
W_VIEWS = ("quants", "scales", "mins", "supers", "fifths")  # a group's, from its first lane
X_VIEWS = ("values", "scales", "sums")  # a pass's rows of x: int8 values, dx, block sums
# Rows of x a GEMM pass takes: WIDE_ROWS: each chunk of the group loaded and unpacked
# once for 16 rows' vpdpbusd; 16 accumulators and the chunk still fit the 32 zmm
# registers (32 rows spill). With AVX2 they spill to the stack, but the chunk's
# unpacking is shared by more rows: 4 or 8 rows a pass were slower (Q6_K 49 and 64
# against 72 GMAC/s, Q4_K 98 and 112 against 114). SHORT_ROWS: 3-4 rows (a speculative
# step's) at about a GEMV's cost. AVX2, 4-bit kinds: a group's halves (8 rows, one ymm)
# apart, HALF_ROWS rows of x a pass, each row's int16 sums in a register beside the
# chunk and its product. 16 rows of both halves spill ~230 loads and stores a block.
# Zen 2, Q4_K, 32 rows: 120 -> 130 GMAC/s (12 rows alone 69 a core; without the float
# epilogue that all blocks need, 108: vpmaddubsw's port). Q5 and Q6_K flush their int16
# sums every 4 or 2 chunks, and ran slower this way: they keep whole groups. VNNI takes
# HALF_ROWS rows of whole groups, every kind: Q6_K's two half-block sums a row are 32
# registers at 16 rows, and the others' 16 sums and totals spilled (Zen 5, one thread,
# 32 rows: Q6_K +3.5-4%, Q4_K +3-5%, Q4_1, Q8_0, Q5_0 +1-4%, Q5_K -1 to +2%; 16 rows as
# 8 + 8: Q4_K +3-4% against one pass of 16).
WIDE_ROWS, SHORT_ROWS, HALF_ROWS = 16, 4, 12
_WORDS = ir.VectorType(ir.IntType(16), 2 * LANES)

# Hints into the caches, one line a chunk (the hardware prefetcher follows only the
# first of a group's two passes over its nibbles, and memory would idle while a group is
# multiplied): up to X_ROWS rows of x (the GEMV's, a speculative step's), the bytes AHEAD
# bytes past the chunk read (the high bits as far on in their share of the bytes), and
# in the second pass the next group's; more rows, the next group's same chunk in the
# first pass (Zen 2, the GEMV on a 37 MB matrix: 27-31 GB/s, 23-24 without; Zen 5,
# 32 rows of Llama-1B's gate/up: 305 GMAC/s against 277 for the whole group hinted in
# one burst before it). The GEMV's hints go to L2 (LLVM's locality 2: prefetcht1), the
# GEMM's to L1 (3: its group is read by every pass): a hint to L1 holds one of the
# core's few L1 miss buffers until its line comes, which capped a thread's stream
# (Zen 5, Llama-1B at batch 1: 30.5-32.1 -> 22.1-27.4 ms a step; 32 rows: no change)
AHEAD = 8192


def w_dtypes(k: QuantKind) -> tuple:
    """The dtype of each of W_VIEWS for kind k (None: the kind has no such array)."""
    q6 = k.code == Q6_K
    scales = types.int8 if q6 else types.uint8 if k.is_k_quant else types.uint16
    return (types.int8 if k.code == Q8_0 else types.uint8, scales, scales if k.has_mins else None,
            types.uint16 if k.is_k_quant else None, types.uint8 if k.high_bits else None)


def x_dtypes(k: QuantKind) -> tuple:
    """The dtype of each of X_VIEWS for kind k (sums: x_row_sums)."""
    return types.int8, types.float32, types.float32 if k.has_mins else types.int32


def dot_offset(k: QuantKind) -> int:
    """What the byte dot's unsigned bytes carry above the kind's integers (QuantKind.offset;
    Q8_0: 128 on VNNI, whose bytes go in as q + 128; Q6_K's 32 is its own, x_row_sums)."""
    if k.code == Q8_0:
        return 0 if signed_bytes_direct() else 128
    return k.offset


def x_row_sums(kind, q, qsum):
    """One row's sums as X_VIEWS reads them, from its int8 values q (K,) and block sums
    qsum (K/32,): qsum as float32 for the kinds with mins (exact: |qsum| <= 32 * 127;
    their kernel only multiplies it by the min); for the kinds whose bytes carry an
    offset, where each block's dot starts: -offset times qsum, or for Q6_K -32 times
    its sums of 16 values (K/16,), the 32 its q carry above q - 32 (so each dot ends as
    the integers' own, with no subtraction a row)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(x_row_sums)
def _x_row_sums_by_kind(kind, q, qsum):
    if not isinstance(kind, QuantKindType):
        return None
    if kind.kind.has_mins:
        return lambda kind, q, qsum: qsum.astype(np.float32)
    if kind.code != Q6_K:
        start = np.int32(-dot_offset(kind.kind))
        return lambda kind, q, qsum: qsum * start

    def halves(kind, q, qsum):
        out = np.empty(len(q) // 16, np.int32)
        for h in range(len(out)):
            total = np.int32(0)
            for j in range(16):
                total += np.int32(q[16 * h + j])
            out[h] = np.int32(-32) * total
        return out
    return halves


def _views_of(tuple_type, dtypes) -> bool:
    """Whether tuple_type is a tuple of flat C arrays of these dtypes (None where None)."""
    return isinstance(tuple_type, types.BaseTuple) and len(tuple_type) == len(dtypes) and all(
        isinstance(t, types.NoneType) if d is None else
        c_array(t, (d,)) and t.ndim == 1 for t, d in zip(tuple_type, dtypes))


class _Views:
    """A tuple of views as the IR reads it: load(name, at, as_type) reads view `name`
    from element `at` (IR or int) as as_type."""

    def __init__(self, context, builder, names, tuple_type, value):
        self.context, self.builder = context, builder
        values = cgutils.unpack_tuple(builder, value, len(names))
        self.views = {n: (t, v) for n, t, v in zip(names, tuple_type, values)}

    def address(self, name, at, as_type):
        array_type, array = self.views[name]
        at = index(at) if isinstance(at, int) else at
        return pointer(self.context, self.builder, array_type, array, at, as_type)

    def load(self, name, at, as_type, align=1):
        return self.builder.load(self.address(name, at, as_type), align=align)


def _unpack(builder, k: QuantKind, w_views, width, chunk, high, b, c):
    """Chunk `chunk` (IR) of the group, for block b (IR) and its chunk c (an int; None in
    a loop): its 64 bytes (width lanes of 4) as the byte dot takes them. Q8_0: as they
    are (signed_bytes_direct) or xor 128; the nibble kinds: low or high (`high`) nibbles,
    and Q5's fifth bit (16), Q6_K's bits 4 and 5 (16, 32) or-ed in from their bytes
    (lanes.py's fifths: the 64 bytes holding them shifted so that chunk c's land on bit
    4 (and 5); 16-bit shifts, what crosses a byte masked off)."""
    ints = ir.VectorType(IR_I32, width)
    w = w_views.load("quants", builder.mul(chunk, index(4 * LANES)), ints)
    repeated = lambda value: ir.Constant(ints, [value] * width)  # noqa: E731
    if k.code == Q8_0:
        return w if signed_bytes_direct() else builder.xor(w, repeated(0x80808080))
    w = builder.and_(builder.lshr(w, repeated(4)) if high else w, repeated(0x0F0F0F0F))
    if not k.high_bits:
        return w
    per_byte = 8 // k.high_bits  # chunks a byte's bits cover
    v = builder.add(builder.mul(b, index(CHUNKS_PER_BLOCK // per_byte)), index(c // per_byte))
    bits = w_views.load("fifths", builder.mul(v, index(4 * LANES)), ir.VectorType(ir.IntType(16), 2 * width))
    shift = 4 - k.high_bits * (c % per_byte)
    shifted = ir.Constant(bits.type, [abs(shift)] * 2 * width)
    bits = builder.shl(bits, shifted) if shift > 0 else builder.lshr(bits, shifted) if shift < 0 else bits
    return builder.or_(w, builder.and_(builder.bitcast(bits, ints), repeated(0x30303030 if k.high_bits == 2
                                                                                   else 0x10101010)))


class _Epilogue:
    """A block's integer dots (one BlockDot result per half a block, or per parity of
    chunks: `term` takes them added) to the float term of LANES.md's contract, for the
    kinds with one scale a block: Q8_0, Q4_0, Q5_0 (their dots start at -offset times
    x's block sum: `start`), Q4_1, Q5_1 (+ min times that sum: fma), Q4_K, Q5_K (scale
    d * sc, min -(dmin * m): exact)."""

    def __init__(self, builder, k: QuantKind, w_views, x_views, width):
        self.builder, self.k, self.w, self.x = builder, k, w_views, x_views
        self.floats = ir.VectorType(IR_F32, width)
        self.fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            self.floats, [self.floats] * 3), f"llvm.fma.v{width}f32")
        self.offset = dot_offset(k)

    def halves(self, name, at):
        """width float16 bits of view `name` from `at`, as float32."""
        width = self.floats.count
        bits = self.w.load(name, at, ir.VectorType(ir.IntType(16), width), align=2)
        return self.builder.fpext(self.builder.bitcast(bits, ir.VectorType(ir.HalfType(), width)), self.floats)

    def small(self, name, at):
        """width unsigned bytes of view `name` from `at`, as float32 (exact)."""
        ints = self.w.load(name, at, ir.VectorType(ir.IntType(8), self.floats.count))
        return self.builder.uitofp(ints, self.floats)

    def prepare(self, b):
        """The block's scale and min (None without) on every lane, for all rows of x."""
        builder, first = self.builder, self.builder.mul(b, index(LANES))
        if not self.k.is_k_quant:
            return self.halves("scales", first), self.halves("mins", first) if self.k.has_mins else None
        d_at = builder.mul(builder.lshr(b, index(3)), index(2 * LANES))  # (d, dmin a super-block)
        scale = builder.fmul(self.halves("supers", d_at), self.small("scales", first))
        low = builder.fneg(builder.fmul(self.halves("supers", builder.add(d_at, index(LANES))),
                                        self.small("mins", first)))
        return scale, low

    def start(self, at, chain):
        """Where chain `chain` of row `at`'s dots starts (IR; None: at zero): the offset
        kinds' first chain at -offset times x's block sum (a broadcast load, where a
        subtraction after the dot would take a vector op a row), so the dot ends as the
        sum of q x itself."""
        if not self.offset or chain:
            return None
        return splat(self.builder, self.x.load("sums", at, None, align=4), ir.VectorType(IR_I32, self.floats.count))

    def term(self, prepared, dots, at):
        """Row `at`'s term (at: its block's index in the pass's dx and sums)."""
        builder, (scale, low) = self.builder, prepared
        dot = builder.add(dots[0], dots[1])  # (the second: zeros, folded, unless two chains)
        term = builder.fmul(scale, builder.sitofp(dot, self.floats))
        if low is not None:  # fma(min, qsum, scale * dot) (qsum float32: a broadcast load)
            x_sum = self.x.load("sums", at, None, align=4)
            term = builder.call(self.fma, [low, splat(builder, x_sum, self.floats), term])
        return term


class _Q6Epilogue(_Epilogue):
    """Q6_K: d per super-block, an int8 sub-scale per half a block. Each half's dot of
    q = 0 .. 63 starts at -32 times x's half-sum (x_row_sums: block b's halves at 2 at + h,
    a broadcast load), so it ends as sum of (q - 32) x, |.| <= 16 * 32 * 127: each
    product with a sub-scale is below 2^23 and their sum below 2^24, so the integer sum
    (a vpmulld a half) is the float one LANES.md's contract takes, exactly. Against two
    float converts, muls and an fma a row, one thread, Zen 5: the GEMV +5-10%, 4 rows
    +5%, 32 rows +0-3% (bench/NOTES.md, 2026-12-05, fifteenth session)."""

    def prepare(self, b):
        builder, ints = self.builder, ir.VectorType(IR_I32, self.floats.count)
        subs = [builder.sext(self.w.load("scales", builder.mul(builder.add(builder.mul(b, index(2)), index(h)),
                                                                index(LANES)), ir.VectorType(ir.IntType(8), ints.count)),
                             ints) for h in range(2)]
        return self.halves("supers", builder.mul(builder.lshr(b, index(3)), index(LANES))), subs

    def start(self, at, chain):
        x_half = self.x.load("sums", self.builder.add(self.builder.mul(at, index(2)), index(chain)), None, align=4)
        return splat(self.builder, x_half, ir.VectorType(IR_I32, self.floats.count))

    def term(self, prepared, dots, at):
        builder, (d, subs) = self.builder, prepared
        scaled = builder.add(builder.mul(dots[0], subs[0]), builder.mul(dots[1], subs[1]))
        return builder.fmul(d, builder.sitofp(scaled, self.floats))


def by_halves(k: QuantKind) -> bool:
    """Whether a GEMM pass takes a group's halves (8 rows, one ymm) apart: AVX2 and the
    4-bit kinds (their int16 sums of a block's 8 chunks cannot overflow), below."""
    return LANES_ISA == "avx2" and k.bits == 4


def widest_pass(k: QuantKind) -> int:
    """The most rows of x a GEMM pass takes for kind k (above): HALF_ROWS where a pass
    takes half a group, and on VNNI; else WIDE_ROWS."""
    return HALF_ROWS if by_halves(k) or LANES_ISA == "vnni" else WIDE_ROWS


# The row counts of x a pass takes (lanes_product._pass_rows): up to WIDE_ROWS, or up
# to HALF_ROWS (widest_pass; a GEMV row is always a whole group's)
WHOLE_PASSES, HALF_PASSES = (1, SHORT_ROWS, X_ROWS, WIDE_ROWS), (SHORT_ROWS, X_ROWS, HALF_ROWS)


@intrinsic
def group_product(typingctx, kind, rows, n_blocks, w, x, acc):
    """acc[width i .. width i + width - 1] = the product of a group's rows (width 16; 8
    where by_halves) of a weight of kind `kind` (kind_arg.py: one machine code per kind;
    the views must be that kind's, w_dtypes) with row i of x, for `rows` rows of x
    (WHOLE_PASSES or HALF_PASSES; 1: 16 lanes) side by side as lanes_product._gemm_x lays
    them out, n_blocks blocks of 32 long: w the group's W_VIEWS (from the half's first
    lane), x the pass's X_VIEWS (LANES.md has the float steps)."""
    if not isinstance(kind, QuantKindType):
        return None
    k = kind.kind  # the views must be the ones lanes.py lays out for it
    if not (_views_of(w, w_dtypes(k)) and _views_of(x, x_dtypes(k)) and c_array(acc, (types.float32,))
            and acc.ndim == 1 and isinstance(rows, types.Integer) and isinstance(n_blocks, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        w_views = _Views(context, builder, W_VIEWS, sig.args[3], args[3])
        x_views = _Views(context, builder, X_VIEWS, sig.args[4], args[4])
        done = builder.append_basic_block("pass_done")
        cases = builder.switch(args[1], done)  # (one arm a row count; LLVM folds a constant)
        for x_rows in (1,) + (HALF_PASSES if widest_pass(k) == HALF_ROWS else WHOLE_PASSES[1:]):  # (what _pass_rows takes)
            arm = builder.append_basic_block(f"rows_{x_rows}")
            cases.add_case(ir.Constant(args[1].type, x_rows), arm)
            builder.position_at_end(arm)
            half_group = by_halves(k) and x_rows > 1
            _pass(context, builder, k, x_rows, half_group, args[2], w_views, x_views, sig.args[5], args[5])
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return types.void(kind, types.intp, types.intp, w, x, acc), codegen


def _pass(context, builder, k: QuantKind, x_rows: int, half_group: bool, blocks, w_views, x_views, acc_type, acc):
    """One pass's IR: the group's rows (half_group: 8 of them) times x_rows rows of x. Each
    chunk of the group is unpacked once, in registers, and taken by every row of x."""
    width = LANES // 2 if half_group else LANES
    floats = ir.VectorType(IR_F32, width)
    w_max = 128 if k.code == Q8_0 and signed_bytes_direct() else 255 if k.code == Q8_0 \
        else (16 << k.high_bits) - 1  # a byte's largest
    epilogue = (_Q6Epilogue if k.code == Q6_K else _Epilogue)(builder, k, w_views, x_views, width)
    totals = [cgutils.alloca_once_value(builder, ir.Constant(floats, [0.0] * width)) for _ in range(x_rows)]
    if half_group:  # (through an empty asm: a count LLVM cannot see, or it unrolls
        # the 8 rows' loop and takes the rows one after another again)
        chunk_count = builder.asm(ir.FunctionType(index(0).type, [index(0).type]), "", "=r,0",
                                  [index(CHUNKS_PER_BLOCK)], False)

    def block(b, chunk0, high, ahead):
        """Block b of the rows, from their chunks chunk0 .. chunk0 + 7 (low or high
        nibbles), times each row of x; one row: the chunks `ahead` bytes on hinted
        into the caches."""
        # Q6_K: the block's halves apart; up to SHORT_ROWS rows of x: even and odd chunks
        # apart, two chains of vpdpbusd a row, not one of eight (its latency bound the
        # GEMV: 3x)
        dots = [[BlockDot(builder, w_max, signed_bytes_direct() and k.code == Q8_0, width,
                          epilogue.start(builder.add(builder.mul(b, index(x_rows)), index(i)), chain))
                 for chain in range(2)] for i in range(x_rows)]

        def chunk(c, c_at):
            """Chunk c (an int; None in a loop) at c_at (IR) times each row of x."""
            at = builder.add(chunk0, c_at)
            w = _unpack(builder, k, w_views, width, at, high, b, c)
            if x_rows <= X_ROWS:  # (a chunk is a cache line; a line of high bits: a new one)
                prefetch_line(builder, w_views.address(
                    "quants", builder.add(builder.mul(at, index(4 * LANES)), ahead), None), TO_L2)
                if k.high_bits and c % (8 // k.high_bits) == 0:
                    line = builder.add(builder.mul(b, index(k.high_bits)), index(c // 4))
                    prefetch_line(builder, w_views.address("fifths", builder.add(
                        builder.mul(line, index(4 * LANES)), index(AHEAD * k.high_bits // 4)), None), TO_L2)
            elif not high:  # (the next group's same chunk: one line a chunk, spread over the pass)
                prefetch_line(builder, w_views.address(
                    "quants", builder.add(builder.mul(at, index(4 * LANES)), group_bytes), None), TO_L1)
            half = c // 4 if k.code == Q6_K else c % 2 if x_rows <= SHORT_ROWS and not half_group else 0
            # x's rows side by side: a chunk's 4 columns of every row in one line at
            # one base, the rest immediates (rows K apart, K a power of two from
            # 4,096, met in one L1 set and evicted each other: half the rate)
            x_chunk = builder.add(builder.mul(b, index(32 * x_rows)), builder.mul(c_at, index(4 * x_rows)))
            for i in range(x_rows):
                quad = x_views.load("values", builder.add(x_chunk, index(4 * i)), IR_I32)
                dots[i][half].add(w, splat(builder, quad, w.type))
        # half a group: a block's 8 chunks in a loop, each row's int16 sums carried
        # in a register. Unrolled, LLVM took the rows one after another with the 8
        # chunks held: 3/4 of this form's rate
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
        prepared = epilogue.prepare(b)
        for i in range(x_rows):
            at = builder.add(builder.mul(b, index(x_rows)), index(i))
            x_scale = splat(builder, x_views.load("scales", at, None, align=4), floats)
            term = epilogue.term(prepared, dots[i], at)
            builder.store(builder.call(epilogue.fma, [x_scale, term, builder.load(totals[i])]), totals[i])

    # Q8_0: a block's chunks after another's. The nibble kinds: blocks 0 .. nb/2 - 1 in
    # the low nibbles, the rest in the high ones of the same chunks (hinting the next
    # group's bytes: the hardware prefetcher follows the first pass only)
    upper = builder.lshr(blocks, index(1))
    next_group = builder.mul(blocks, index(4 * LANES * CHUNKS_PER_BLOCK // 2))
    group_bytes = builder.mul(blocks, index(4 * LANES * CHUNKS_PER_BLOCK)) if k.code == Q8_0 else next_group
    for count, high in [(blocks, False)] if k.code == Q8_0 else [(upper, False), (upper, True)]:
        with cgutils.for_range(builder, count) as loop:
            block(builder.add(loop.index, upper) if high else loop.index,
                  builder.mul(loop.index, index(CHUNKS_PER_BLOCK)), high, next_group if high else index(AHEAD))
    for i in range(x_rows):
        out = pointer(context, builder, acc_type, acc, index(i * width), floats)
        builder.store(builder.load(totals[i]), out, align=4)


@intrinsic
def store_lanes(typingctx, acc, acc_at, out, out_at):
    """out[out_at .. + 15] = acc[acc_at .. + 15] (both flat float32) in one vector store
    (numba's loop over the 16 stayed scalar)."""
    if not all(c_array(a, (types.float32,)) and a.ndim == 1 for a in (acc, out)):
        return None

    def codegen(context, builder, sig, args):
        acc_arr, acc_at, out_arr, out_at = args
        value = builder.load(pointer(context, builder, sig.args[0], acc_arr, acc_at, FLOATS), align=4)
        builder.store(value, pointer(context, builder, sig.args[2], out_arr, out_at, FLOATS), align=4)
        return context.get_dummy_value()
    return types.void(acc, types.intp, out, types.intp), codegen
