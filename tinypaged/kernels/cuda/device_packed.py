"""A PackedWeight on the device: its arrays uploaded as the host holds them, and the
kernels that read its kind (packed_matmul.py for Q8_0 and Q4_x, kquant_matmul.py for
Q5_x and the K-quants)."""
import numpy as np
from numba import cuda

from ...formats.quant_kind import Q4_0, Q4_1, Q8_0
from . import kquant_matmul
from .packed_matmul import (Q4_0_KIND, Q4_1_KIND, Q8_0_KIND, gemv_q4, gemv_q4_gate_up_silu, gemv_q4_qkv,
                            gemv_q8_0, gemv_q8_0_gate_up_silu, gemv_q8_0_qkv, matmul_tiled_packed)


class DevicePacked:
    """A PackedWeight's arrays on the device, as the host holds them (float16 scales and
    mins as float16). shape: (N, K) of the weights it stands for; kind: its QuantKind;
    layout: the small integer its kernels take for it (packed_matmul's and
    kquant_matmul's *_KIND). decode and tiled:
    the tuples the GEMVs and the tiled product take (Q8_0's GEMVs read its quants as
    int32 words); decode_kernels and tiled_kernel: the kernels that read them."""
    __slots__ = ("kind", "layout", "shape", "arrays", "decode", "tiled", "decode_kernels", "tiled_kernel")

    def __init__(self, packed):
        self.shape, self.kind = packed.shape, packed.kind
        if packed.ggml_type not in (Q8_0, Q4_0, Q4_1):
            self.layout, self.arrays = kquant_matmul.upload(packed)
            self.decode = self.tiled = (*self.arrays, self.layout)
            self.decode_kernels = kquant_matmul.DECODE_KERNELS[self.layout]
            self.tiled_kernel = kquant_matmul.TILED_KERNELS[self.layout]
            return
        self.layout = {Q8_0: Q8_0_KIND, Q4_0: Q4_0_KIND}.get(packed.ggml_type, Q4_1_KIND)
        quants = cuda.to_device(packed.quants)
        scales = cuda.to_device(packed.scales.view(np.float16))
        mins = packed.mins if packed.mins is not None else np.zeros((1, 1), np.uint16)
        mins = cuda.to_device(mins.view(np.float16))
        self.arrays = (quants, scales, mins)
        words = quants.view(np.int32) if self.layout == Q8_0_KIND else quants
        self.decode = (words, scales, mins, self.layout == Q4_1_KIND)
        self.tiled = (quants, scales, mins, self.layout)
        self.decode_kernels = (gemv_q8_0, gemv_q8_0_qkv, gemv_q8_0_gate_up_silu) \
            if self.layout == Q8_0_KIND else (gemv_q4, gemv_q4_qkv, gemv_q4_gate_up_silu)
        self.tiled_kernel = matmul_tiled_packed

    @property
    def quants(self):
        return self.arrays[0]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)
