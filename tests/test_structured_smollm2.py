"""Structured outputs on the real SmolLM2: 50 samples of each kind at temperature 1.0,
all in one mixed batch, every one valid (its own Python check, and llguidance's)."""
from structured_cases import CASES, assert_all_valid
from tinypaged import SamplingParams

PROMPTS = {"json": "A person, as JSON with name, age and pet:",
           "regex": "A product code:",
           "choice": "The review 'I loved it' is",
           "gbnf": "The children in the story were"}


def test_50_samples_of_each_kind_all_match(smollm2):
    kinds = sorted(CASES)
    outputs = smollm2.generate(
        [PROMPTS[kind] for kind in kinds for _ in range(50)],
        [SamplingParams(max_tokens=48, temperature=1.0, seed=seed, structured_outputs=CASES[kind][0])
         for kind in kinds for seed in range(50)])
    for i, kind in enumerate(kinds):
        assert_all_valid(outputs[50 * i:50 * i + 50], kind, smollm2.engine)
    assert smollm2.stats()["blocks_used"] == 0
