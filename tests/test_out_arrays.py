"""The products' large outputs reused between calls (kernels/cpu/out_arrays.py): an
array is handed out again only when nothing else holds it or a view of it."""
import threading

import numpy as np

from tinypaged.kernels.cpu.out_arrays import REUSE_BYTES, output_array

ROWS, COLS = 4, REUSE_BYTES // 16  # 4 rows of float32: exactly REUSE_BYTES


def test_a_held_output_is_never_handed_out_again():
    first = output_array(ROWS, COLS)
    first[:] = 1.0
    second = output_array(ROWS, COLS)
    assert second is not first
    view = second[1:3]
    del second
    third = output_array(ROWS, COLS)
    assert third is not first and third is not view.base  # a view holds its array
    assert (first == 1.0).all()


def test_a_released_output_is_reused_and_small_ones_are_not_kept():
    first = output_array(ROWS, COLS)
    address = first.ctypes.data
    del first
    assert output_array(ROWS, COLS).ctypes.data == address
    small = output_array(2, 8)
    assert small.shape == (2, 8) and small.dtype == np.float32
    assert output_array(2, 8) is not small


def test_each_thread_keeps_its_own():
    mine = output_array(ROWS, COLS)
    address = mine.ctypes.data
    del mine
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(output_array(ROWS, COLS).ctypes.data))
    thread.start()
    thread.join()
    assert theirs[0] != address
