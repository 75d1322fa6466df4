"""The products' large outputs from a per-step workspace (kernels/cpu/out_arrays.py):
within a step no array is handed out twice; the next step reuses them; outside a
step, and for small outputs, every array is fresh; to_host copies a pooled array."""
import threading

import numpy as np

from tinypaged.kernels import cpu
from tinypaged.kernels.cpu.out_arrays import REUSE_BYTES, output_array, step_workspace

ROWS, COLS = 4, REUSE_BYTES // 16  # 4 rows of float32: exactly REUSE_BYTES


def test_within_a_step_no_array_is_handed_out_twice_and_the_next_step_reuses_them():
    with step_workspace():
        first, second = output_array(ROWS, COLS), output_array(ROWS, COLS)
        with step_workspace():  # (a nested scope joins the step)
            third = output_array(ROWS, COLS)
    assert len({id(first), id(second), id(third)}) == 3
    with step_workspace():
        again = [output_array(ROWS, COLS) for _ in range(3)]
    assert [a is b for a, b in zip(again, (first, second, third))] == [True] * 3


def test_outside_a_step_and_small_outputs_are_fresh():
    assert output_array(ROWS, COLS) is not output_array(ROWS, COLS)
    with step_workspace():
        small = output_array(2, 8)
    with step_workspace():
        assert small.shape == (2, 8) and output_array(2, 8) is not small


def test_to_host_copies_a_pooled_output_and_passes_others_through():
    with step_workspace():
        pooled = output_array(ROWS, COLS)
    pooled[:] = 1.0
    kept = cpu.to_host(pooled)
    assert kept is not pooled and (kept == 1.0).all()
    with step_workspace():
        output_array(ROWS, COLS)[:] = 2.0  # the next step writes over the pool
    assert (kept == 1.0).all()
    plain = np.ones(3, np.float32)
    assert cpu.to_host(plain) is plain


def test_each_thread_keeps_its_own():
    with step_workspace():
        mine = output_array(ROWS, COLS)
    theirs = []

    def other():
        with step_workspace():
            theirs.append(output_array(ROWS, COLS))
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert theirs[0] is not mine
