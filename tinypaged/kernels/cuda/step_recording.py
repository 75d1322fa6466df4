"""StepRecording: the kernel launches of one static step, kept to be launched again.

A step is static when every kernel argument is a fixed device buffer (or a scalar
fixed for the recording) and no host value decides anything inside it: then the
same launches, in the same order, compute the next step once its input buffers
are rewritten. On a GPU the launches are captured into one CUDA graph (a step
costs one graph launch instead of ~245 launches from Python, ~10-35 us each);
elsewhere, the CUDA simulator included, `replay` launches them one by one, which
is what the tests hold equal to the eager step.
"""
from __future__ import annotations

from .memory import StepWorkspace


class StepRecording:
    def __init__(self, workspace: StepWorkspace | None = None):
        """workspace: where the step's activations live; no eager step may use it (a
        recording's launches name arrays in it). Recordings that never run at once
        (the steps of one batch-size bucket) may share one."""
        self.launches: list[tuple] = []  # (kernel, grid, block, args) in launch order
        self.workspace = workspace or StepWorkspace()
        self.graph = None  # the captured CUDA graph, on a GPU

    def __len__(self) -> int:
        return len(self.launches)

    def add(self, kernel, grid, block, args: tuple) -> None:
        self.launches.append((kernel, grid, block, args))

    def clear(self) -> None:
        self.launches.clear()
        self.graph = None

    def replay(self) -> None:
        """Launch every recorded kernel again, in order (the eager form of the graph)."""
        for kernel, grid, block, args in self.launches:
            kernel[grid, block](*args)

    def capture_graph(self) -> None:
        """Capture the launches into a CUDA graph (numba-cuda >= 0.29 launches onto a
        cuda.core GraphBuilder). The kernels are compiled already: the step ran
        eagerly while it was recorded, so capture records launches only."""
        from cuda.core import Device
        from numba import cuda

        device = Device(cuda.get_current_device().id)
        device.set_current()
        builder = device.create_graph_builder()
        builder.begin_building()
        for kernel, grid, block, args in self.launches:
            kernel[grid, block, builder](*args)
        self.graph = builder.end_building().complete()

    def launch(self) -> None:
        """Run the step: the graph on the legacy default stream (ordered after the
        synchronous metadata upload and before the logits' copy back, both on that
        stream), or the launches one by one where no graph was captured."""
        if self.graph is None:
            self.replay()
            return
        from cuda.core import LEGACY_DEFAULT_STREAM

        self.graph.launch(LEGACY_DEFAULT_STREAM)
