"""NormedRows: an RMSNorm's output that the products after it compute for themselves.

A block's input norm (the backend's norm_for_products) is read by products only: q|k|v,
gate/up. At batch 1 the norm is a launch of its own (~2 us on the card, 61 of a
SmolLM2 step's ~250 launches), while the float GEMVs after it read x anyway: each of
their blocks adds the residual, sums the squares beside its dots and scales them at
the end (matmul.NORMED_GEMVS), so the norm costs no launch.

Until a product takes it, the norm is owed: the first product that folds it writes the
stream's new sum (residual_out, which the layer carries on), and `rows` itself is
written by a norm launch only where something needs the values: a product that cannot
fold it (a packed matrix, more rows than a GEMV takes), LoRA's add. Until its sum is
written the launcher runs the norm before any other launch or copy (launcher.owed), so
no kernel ever reads a residual that is not there. A NormedRows is not an array: a
kernel or op that has not been taught about it fails loudly instead of reading rows
that were never written.
"""
from __future__ import annotations

import numpy as np

from . import elementwise


class NormedRows:
    """rms_norm(x + residual) * weight over (T, H) rows, owed (above). residual None:
    the norm of x alone (then residual_out is x)."""
    __slots__ = ("x", "residual", "weight", "eps", "rows", "residual_out", "written", "_launcher")

    def __init__(self, launcher, x, residual, weight, eps: float):
        self._launcher = launcher
        self.x, self.residual, self.weight, self.eps = x, residual, weight, np.float32(eps)
        self.rows = launcher.empty(*x.shape)  # the normed rows, once written
        self.residual_out = x if residual is None else launcher.empty(*x.shape)
        self.written = False  # rows hold the values
        if residual is not None:
            launcher.owe(self.write)  # (until a product folds it: fold_args)

    @property
    def shape(self) -> tuple[int, int]:
        return self.x.shape

    def __len__(self) -> int:
        return self.x.shape[0]

    def fold_args(self) -> tuple:
        """(x_in, norm): what a normed GEMV (matmul._float_gemvs) takes as its x and
        its last argument, asked for just before its launch. That GEMV writes the
        residual's sum if it is not yet written, and the launcher owes the norm no
        more; a later one takes the sum as its x."""
        x_in, has_residual = self.x, self.residual is not None  # (a residual: the sum unwritten)
        self._launcher.forgive(self.write)
        norm = (self.residual if has_residual else x_in, self.weight, self.residual_out, self.eps,
                has_residual)
        self.x, self.residual = self.residual_out, None  # (from now on: the sum, written)
        return x_in, norm

    def write(self):
        """The rows, written by a norm launch if they are not yet (and the residual's
        sum with them): what a kernel that cannot fold the norm reads."""
        if not self.written:
            self._launcher.forgive(self.write)
            has_residual = self.residual is not None
            self._launcher(elementwise.add_rms_norm, self.x.shape[0], elementwise.NORM_THREADS,
                           self.x, self.residual if has_residual else self.x, has_residual,
                           self.weight, self.eps, self.rows, self.residual_out,
                           self.rows, False)  # (rounded: not written)
            self.x, self.residual, self.written = self.residual_out, None, True
        return self.rows


def rows_of(x):
    """x as an array: a NormedRows' rows written, any other x as it is."""
    return x.write() if isinstance(x, NormedRows) else x
