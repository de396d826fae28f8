"""The task names this package registers and the optimum-intel tasks it builds on."""

TASK = "text-generation-shared"  # ours: one decoder graph for prefill and decode
BASE_TASK = "text-generation-with-past"  # optimum-intel's stateful causal-LM export, converted for us
VLM_TASK = "image-text-to-text"  # optimum-intel's vision-language export, a fallback's partitioning
VLM_SHARED_TASK = "image-text-to-text-shared"  # ours: optimum-intel's VLM layout, its language model the shared graph
