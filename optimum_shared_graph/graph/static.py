"""Static graphs: their fixed shapes, and the transform that hides their KV buffers as state."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StaticShapes:
    """The fixed shapes of a static graph (what the manifest's `static` records)."""

    batch_size: int
    query_len: int
    cache_len: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def shapes_of(ov_model) -> StaticShapes:
    """Read batch, query length and capacity back from a static graph's inputs."""
    ids = ov_model.input("input_ids").get_partial_shape()
    mask = ov_model.input("attention_mask").get_partial_shape()
    return StaticShapes(batch_size=ids[0].get_length(), query_len=ids[1].get_length(), cache_len=mask[1].get_length())



def make_static_stateful(ov_model) -> None:
    """Hide a stateless static graph's KV buffers as internal state, in place, with optimum-intel's
    `fuse_cache_reorder` (adds `beam_idx`) and `make_stateful`: what `export_static_graph(stateful=True)`
    does, also applied after quantizing the stateless graph."""
    from optimum.exporters.openvino.stateful import fuse_cache_reorder, make_stateful

    kv_in = [p.get_any_name() for p in ov_model.inputs if p.get_any_name().startswith("past_key_values")]
    kv_out = [p.get_any_name() for p in ov_model.outputs if p.get_any_name().startswith("present")]
    # cache_position has no batch axis: keep it out of the list whose axis 0 make_stateful sets to B.
    not_kv = [p for p in ov_model.inputs if p.get_any_name() not in kv_in and p.get_any_name() != "cache_position"]
    batch = ov_model.input("input_ids").get_partial_shape()[0].get_length()
    fuse_cache_reorder(ov_model, not_kv, kv_in, 0)
    make_stateful(ov_model, not_kv, kv_in, kv_out, 0, batch)
