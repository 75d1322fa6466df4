"""Every supported architecture, by the name config.json gives it."""
from .family import LLAMA, MISTRAL, QWEN2
from .gemma import GEMMA
from .gemma2 import GEMMA2
from .gemma3 import GEMMA3
from .granite import GRANITE
from .olmo2 import OLMO2
from .phi3 import PHI3
from .qwen3 import QWEN3
from .smollm3 import SMOLLM3

FAMILIES = {f.name: f for f in (LLAMA, MISTRAL, QWEN2, QWEN3, SMOLLM3, GRANITE, OLMO2, PHI3,
                                      GEMMA, GEMMA2, GEMMA3)}
