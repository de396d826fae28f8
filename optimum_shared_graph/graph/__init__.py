"""Transforms of OpenVINO graphs: the logits slice, past lengths from key states, a tied
head's extra reads in forms GenAI's NPU pipeline partitions, static graphs' shapes and
state, consecutive parts, and fp16 weights that keep the graph's vectors at float32 precision."""
