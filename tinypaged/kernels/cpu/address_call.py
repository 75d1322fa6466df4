"""A kernel called from a parallel loop by its address, not compiled into the loop.

numba compiles a kernel a prange loop calls into the loop's code, and LLVM optimizes and
emits that code once for the callee's own library and again for each library that links
it in: the loop's gufunc, numba's two wrappers around it and the function that holds the
loop. The paged attention's items (~1.6 MB of IR) went through LLVM five times: 15 of a
cold first call's 23 s. Called by address, a kernel is compiled once, for the
arguments' types, and the loop's code is a call.

    entry = compiled_entry(kernel, arg_types)  # (address, digest): an int64 pair
    ...
    for c in prange(n):
        done[c] = call_entry(entry, (c, a, b))  # False: entry was compiled for other types

The digest names the argument types the address was compiled for; call_entry calls only
where its own arguments' types have that digest (never into code built for another
layout), else returns False for the caller to find the right entry: run_at_address
keeps a caller's entries and compiles the one a call lacks. The loops so built: the
paged attention's items, the packed GEMV's and GEMM's (lanes_product.py), sampling's
rows.
"""
import hashlib

import numpy as np
from llvmlite import ir
from numba import typeof, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...jit_cache import compile_as_called


def types_digest(arg_types) -> int:
    """A 63-bit digest of a tuple of numba types (their printed names)."""
    named = "\0".join(str(t) for t in arg_types).encode()
    return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "little") >> 1


def compiled_entry(kernel, arg_types) -> np.ndarray:
    """[address, digest] (int64) of `kernel` (a cached_njit kernel returning None)
    compiled for arg_types: its C entry (numba's cfunc wrapper: arguments by value, as
    numba holds them)."""
    arg_types = tuple(arg_types)
    compile_as_called(kernel, arg_types)
    result = kernel.overloads[arg_types]
    assert result.signature.return_type == types.none, result.signature
    address = result.library.get_pointer_to_function(result.fndesc.llvm_cfunc_wrapper_name)
    return np.array([address, types_digest(arg_types)], np.int64)


@intrinsic
def call_entry(typingctx, entry, args):
    """Calls entry's kernel (compiled_entry's pair) with the tuple `args`' values; True,
    or False (no call) where entry was compiled for other types than args'."""
    if not (isinstance(entry, types.Array) and entry.dtype == types.int64 and entry.ndim == 1
            and isinstance(args, types.BaseTuple)):
        return None
    digest = types_digest(args.types)

    def codegen(context, builder, sig, llargs):
        entry_array = context.make_array(sig.args[0])(context, builder, llargs[0])
        address = builder.load(entry_array.data)
        expected = builder.load(builder.gep(entry_array.data, [ir.Constant(ir.IntType(64), 1)]))
        matches = builder.icmp_unsigned("==", expected, ir.Constant(ir.IntType(64), digest))
        with builder.if_then(matches):
            function = ir.FunctionType(context.get_value_type(types.none),
                                       [context.get_value_type(t) for t in args.types])
            values = cgutils.unpack_tuple(builder, llargs[1], len(args.types))
            builder.call(builder.inttoptr(address, function.as_pointer()), values)
        return matches
    return types.boolean(entry, args), codegen


def run_at_address(loop, args: tuple, kernel, entries: dict, key, kernel_types=None):
    """loop(*args, entry): a parallel loop whose items call `kernel` by call_entry, entry
    its address; it returns False where entry does not take its arguments (nothing
    ran), else what this returns. entry: entries[key] where it takes them, else one
    compiled for kernel_types(args) (the kernel's numba argument types; by default an
    item's index and args' own) and kept under key."""
    entry = entries.get(key)
    done = entry is not None and loop(*args, entry)
    if done is False:
        arg_types = kernel_types(args) if kernel_types else (types.int64, *map(typeof, args))
        entry = entries[key] = compiled_entry(kernel, arg_types)
        done = loop(*args, entry)
        assert done is not False, f"{kernel.py_func.__name__}'s entry does not take these arguments"
    return done
