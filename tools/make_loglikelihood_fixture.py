"""Make the loglikelihood fixture: what HF transformers scores for (context,
continuation) pairs on stories260K, the float folder in tests/models, as an eval
harness scores multiple choice (tests/test_loglikelihood.py holds the server to it).

Needs torch and transformers (not test dependencies: the fixture is committed).
Made with torch 2.13.0 (CPU) and transformers 5.25.0:

    python -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.13.0 transformers tokenizers
    /tmp/hf/bin/python tools/make_loglikelihood_fixture.py

tests/fixtures/loglikelihood_stories260K.json: per item the ids of the context (BOS
first) and of the continuation, the sum of the continuation's log-probabilities given
what precedes each token, and whether every continuation token is the most likely one
(an eval harness's is_greedy). Each context comes with four continuations, one of them
the greedy one, as a four-way multiple-choice item.
"""
from __future__ import annotations

import json
import os

import torch
import transformers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "models", "stories260K")
OUT = os.path.join(ROOT, "tests", "fixtures", "loglikelihood_stories260K.json")
BOS = 1
ITEMS = [  # (context, continuations): the first continuation is made greedy below
    ("Once upon a time, there was a little girl named", [" Lily.", " Tom.", " Sue.", " a dog."]),
    ("Lily and her mom went to the", [" park.", " moon.", " store to buy milk.", " sea"]),
    ("The cat was very", [" happy.", " big and", " sad", " hungry. It wanted food."]),
    ("One day, Tim found a", [" ball", " big red box", " dog.", " shiny stone in the garden."]),
    ("She said, \"I", [" want to play!\"", " am sorry.\"", " like you.\"", " can fly"]),
    ("They played together and had", [" fun.", " a picnic", " lunch", " a big cake."]),
]


def main() -> None:
    tokenizer = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    model = transformers.LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def scored(context: list[int], continuation: list[int]) -> tuple[float, bool]:
        ids = torch.tensor([context + continuation])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].double(), -1)  # (T, vocab)
        rows = logprobs[len(context) - 1:-1]  # the rows that predict the continuation
        picked = rows[torch.arange(len(continuation)), torch.tensor(continuation)]
        greedy = bool((rows.argmax(-1) == torch.tensor(continuation)).all())
        return float(picked.sum()), greedy

    items = []
    for context_text, continuations in ITEMS:
        context = [BOS] + encode(context_text)
        with torch.no_grad():  # the greedy continuation of the first choice's length
            ids = list(context)
            for _ in range(len(encode(continuations[0]))):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        choices = [ids[len(context):]] + [encode(c) for c in continuations[1:]]
        for continuation in choices:
            logprob, greedy = scored(context, continuation)
            items.append({"context": context, "continuation": continuation,
                          "logprob": logprob, "is_greedy": greedy})
    with open(OUT, "w") as f:  # an item a line
        made_with = json.dumps(f"torch {torch.__version__}, transformers {transformers.__version__}")
        lines = ",\n  ".join(json.dumps(item) for item in items)
        f.write(f'{{"made_with": {made_with},\n "items": [\n  {lines}\n ]}}\n')
    print(f"{OUT}: {len(items)} items, {sum(i['is_greedy'] for i in items)} greedy")


if __name__ == "__main__":
    main()
