"""RopeTables (model/rope_tables.py): on a host backend the tables grow with the
positions steps reach, the rows already there unchanged; a step past them reads the
same angles as tables made whole; and generation is the same token for token."""
import numpy as np

from tinypaged import LLM, SamplingParams
from tinypaged.kernels import reference
from tinypaged.model import rope_tables
from tinypaged.model.config import ModelConfig
from tinypaged.model.rope_tables import RopeTables


class HostOps:
    name = "cpu"
    rope_tables = staticmethod(reference.rope_tables)


class DeviceOps(HostOps):
    name = "cuda"


def test_host_tables_grow_to_the_positions_reached_and_keep_their_rows(stories_dir):
    cfg = ModelConfig.from_json(f"{stories_dir}/config.json")
    tables = RopeTables(cfg, HostOps, max_positions=5000)
    assert tables.rows == rope_tables.FIRST_ROWS
    first = tables.of_layer[0][0].copy()
    tables.cover(np.array([3, 17, 1500]))
    assert tables.rows == 2 * rope_tables.FIRST_ROWS  # (doubled: it covers 1,500)
    tables.cover(np.array([4321]))
    assert tables.rows == 4322
    whole_cos, whole_sin = reference.rope_tables(5000, cfg.head_dim, cfg.rope_of(0))
    cos, sin = tables.of_layer[0]
    assert np.array_equal(cos, whole_cos[:4322]) and np.array_equal(sin, whole_sin[:4322])
    assert np.array_equal(cos[:len(first)], first)
    tables.cover(np.array([], dtype=np.int64))  # (an empty step changes nothing)
    assert tables.rows == 4322


def test_device_tables_cover_every_position_from_the_start(stories_dir):
    cfg = ModelConfig.from_json(f"{stories_dir}/config.json")
    tables = RopeTables(cfg, DeviceOps, max_positions=3000)
    assert tables.rows == 3000
    tables.cover(np.array([2999]))
    assert tables.rows == 3000


def test_generation_with_tables_grown_step_by_step_is_unchanged(stories_dir, monkeypatch):
    prompt = "Once upon a time, there was a little girl named Lily. She loved to play"
    params = SamplingParams(max_tokens=40, temperature=0)
    with LLM(stories_dir, backend="cpu") as llm:
        expected = llm.generate(prompt, params)[0].outputs[0].token_ids
    monkeypatch.setattr(rope_tables, "FIRST_ROWS", 4)  # (grown many times on the way)
    with LLM(stories_dir, backend="cpu") as llm:
        assert llm.engine.runner.model.rope.rows == 4
        assert llm.generate(prompt, params)[0].outputs[0].token_ids == expected
        assert llm.engine.runner.model.rope.rows >= 40
