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

import warnings

from .memory import StepWorkspace

CAPTURE_NEEDS = ("numba-cuda >= 0.30.2 (kernel launches onto a cuda.core GraphBuilder; the first "
                 "release that takes cuda-core 1.x) and cuda-core >= 1.0")


class StepRecording:
    def __init__(self, workspace: StepWorkspace | None = None):
        """workspace: where the step's activations live; no eager step may use it (a
        recording's launches name arrays in it). Recordings that never run at once
        (the steps of one batch-size bucket) may share one."""
        self.launches: list[tuple] = []  # (kernel, grid, block, args) in launch order
        self.workspace = workspace or StepWorkspace()
        self.graph = None  # launches the captured CUDA graph, on a GPU

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

    def capture_graph(self) -> bool:
        """Capture the launches into a CUDA graph; True if it worked. The kernels are
        compiled already (the step ran eagerly while it was recorded), so capture
        records launches only. Should capture fail (an older numba-cuda or
        cuda-core, a driver that refuses), a warning says why and the recording
        replays launch by launch: slower, never wrong."""
        try:
            self.graph = self._capture()
            return True
        except Exception as e:  # noqa: BLE001 - any failure means: no graph
            self.graph = None
            warnings.warn(f"CUDA graph capture failed ({e!r}); decode steps replay kernel "
                          f"by kernel instead (graphs need {CAPTURE_NEEDS})", RuntimeWarning,
                          stacklevel=2)
            return False

    def _capture(self):
        """The launches captured onto a cuda.core GraphBuilder -> a function that
        launches the graph on the legacy default stream (ordered after the
        synchronous metadata upload and before the logits' copy back, both on that
        stream). No device memory may be freed meanwhile (numba's deferred cleanup
        holds frees back). The tests replace this to make capture fail or succeed."""
        from cuda.core import LEGACY_DEFAULT_STREAM, Device
        from numba import cuda

        device = Device(cuda.get_current_device().id)
        device.set_current()
        builder = None
        try:
            with cuda.defer_cleanup():
                builder = device.create_graph_builder()
                builder.begin_building()
                for kernel, grid, block, args in self.launches:
                    kernel[grid, block, builder](*args)
                graph = builder.end_building().complete()
        except Exception:
            if builder is not None:
                try:
                    builder.end_building()  # leave the capture stream usable
                except Exception:  # noqa: BLE001 - it was invalid already
                    pass
            raise
        return lambda: graph.launch(LEGACY_DEFAULT_STREAM)

    def launch(self) -> int:
        """Run the step: the captured graph, or the launches one by one where no graph
        was captured. Returns the kernel launches made from the host (0 for a graph)."""
        if self.graph is None:
            self.replay()
            return len(self.launches)
        self.graph()
        return 0
