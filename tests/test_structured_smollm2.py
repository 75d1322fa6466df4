"""Structured outputs on the real SmolLM2: 50 samples of each kind at temperature 1.0
(a few of them with n=4), all in one batch beside free requests, every one valid (its
own Python check, and llguidance's); the free ones come out as they do alone."""
from structured_cases import CASES, assert_all_valid
from tinypaged import SamplingParams

PROMPTS = {"json": "A person, as JSON with name, age and pet:",
           "regex": "A product code:",
           "choice": "The review 'I loved it' is",
           "gbnf": "The children in the story were"}
FREE = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def test_50_samples_of_each_kind_all_match_beside_free_requests(smollm2):
    kinds = sorted(CASES)
    free_prompts = [f"Story {i}: once upon a time" for i in range(8)]
    alone = smollm2.generate(free_prompts, FREE)
    outputs = smollm2.generate(
        [PROMPTS[kind] for kind in kinds for _ in range(50)] + free_prompts,
        [SamplingParams(max_tokens=48, temperature=1.0, seed=seed, n=4 if seed < 2 else 1,
                        structured_outputs=CASES[kind][0])
         for kind in kinds for seed in range(50)] + [FREE] * 8)
    for i, kind in enumerate(kinds):
        batch = outputs[50 * i:50 * i + 50]
        assert [len(o.outputs) for o in batch[:3]] == [4, 4, 1]
        assert_all_valid(batch, kind, smollm2.engine)
    assert [o.token_ids for o in outputs[-8:]] == [o.token_ids for o in alone]
    assert smollm2.stats()["blocks_used"] == 0
