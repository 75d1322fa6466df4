"""The peer: Hugging Face transformers' generate() on CPU torch, same weights, greedy.
Only with the optional `bench` extra (torch + transformers); never on the main path."""
from __future__ import annotations

import time


def available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def run(model_dir, requests, log, batch1_requests: int = 6, padded_batch: int = 16) -> dict:
    """Batch 1 on the first few requests, and one left-padded batch of padded_batch
    requests; tokens/s count only each request's own output tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def generate(batch):
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids)
                             for r in batch])
        longest = max(r.output_len for r in batch)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest,
                           min_new_tokens=longest, do_sample=False, pad_token_id=pad)

    start = time.perf_counter()
    for r in requests[:batch1_requests]:
        generate([r])
    batch1 = time.perf_counter() - start
    batch1_tokens = sum(r.output_len for r in requests[:batch1_requests])
    start = time.perf_counter()
    generate(requests[:padded_batch])
    padded = time.perf_counter() - start
    padded_tokens = sum(r.output_len for r in requests[:padded_batch])
    total = sum(r.output_len for r in requests)
    out = {"batch1_requests": batch1_requests, "batch1_tokens_per_s": batch1_tokens / batch1,
           "padded_batch": padded_batch, "padded_tokens_per_s": padded_tokens / padded,
           "workload_seconds_estimated_padded": total / (padded_tokens / padded)}
    log(f"hf transformers: batch 1 {out['batch1_tokens_per_s']:.1f} tokens/s, "
        f"padded batch of {padded_batch} {out['padded_tokens_per_s']:.1f} tokens/s")
    return out
