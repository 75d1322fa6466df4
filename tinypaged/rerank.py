"""Reranking with a decoder (Qwen3-Reranker's way): a query and a document written into
a prompt that asks whether the document answers the query, and the score the model's
"yes" against its "no" at the prompt's last token: softmax over those two logits,
"yes"'s share, in [0, 1]. The prompt is Qwen3-Reranker's, from its model card."""
from __future__ import annotations

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PROMPT_HEAD = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
          "<|im_end|>\n<|im_start|>user\n")
PROMPT_TAIL = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def rerank_prompt(query: str, document: str, instruction: str | None = None) -> str:
    return (f"{PROMPT_HEAD}<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}{PROMPT_TAIL}")


def answer_ids(tokenizer) -> tuple[int, int]:
    """The ids of "yes" and "no", each one token of the model's vocabulary; ValueError
    naming the word that is not (a model that cannot answer so is no such reranker)."""
    ids = []
    for word in ("yes", "no"):
        pieces = tokenizer.encode(word, add_special_tokens=False)
        if len(pieces) != 1:
            raise ValueError(f"this model cannot rerank: {word!r} is not one token of its "
                             f"vocabulary ({pieces}); a reranker answers \"yes\" or \"no\"")
        ids.append(pieces[0])
    return ids[0], ids[1]
