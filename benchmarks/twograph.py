"""Build the two-graph layout: a prefill graph and a decode graph, each with its own copy of the weights.

This is the layout transformers' `export_for_generation` writes (and ONNX-style generation exports):
`prefill/openvino_model.xml` takes the prompt and returns logits and the KV cache; `decode/openvino_model.xml`
takes one token and the KV cache and returns logits and the grown cache. Both are stateless (the cache
is exchanged through inputs and outputs). Built with the installed tools: two separate optimum-intel
conversions of the same model (stateless, same weight format), then
- prefill: the `past_key_values.*` inputs are replaced by empty tensors, so the graph has no past;
- decode: `input_ids` and `position_ids` get a query axis of exactly 1.
The prefill graph keeps optimum-intel's logits for every prompt position.

Usage: python benchmarks/twograph.py MODEL_DIR OUT_DIR [--weight-format fp16]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def _convert(model_dir: str, out: Path, weight_format: str) -> None:
    from optimum.exporters.openvino.__main__ import main_export
    from optimum.intel.openvino.configuration import OVConfig

    main_export(
        model_name_or_path=model_dir, output=out, task="text-generation-with-past", stateful=False,
        ov_config=OVConfig(dtype=weight_format), convert_tokenizer=False, library_name="transformers",
    )


def make_prefill(model) -> None:
    """Drop the past inputs: each becomes an empty `[batch, kv_heads, 0, head_dim]` tensor."""
    import numpy as np
    from openvino import opset13 as ops

    ids = model.input("input_ids").get_node()
    batch = ops.gather(ops.shape_of(ids, "i64"), ops.constant(np.array([0], dtype=np.int64)),
                       ops.constant(np.array(0, dtype=np.int64)))
    for port in list(model.inputs):
        if not port.get_any_name().startswith("past_key_values"):
            continue
        param = port.get_node()
        pshape = param.get_partial_shape()
        rest = [pshape[1].get_length(), 0, pshape[3].get_length()]
        shape = ops.concat([batch, ops.constant(np.array(rest, dtype=np.int64))], 0)
        zero = ops.constant(np.zeros((), dtype=param.get_element_type().to_dtype()))
        empty = ops.broadcast(zero, shape)
        for target in list(param.output(0).get_target_inputs()):
            target.replace_source_output(empty.output(0))
        model.remove_parameter(param)
    model.validate_nodes_and_infer_types()


def make_decode(model) -> None:
    """One query token per call."""
    shapes = {}
    for port in model.inputs:
        name = port.get_any_name()
        if name in ("input_ids", "position_ids"):
            shapes[port] = [-1, 1]
    model.reshape(shapes)


def build(model_dir: str, out_dir: str, weight_format: str = "fp16") -> Path:
    import openvino as ov

    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    core = ov.Core()
    for stage, transform in (("prefill", make_prefill), ("decode", make_decode)):
        raw = out / f".raw-{stage}"
        _convert(model_dir, raw, weight_format)
        model = core.read_model(raw / "openvino_model.xml")
        transform(model)
        (out / stage).mkdir(parents=True)
        ov.save_model(model, out / stage / "openvino_model.xml", compress_to_fp16=False)
        del model
        for item in raw.iterdir():
            if not item.name.startswith("openvino_model"):
                shutil.copy(item, out / stage / item.name) if item.is_file() else None
        shutil.rmtree(raw)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--weight-format", default="fp16", choices=("fp16", "fp32"))
    args = parser.parse_args(argv)
    build(args.model_dir, args.out_dir, args.weight_format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
