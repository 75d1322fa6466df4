"""A weight's kind as a kernel argument: `kind_arg(kind)` is what the packed products
(lanes_product.py) pass, and numba types it as QuantKindType(kind), so each kind
compiles its own machine code and the IR writers read the kind from the argument's
type, never from the arrays'. The value itself carries nothing at run time.

(A plain int would need numba.literally, which makes the dispatcher try the
non-literal signature on every call: milliseconds a product. `_numba_type_` is
numba's fast path for an object's type: under a microsecond a call.)
"""
from numba import types
from numba.extending import NativeValue, models, register_model, unbox

from ...formats.quant_kind import KINDS, QuantKind


class QuantKindType(types.Type):
    """The numba type of one kind's argument; `.kind` is its QuantKind."""

    def __init__(self, code: int):
        self.code = code
        super().__init__(name=f"QuantKind({KINDS[code].name})")

    @property
    def kind(self) -> QuantKind:
        return KINDS[self.code]


register_model(QuantKindType)(models.OpaqueModel)


@unbox(QuantKindType)
def _unbox_kind(typ, obj, c):
    return NativeValue(c.context.get_constant_null(typ))  # (the type says it all)


class _KindArg:
    __slots__ = ("_numba_type_",)

    def __init__(self, code: int):
        self._numba_type_ = QuantKindType(code)


_ARGS = {code: _KindArg(code) for code, k in KINDS.items() if k.packable}


def kind_arg(kind: QuantKind) -> _KindArg:
    """The argument that hands `kind` to a kernel."""
    return _ARGS[kind.code]
