"""One step's batch as the layers below the engine see it: AttentionMetadata and the
block tables' slot arithmetic. A leaf: it imports nothing of tinypaged's; the engine
builds these, the models and the kernels read them."""
