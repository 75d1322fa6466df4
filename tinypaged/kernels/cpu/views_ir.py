"""Where views lie in the arrays they are views of, for numba code handed both: a
kernel reads a view's columns in place from its C-contiguous whole (a strided view
compiles to loops several times slower), and finding them takes no Python (reading
an array's address there costs ~1 us)."""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...jit_cache import cached_njit
from .vector_ir import IR_I64, c_array, index


@intrinsic
def columns_in(typingctx, views, wholes):
    """Where each of views (2-d float32 arrays, any layout) starts in the C-contiguous
    whole of the same index: (view's address - whole's) / 4, a tuple of intp. The views'
    tuple may mix layouts (numba cannot index such a tuple in a loop)."""
    if not (isinstance(views, types.BaseTuple) and isinstance(wholes, types.BaseTuple)
            and len(views) == len(wholes) and all(isinstance(v, types.Array) and v.dtype == types.float32
                                                  for v in views)
            and all(c_array(w, (types.float32,)) for w in wholes)):
        return None
    out_type = types.UniTuple(types.intp, len(views))

    def codegen(context, builder, sig, args):
        n, columns = len(sig.args[0]), []
        view_values = cgutils.unpack_tuple(builder, args[0], n)
        whole_values = cgutils.unpack_tuple(builder, args[1], n)
        for view_type, view, whole_type, whole in zip(sig.args[0], view_values, sig.args[1], whole_values):
            start = builder.ptrtoint(context.make_array(view_type)(context, builder, view).data, IR_I64)
            origin = builder.ptrtoint(context.make_array(whole_type)(context, builder, whole).data, IR_I64)
            column = builder.sdiv(builder.sub(start, origin), index(4))
            columns.append(column)
        return context.make_tuple(builder, out_type, columns)
    return out_type(views, wholes), codegen


@cached_njit()
def are_halves(whole, left, right) -> bool:
    """Whether left and right are whole[:, :n] and whole[:, n:] (whole (T, 2 n)
    C-contiguous, left and right float32 views with its strides)."""
    width = left.shape[1]
    return left.shape == right.shape == (whole.shape[0], whole.shape[1] // 2) and 2 * width == whole.shape[1] \
        and columns_in((left, right), (whole, whole)) == (0, width)
