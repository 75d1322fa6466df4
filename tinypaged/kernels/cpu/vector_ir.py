"""The LLVM IR helpers the CPU's vector intrinsics share (lanes_ir.py, byte_dot.py,
attention_ir.py): 16 lanes of float32 or int32, one 512-bit vector (two 256-bit ones
with AVX2), and addressing into numba's C-contiguous arrays."""
from llvmlite import ir
from numba import types

LANES = 16  # W rows per group: one 512-bit vector of float32 / int32
X_ROWS = 8  # rows of x a narrow GEMM pass takes: eight accumulators

IR_I8, IR_I32, IR_I64, IR_F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
FLOATS = ir.VectorType(IR_F32, LANES)
INTS = ir.VectorType(IR_I32, LANES)


def index(value: int) -> ir.Constant:
    return ir.Constant(IR_I64, value)


def mask(values) -> ir.Constant:
    values = list(values)
    return ir.Constant(ir.VectorType(IR_I32, len(values)), values)


def splat(builder, value, vector_type):
    one = builder.insert_element(ir.Constant(vector_type, None), value, ir.Constant(IR_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector_type, None), mask([0] * vector_type.count))


def pointer(context, builder, array_type, array, offset, as_type=None):
    """The address of element `offset` (flat) of a C-contiguous array, optionally cast
    to a pointer to as_type."""
    address = builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])
    return address if as_type is None else builder.bitcast(address, as_type.as_pointer())


def c_array(array_type, dtypes) -> bool:
    return isinstance(array_type, types.Array) and array_type.layout == "C" and array_type.dtype in dtypes
