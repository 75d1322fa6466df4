"""Launcher: every kernel launch of a CUDA backend goes through it. It owns the step
workspace that launches' outputs are carved from, the arrival counts split kernels
share, the recording a launch joins while a decode step is recorded for replay
(step_recording.py), and the counts that tests and benchmarks read: launches from the
host, replays, graph launches, transfers and the bytes of logits copied back."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from numba import config, cuda

from .memory import StepWorkspace

SIMULATOR_SMS = 8  # the simulator's "SMs" for the grids' wave arithmetic (a GPU's own count otherwise)


class Launcher:
    def __init__(self):
        self.workspace = StepWorkspace()
        self.launches = 0  # kernel launches from the host (a recording's first run, and a
        #   replay without a graph, too)
        self.replays = 0  # recorded steps run again
        self.graph_launches = 0  # of those, the ones launched as one CUDA graph (on a GPU)
        self.transfers = 0  # host <-> device copies of step inputs, logits and CoW pairs
        self.bytes_to_host = 0  # of logits and candidates copied back
        self._recording = None  # the StepRecording that launches are added to, if any
        self._arrivals = None  # int32 counts, zero between launches (arrival_counts)
        self.owed = None  # a launch owed before any other (owe)
        self.sms = SIMULATOR_SMS if config.ENABLE_CUDASIM else \
            cuda.get_current_device().MULTIPROCESSOR_COUNT

    def __call__(self, kernel, grid, block, *args) -> None:
        if self.owed is not None:
            self.settle()
        self.launches += 1
        if self._recording is not None:
            self._recording.add(kernel, grid, block, args)
        kernel[grid, block](*args)

    def owe(self, launch) -> None:
        """launch() must run before any other launch or copy back (settle), unless
        forgiven first: a NormedRows' norm until a product folds it (normed_rows.py)."""
        self.settle()
        self.owed = launch

    def forgive(self, launch) -> None:
        """launch is no longer owed (its work is done by another)."""
        if self.owed == launch:
            self.owed = None

    def settle(self) -> None:
        """Run the owed launch, if any."""
        owed, self.owed = self.owed, None
        if owed is not None:
            owed()

    def empty(self, *shape):
        """A float32 device array of shape from the step's workspace."""
        return self.workspace.take(shape)

    def arrival_counts(self, *shape):
        """An int32 device array of shape, all zero, that a kernel's blocks count their
        arrivals in and the last to arrive sets back to zero before it ends (the decode
        attention's merge): one buffer, kept across steps and recordings."""
        n = int(np.prod(shape))
        if self._arrivals is None or self._arrivals.size < n:
            self._arrivals = cuda.to_device(np.zeros(max(n, 1024), dtype=np.int32))
        return self._arrivals[:n].reshape(shape)

    def new_step(self) -> None:
        """A step's inputs go up: its workspace starts empty."""
        self.workspace.reset()
        self.owed = None  # (the last step's arrays are gone)
        self.transfers += 1

    @contextmanager
    def recording(self, recording):
        """Within: every launch also goes into `recording` (cleared first), and
        activations come from the recording's own workspace, so the arrays its
        launches name stay theirs."""
        assert self._recording is None, "recordings do not nest"
        recording.clear()
        recording.workspace.reset()
        eager_workspace, self.workspace, self._recording = self.workspace, recording.workspace, recording
        try:
            yield recording
            self.settle()  # (in the recording, as the eager step would)
        finally:
            self.workspace, self._recording = eager_workspace, None
