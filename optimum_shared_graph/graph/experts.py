"""A mixture-of-experts layer computed over ranges of its experts, so that validation can run it in parts smaller
than one layer.

The traced MoE block (optimum-intel's form, `architectures/moe_experts.py`) computes every expert at once over
stacked weights `[experts, out, in]`, then sums the experts' outputs weighted by the router:

    x [E, T, in] -> MatMul(gate), MatMul(up) -> Swish * -> MatMul(down) -> * routing [E, T, 1] -> ReduceSum(axis 0)

Compiled for validation under f32 properties, OpenVINO's CPU plugin holds a `GatherMatmul`'s 16-bit weights in
float32 and repacked (`EXPERTS_COMPILED_PER_BYTE` times the IR's bytes), so one layer of Qwen3-30B-A3B's widths
(1.2 GB of fp16 experts) would need about 5 GB: more than a machine that runs the model may have to spare. `split_experts` rewrites such a block as the sum of the same computation over consecutive expert ranges
(each range's weights a view of the original constant, no copy): the same values, and every range's end a place
where `graph/parts.py` can cut.
"""

from __future__ import annotations

# The CPU plugin's anonymous memory per IR byte of a `GatherMatmul`'s 16-bit expert weights under f32 properties,
# compiled and run (measured at Qwen3-30B-A3B's widths: parts of 95 MB of expert ranges peaked 0.32-0.41 GB above
# the process; it holds them in float32, and repacked).
EXPERTS_COMPILED_PER_BYTE = 4.0
# the rt_info key of the operation that ends an expert range's sum (`split_experts`): after it, only the tokens,
# the router's weights and the sum so far cross, so graph/parts.py may end a part there
RANGE_END = "osg_experts_range_end"

def _key(node) -> int:
    """A node's identity, as `graph/parts.py` keys it (which imports this module: no import back)."""
    return node.get_instance_id()


# operations a block may hold between its input and its sum, each computed per expert along axis 0
_PER_EXPERT = {"MatMul", "Multiply", "Add", "Subtract", "Swish", "Sigmoid", "Gelu", "Relu", "Clamp", "Minimum",
               "Convert", "Reshape", "Slice"}
# a Reshape only where it keeps the shape (`_same_shape`): the form the CPU plugin fuses; a Slice only along another
# axis than the experts' (gpt-oss's interleaved gate and up columns: `_slices_within`)


def _experts_axis(output) -> int | None:
    """The static length of `output`'s first axis for a rank-3 value, else None."""
    shape = output.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3 or shape[0].is_dynamic:
        return None
    return shape[0].get_length()


def _weight(output):
    """The Constant behind a MatMul's weight input (directly or through one Convert), else None."""
    node = output.get_node()
    if node.get_type_name() == "Convert":
        node = node.input(0).get_source_output().get_node()
    return node if node.get_type_name() == "Constant" else None


def _compressed(output):
    """The integer Constant behind a MatMul's compressed weight (NNCF's decompression of it: a Convert, a Subtract
    of its zero points, a Multiply by its scales, a Reshape of grouped values, a Convert to float32), else None."""
    def past(node, kind):
        return node.input(0).get_source_output().get_node() if node.get_type_name() == kind else node

    node = past(past(output.get_node(), "Convert"), "Reshape")
    if node.get_type_name() != "Multiply":
        return None
    node = past(node.input(0).get_source_output().get_node(), "Subtract")
    if node.get_type_name() != "Convert":
        return None
    node = node.input(0).get_source_output().get_node()
    return node if node.get_type_name() == "Constant" and not node.get_output_element_type(0).is_real() else None


def is_compressed(weights) -> bool:
    """Whether a block's expert weights (`blocks()`) are integer values NNCF compressed (no ranges of them:
    `split_experts`), not 16- or 32-bit ones."""
    return any(not w.get_output_element_type(0).is_real() for w in weights)


def _same_shape(reshape) -> bool:
    """A rank-3 Reshape keeping its input's first and last (static) axes: it keeps the middle one too."""
    a, b = reshape.get_input_partial_shape(0), reshape.get_output_partial_shape(0)
    return (a.rank.is_static and b.rank.is_static and a.rank.get_length() == b.rank.get_length() == 3
            and all(a[i].is_static and b[i].is_static and a[i].get_length() == b[i].get_length() for i in (0, 2)))


def _slices_within(slice_op) -> bool:
    """A Slice whose constant axes leave the first (the experts') axis whole."""
    axes = slice_op.input(4).get_source_output().get_node() if slice_op.get_input_size() > 4 else None
    if axes is None or axes.get_type_name() != "Constant":
        return False
    return all(int(a) % 3 != 0 for a in axes.data.reshape(-1))  # rank 3: axis 0 or -3 is the experts'


def _per_expert(node, experts: int) -> bool:
    """Whether `node` is computed per expert along axis 0 (what the block is made of; anything else feeding it,
    the tiled tokens or the router's weights, is sliced per range)."""
    kind = node.get_type_name()
    return (kind in _PER_EXPERT and _experts_axis(node.output(0)) == experts
            and (kind != "Slice" or _slices_within(node))
            and not (kind == "Reshape" and not _same_shape(node))
            and not (kind == "Convert" and _weight(node.output(0)) is not None))


def _is_sum_over_experts(op) -> bool:
    if op.get_type_name() != "ReduceSum" or op.get_keep_dims():
        return False
    axes = op.input(1).get_source_output().get_node()
    return axes.get_type_name() == "Constant" and [int(a) for a in axes.data.reshape(-1)] == [0]


def blocks(model) -> list[tuple[object, list, list]]:
    """Each MoE block of `model`: (its ReduceSum, its operations in order, the Constants of its expert weights)."""
    found, ordered = [], list(model.get_ordered_ops())
    for op in ordered:
        if not _is_sum_over_experts(op):
            continue
        source = op.input(0).get_source_output()
        experts = _experts_axis(source)
        if not experts or experts < 2:
            continue
        inside, weights, stack, ok = {}, [], [source.get_node()], True
        while stack:
            node = stack.pop()
            if _key(node) in inside:
                continue
            if not _per_expert(node, experts):
                ok = False
                break
            inside[_key(node)] = node
            for i, inp in enumerate(node.inputs()):
                src = inp.get_source_output()
                if node.get_type_name() == "MatMul" and i == 1 and (w := _weight(src) or _compressed(src)) is not None:
                    weights.append(w)
                elif node.get_type_name() == "Reshape" and i == 1 or node.get_type_name() == "Slice" and i > 0:
                    continue  # a Reshape's target shape (`_rebuilt` passes the data through), a Slice's bounds
                elif _per_expert(src.get_node(), experts):
                    stack.append(src.get_node())
        if ok and weights and all(len(w.get_output_shape(0)) >= 3 and w.get_output_shape(0)[0] == experts
                                  for w in weights):
            order = [n for n in ordered if _key(n) in inside]
            found.append((op, order, weights))
    return found


def is_expert_weight(constant) -> bool:
    """A Constant of stacked expert weights: rank 3, read (directly or through a Convert) as a MatMul's weight."""
    if len(constant.get_output_shape(0)) != 3:
        return False
    readers = [t.get_node() for t in constant.output(0).get_target_inputs()]
    readers = [t.get_node() for r in readers if r.get_type_name() == "Convert"
               for t in r.output(0).get_target_inputs()] + [r for r in readers if r.get_type_name() != "Convert"]
    return any(r.get_type_name() == "MatMul" and r.input(1).get_source_output().get_node().get_type_name()
               in ("Convert", "Constant") for r in readers)


def split_experts(model, max_range_bytes: int) -> int:
    """Rewrite each MoE block of `model` (in place) whose expert weights exceed `max_range_bytes` as the sum of
    the block over consecutive expert ranges of at most that many weight bytes. Returns the blocks rewritten."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops

    rewritten = 0
    for total, order, weights in blocks(model):
        if is_compressed(weights):  # its integer values are not cut: the part holds the whole block (`whole_spans`)
            continue
        experts = weights[0].get_output_shape(0)[0]
        per_expert = sum(int(w.get_byte_size()) for w in weights) // experts
        size = max(1, min(experts, max_range_bytes // max(per_expert, 1)))
        if size >= experts:
            continue
        result = None
        for lo in range(0, experts, size):
            hi = min(experts, lo + size)
            made: dict[tuple[int, int], object] = {}

            def value(output, lo=lo, hi=hi, made=made):
                node = output.get_node()
                key = (_key(node), output.get_index())
                if key in made:  # a block's operation rebuilt for this range (they come in order), or a value made
                    return made[key]
                w = _weight(output)
                if w is not None and _experts_axis(w.output(0)) == experts:
                    shape = list(w.get_output_shape(0))
                    rows = ov.Tensor(w.get_tensor_view(), ov.Coordinate([lo, 0, 0]), ov.Coordinate([hi, *shape[1:]]))
                    view = ov.op.Constant(rows)  # the rows of the original's memory, not a copy
                    made[key] = _decompressed(view, node, ops)
                elif _experts_axis(output) == experts:
                    made[key] = ops.slice(output, np.array([lo]), np.array([hi]), np.array([1]), np.array([0])).output(0)
                else:
                    made[key] = output  # broadcast along the experts' axis (a scalar, a [1, ...] value)
                return made[key]

            for node in order:
                args = [value(i.get_source_output()) for i in node.inputs()]
                made[(_key(node), 0)] = _rebuilt(node, args, ops)
            part = ops.reduce_sum(made[(_key(order[-1]), 0)], np.array([0]), keep_dims=False).output(0)
            result = part if result is None else ops.add(result, part).output(0)
            result.get_node().get_rt_info()[RANGE_END] = True  # where a part may end (graph/parts.py)
        total.output(0).replace(result)
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def whole_spans(model, position) -> list[tuple[int, int]]:
    """For each MoE block whose expert weights are compressed (`is_compressed`), the first and last positions
    (`position(node)`, None for an input) of the block and of everything its inputs are computed from since the
    layer's residual sum (the norm, the router, the tiled tokens): a part must hold all of it. The CPU plugin fuses
    the block into `GatherMatmul`s over compressed weights only when it sees the whole of that; cut from it, the
    part computes every expert densely over weights decompressed to float32 (measured at Qwen3-30B-A3B's widths,
    int4: +2.3 GB compiling one layer's 302 MB of experts, against +0.35 GB for a part holding the whole)."""
    spans = []
    for total, order, weights in blocks(model):
        if not is_compressed(weights):
            continue
        inside = {_key(n) for n in order}
        at = [position(n) for n in (*order, total)]  # the sum over the experts too
        stack = [i.get_source_output().get_node() for n in order for i in n.inputs()]
        seen = set(inside)
        while stack:
            node = stack.pop()
            if _key(node) in seen or node.get_type_name() in ("Constant", "Parameter"):
                continue
            seen.add(_key(node))
            at.append(position(node))
            sources = [i.get_source_output().get_node() for i in node.inputs()]
            if node.get_type_name() == "Add" and all(s.get_type_name() != "Constant" for s in sources):
                continue  # the residual sum the layer's second half starts from
            stack.extend(sources)
        at = [a for a in at if a is not None]
        if at:
            spans.append((min(at), max(at)))
    return spans


def split_rows(model, max_range_bytes: int) -> int:
    """Rewrite each MatMul of `model` (in place) whose 2D weight (`[out, in]`, read through a Convert or directly,
    `transpose_b`) exceeds `max_range_bytes` as the concatenation of the MatMul over ranges of the weight's rows
    (views of the constant): the same values, one operation's weights no longer what a part cannot go below
    (`lm_head`, 622 MB at Qwen3-30B-A3B's widths, would hold 1.3 GB compiled). Returns the MatMuls rewritten."""
    import openvino as ov
    from openvino import opset13 as ops

    rewritten = 0
    for op in list(model.get_ordered_ops()):
        if op.get_type_name() != "MatMul" or not op.get_attributes()["transpose_b"]:
            continue
        source = op.input(1).get_source_output()
        weight = _weight(source)
        if weight is None or len(weight.get_output_shape(0)) != 2 or weight.get_byte_size() <= max_range_bytes:
            continue
        rows, cols = weight.get_output_shape(0)
        size = max(1, max_range_bytes // max(1, int(weight.get_byte_size()) // rows))
        pieces = []
        for lo in range(0, rows, size):
            hi = min(rows, lo + size)
            view = ov.op.Constant(ov.Tensor(weight.get_tensor_view(), ov.Coordinate([lo, 0]), ov.Coordinate([hi, cols])))
            w = _decompressed(view, source.get_node(), ops)
            pieces.append(ops.matmul(op.input(0).get_source_output(), w, op.get_attributes()["transpose_a"], True).output(0))
        op.output(0).replace(ops.concat(pieces, -1).output(0))
        rewritten += 1
    if rewritten:
        model.validate_nodes_and_infer_types()
    return rewritten


def _decompressed(view, original, ops):
    """`view` read as `original` (a Constant, or the Convert of one) is: through a Convert that carries the
    original's `decompression` mark, which keeps the CPU plugin from folding the Convert into
    new float32 weights at compile time (without it a range held twice the memory)."""
    if original.get_type_name() == "Constant":
        return view.output(0)
    convert = ops.convert(view, original.get_output_element_type(0))
    for key in original.get_rt_info().keys():
        if key.startswith("decompression"):  # an attribute without a value: its presence is the mark
            convert.get_rt_info()[key] = ""
    return convert.output(0)


def _rebuilt(node, args, ops):
    """`node`'s operation over new inputs (the types `_PER_EXPERT` admits): its output."""
    kind = node.get_type_name()
    if kind == "Reshape":  # one that keeps the shape (`_same_shape`)
        return args[0]
    return _operation(kind, node, args, ops).output(0)


def _operation(kind, node, args, ops):
    attrs = node.get_attributes()
    if kind == "MatMul":
        return ops.matmul(args[0], args[1], attrs["transpose_a"], attrs["transpose_b"])
    if kind in ("Multiply", "Add", "Subtract", "Minimum"):
        return getattr(ops, kind.lower())(*args)
    if kind == "Swish":
        return ops.swish(*args)
    if kind == "Sigmoid":
        return ops.sigmoid(args[0])
    if kind == "Relu":
        return ops.relu(args[0])
    if kind == "Gelu":
        return ops.gelu(args[0], attrs["approximation_mode"])
    if kind == "Clamp":
        return ops.clamp(args[0], attrs["min"], attrs["max"])
    if kind == "Slice":  # along another axis than the experts' (`_slices_within`): its bounds as they were
        return ops.slice(*args)
    if kind == "Convert":
        return ops.convert(args[0], node.get_output_element_type(0))
    raise AssertionError(f"no rebuild for {kind}")
