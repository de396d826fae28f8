"""Transforms of OpenVINO graphs: the logits slice, and static graphs' shapes and state."""
