"""What transformers' apply_chat_template renders for each chat template under
tests/fixtures/chat_templates/ (SmolLM2's ChatML, as its GGUF carries it; Gemma 3's
and Llama 3's, as those models ship them) on a set of conversations: written to
tests/fixtures/chat_templates/expected.json for tests/test_chat_template.py.

    /tmp/hf/bin/python tools/make_chat_fixtures.py   (transformers 5.24.0)
"""
from __future__ import annotations

import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                      "chat_templates")
SPECIAL = {"smollm2": ("<|im_start|>", "<|im_end|>"), "gemma3": ("<bos>", "<eos>"),
           "llama3": ("<|begin_of_text|>", "<|eot_id|>")}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You answer in French."},
     {"role": "user", "content": "  What is 2 + 2?  \n"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another, with émoji 🎨 and\ttabs."}],
    [{"role": "user", "content": [{"type": "text", "text": "Parts, "}, {"type": "text", "text": "joined."}]}],
]


def main() -> None:
    expected = []
    for name, (bos, eos) in SPECIAL.items():
        with open(os.path.join(FOLDER, f"{name}.jinja"), encoding="utf-8") as f:
            template = f.read()
        for messages in CONVERSATIONS:
            if name != "gemma3" and isinstance(messages[0]["content"], list):
                continue  # (these two templates concatenate content as text)
            for generation in (True, False):
                rendered, _ = render_jinja_template([messages], chat_template=template,
                                                    add_generation_prompt=generation,
                                                    bos_token=bos, eos_token=eos)
                expected.append({"template": name, "messages": messages, "bos_token": bos,
                                 "eos_token": eos, "add_generation_prompt": generation,
                                 "rendered": rendered[0]})
    with open(os.path.join(FOLDER, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    print(f"{len(expected)} renderings")


if __name__ == "__main__":
    main()
