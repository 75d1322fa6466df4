"""Hints into the CPU's caches: the IR a kernel emits for one line (lanes_ir.py's
products hint their own bytes ahead), and an intrinsic for numba code that hints a
line of a byte array (a product hinting the bytes its caller reads next)."""
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_ir import IR_I8, IR_I32, c_array, index, pointer

LINE_BYTES = 64  # a cache line
TO_L1, TO_L2 = 3, 2  # LLVM's prefetch locality: 3 into L1 (prefetcht0), 2 into L2 (prefetcht1)


def prefetch_line(builder, address, level):
    """Hints the cache line holding address into the caches (a read; level: TO_L1 or
    TO_L2)."""
    i8p = IR_I8.as_pointer()
    hint = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, IR_I32, IR_I32, IR_I32]), "llvm.prefetch.p0i8")
    builder.call(hint, [builder.bitcast(address, i8p)] + [ir.Constant(IR_I32, v) for v in (0, level, 1)])


@intrinsic
def hint_line(typingctx, data, line):
    """Hints line `line` (LINE_BYTES each) of a flat uint8 array into L2 (no effect on
    any value; a line past the end is hinted as well: a hint never faults)."""
    if not (c_array(data, (types.uint8,)) and data.ndim == 1 and isinstance(line, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        at = builder.mul(args[1], index(LINE_BYTES))
        prefetch_line(builder, pointer(context, builder, sig.args[0], args[0], at), TO_L2)
        return context.get_dummy_value()
    return types.void(data, types.intp), codegen


@njit(inline="always")
def hint_parts(data, first, count, parts):
    """Hints `count` parts from part `first` of `parts` equal parts of a flat uint8 array's
    lines into L2 (a product's pass: the bytes its caller reads next, spread over its
    work; bursts of a group's ~150 lines at once had many of them dropped: a pass's
    ~20-40 land, SmolLM2's LoRA step 0.34 ms faster (median), bench/NOTES.md)."""
    lines = -(-data.size // LINE_BYTES)
    for line in range(first * lines // parts, (first + count) * lines // parts):
        hint_line(data, line)
