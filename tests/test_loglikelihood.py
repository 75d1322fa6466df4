"""Multiple choice scored as eval harnesses score it through an OpenAI completions API
(lm-eval's local-completions: the context and a continuation as one prompt, echoed
with logprobs and one token generated, the continuation's entries summed), held item
by item to HF transformers' loglikelihoods on the float folder
(tools/make_loglikelihood_fixture.py), whatever the generated token is, EOS included."""
import json
import os

import pytest

from serving import client_for, running_server

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "loglikelihood_stories260K.json")
EOS = 2  # stories260K's
TOLERANCE = 1e-3  # nats, a continuation's sum


@pytest.fixture(scope="module")
def client(stories_dir):
    for server in running_server(stories_dir, served_model_name="stories"):
        yield client_for(server)


def items() -> list[dict]:
    with open(FIXTURE) as f:
        return json.load(f)["items"]


def score(client, context: list[int], continuation: list[int], **extra):
    """(sum of the continuation's logprobs, whether each was the most likely token, the
    response), as a harness reads them: entries [len(context):-1] of the echo, the last
    being the generated token's."""
    response = client.completions.create(model="stories", prompt=context + continuation, echo=True,
                                         max_tokens=1, temperature=0, logprobs=1, **extra)
    logprobs, n = response.choices[0].logprobs, len(context)
    greedy = all(max(top, key=top.get) == token
                 for top, token in zip(logprobs.top_logprobs[n:-1], logprobs.tokens[n:-1]))
    return sum(logprobs.token_logprobs[n:-1]), greedy, response


@pytest.mark.parametrize("ending", ["sampled", "eos"])
def test_each_choice_scores_as_transformers_does(client, ending):
    extra = {"extra_body": {"logit_bias": {str(EOS): 100}}} if ending == "eos" else {}
    for item in items():
        logprob, greedy, response = score(client, item["context"], item["continuation"], **extra)
        where = f"context {item['context']}, continuation {item['continuation']}"
        assert abs(logprob - item["logprob"]) < TOLERANCE, f"{where}: {logprob} vs {item['logprob']}"
        assert greedy == item["is_greedy"], where
        # the generated token is in the echo and counted, EOS as much as any other
        generated = response.choices[0].logprobs.token_logprobs[len(item["context"]) + len(item["continuation"]):]
        assert len(generated) == 1 and response.usage.completion_tokens == 1, where
        if ending == "eos":  # its entry (the model's logprob, before the bias) shows it; the text not
            choice = response.choices[0]
            assert choice.finish_reason == "stop" and choice.logprobs.tokens[-1] == "</s>", where
            assert "</s>" not in choice.text, where


def test_multiple_choice_picks_what_transformers_picks(client):
    wanted, ours = [], []
    all_items = items()
    for first in range(0, len(all_items), 4):  # four choices a question
        choices = all_items[first:first + 4]
        wanted.append(max(range(4), key=lambda i: choices[i]["logprob"]))
        ours.append(max(range(4), key=lambda i: score(client, choices[i]["context"],
                                                      choices[i]["continuation"])[0]))
    assert ours == wanted and len(wanted) == 6
