"""One step's batch as the layers below the engine see it: AttentionMetadata, the
block tables' slot arithmetic, and what sampling needs of each row of the logits
(step_logits.py). A leaf: it imports nothing of tinypaged's; the engine builds
these, the models and the kernels read them."""
