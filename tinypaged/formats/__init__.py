"""Model files as they are stored: GGUF and safetensors readers, the GGML quant kinds
(one QuantKind table), and PackedWeight, a quantized matrix kept packed. Imports
nothing of tinypaged's but leaves."""
