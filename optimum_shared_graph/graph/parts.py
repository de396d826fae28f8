"""Consecutive parts of a stateful decoder graph, for running it with one part's weights compiled at a time.

OpenVINO's CPU plugin repacks the weights of a compiled graph into its own memory (anonymous memory about the
size of the `.bin`). A graph cut into consecutive parts can be run part by part: part k is compiled, fed every
call in order (with its own state: the KV cache of the layers it holds), its outputs that later parts read are
kept, and it is freed before part k+1 is compiled. The calls' results are the whole graph's, and the memory is
one part's weights.

    plan = plan_parts(model, max_part_bytes)
    for part in build_parts(model.clone(), plan):   # one `openvino.Model` at a time
        ...

Where the graph is cut: at positions of the graph's topological order between two operations, chosen so that

* each part's weights (the constants its operations read) stay under `max_part_bytes` where one layer allows;
* no state is split: a `ReadValue` and the operation that computes its `Assign`'s value are in one part (what only
  an `Assign` reads placed just after what it is computed from, so the span stays within its layer);
* only where the fewest values cross (decoder-layer boundaries, where the residual stream is all that crosses:
  what every layer reads from the graph's inputs, such as the mask and the rotary tables, is computed again in
  each part; the fewest in the whole graph, or within about half a layer either side where a value read layers
  after it is computed crosses every boundary between), as late as keeps the part under the bound.

A value computed in an earlier part and read in a later one becomes an output of the first and a `Parameter`
of the second, named `cut.<index>`; the graph's own inputs are fed to every part that reads them. Constants,
and what is computed from constants and the graph's inputs other than the tokens, belong to every part that
reads them, so a tied embedding and `lm_head` count in both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CUT_PREFIX = "cut."


_LAYER = re.compile(r"^[^.]*\.(\d+)\.")  # a state's layer: past_key_values.<layer>.keypresent.<layer>.key


def _key(node) -> int:
    """A node's identity: Python wrappers of one node differ from call to call, its instance id does not."""
    return node.get_instance_id()


@dataclass
class PartPlan:
    """Where a graph is cut, and what each part costs."""

    cuts: list[int]  # positions in the planned order where a new part starts (excluding 0)
    part_bytes: list[int]  # the weight bytes each part reads
    crossing: list[int]  # values crossing each cut
    total_bytes: int
    _order: list = field(default_factory=list, repr=False)
    # MoE blocks computed over expert ranges, and MatMuls over ranges of their weight's rows, of at most these
    # weight bytes (`graph/experts.py`) before the cut
    experts_range_bytes: int | None = None
    rows_range_bytes: int | None = None

    @property
    def count(self) -> int:
        return len(self.cuts) + 1

    def to_dict(self) -> dict:
        return {"parts": self.count, "largest_part_bytes": max(self.part_bytes), "weight_bytes": self.total_bytes,
                **{k: v for k, v in (("experts_range_bytes", self.experts_range_bytes),
                                     ("rows_range_bytes", self.rows_range_bytes)) if v}}


def _constant_like(ops) -> set[int]:
    """Keys of the operations computed from constants only (a Constant and its decompression chain)."""
    const: set[int] = set()
    for op in ops:  # topological: inputs come first
        kind = op.get_type_name()
        if kind == "Constant":
            const.add(_key(op))
        elif kind not in ("Parameter", "ReadValue", "Assign", "Result") and op.get_input_size() > 0 and all(
                _key(inp.get_source_output().get_node()) in const for inp in op.inputs()):
            const.add(_key(op))
    return const


# Graph inputs that carry the tokens: what is computed from their values is the model's own computation (the
# embedding lookup and every layer after it); only their shapes are free.
_CONTENT_INPUTS = ("input_ids", "inputs_embeds")


def _input_derived(ops, const: set[int]) -> set[int]:
    """Keys of the operations computed from the graph's inputs other than the tokens (the attention mask, the
    positions, the beam indices), the tokens' shapes, and constants: the causal mask, the rotary tables,
    `ShapeOf(input_ids)` and a state's initial value built from it. Every part that reads one computes it again
    from the graph's inputs instead of receiving it from an earlier part: it costs a few operations, keeps a cut
    at a layer boundary down to a few values, and OpenVINO's CPU plugin sizes a state from such computations (a
    state's initial value fed as a `Parameter` fails there)."""
    derived: set[int] = set()
    for op in ops:  # topological: inputs come first
        if op.get_type_name() in ("Parameter", "ReadValue", "Assign", "Result", "Constant") or _key(op) in const:
            continue
        sources = [inp.get_source_output().get_node() for inp in op.inputs()]

        def free(source) -> bool:
            if source.get_type_name() == "Parameter":
                return op.get_type_name() == "ShapeOf" or not (source.get_output_tensor(0).get_names() & set(_CONTENT_INPUTS))
            return _key(source) in const or _key(source) in derived

        if sources and all(free(s) for s in sources):
            derived.add(_key(op))
    return derived


def _late_order(ops: list, free: set[int]) -> list:
    """`ops` (topological) with each state read moved to just before its first use: a `ReadValue`, and what is
    computed from states and free values only (the beam reorder `Gather`), sits where the layer that reads it
    begins its attention, so a layer boundary is not inside a state's span."""
    pos = {_key(op): i for i, op in enumerate(ops)}
    floating: set[int] = set()
    for op in ops:
        sources = [inp.get_source_output().get_node() for inp in op.inputs()]
        if op.get_type_name() == "ReadValue" or (sources and any(_key(s) in floating for s in sources) and all(
                _key(s) in floating or _key(s) in free or s.get_type_name() == "Parameter" for s in sources)):
            floating.add(_key(op))
    when, for_state = {}, set()
    for op in reversed(ops):
        if _key(op) not in floating:
            when[_key(op)] = pos[_key(op)]
            continue
        users = [when.get(_key(t.get_node()), pos.get(_key(t.get_node()))) for out in op.outputs() for t in out.get_target_inputs()]
        users = [u for u in users if u is not None]
        when[_key(op)] = min(users) if users else pos[_key(op)]
    # what only a state's Assign reads (Qwen3.5's gated-delta-net state: a Reshape of the recurrent loop's output)
    # comes after the whole graph in OpenVINO's order; it sits just after what it is computed from, so the state's
    # span ends in the layer that computes it, not past every later layer
    for op in reversed(ops):
        users = [t.get_node() for out in op.outputs() for t in out.get_target_inputs()]
        if users and all(u.get_type_name() == "Assign" or _key(u) in for_state for u in users):
            for_state.add(_key(op))
    for op in ops:  # topological: its sources' places are known
        if _key(op) in for_state:
            sources = [when[_key(s)] for s in (inp.get_source_output().get_node() for inp in op.inputs()) if _key(s) in when]
            when[_key(op)] = max(sources, default=when[_key(op)])
    return sorted(ops, key=lambda op: (when[_key(op)], _key(op) not in floating, pos[_key(op)]))


class _Graph:
    """The graph's operations in topological order, with constants and states set apart."""

    def __init__(self, model):
        self.model = model
        ops = list(model.get_ordered_ops())
        self.const = _constant_like(ops)
        self.derived = _input_derived(ops, self.const)
        self.free = self.const | self.derived  # computed in every part that reads them
        self.ops = _late_order([op for op in ops if _key(op) not in self.free
                                and op.get_type_name() not in ("Parameter", "Result", "Assign")], self.free)
        self.pos = {_key(op): i for i, op in enumerate(self.ops)}
        self.by_id = {_key(op): op for op in ops}
        self.assigns = [op for op in ops if op.get_type_name() == "Assign"]

    def const_inputs(self, op) -> list:
        """The Constant operations behind `op`'s constant-like and input-derived inputs (its weights)."""
        found, stack, seen = [], [inp.get_source_output().get_node() for inp in op.inputs()], set()
        while stack:
            node = stack.pop()
            if _key(node) in seen or _key(node) not in self.free:
                continue
            seen.add(_key(node))
            if node.get_type_name() == "Constant":
                found.append(node)
            stack.extend(inp.get_source_output().get_node() for inp in node.inputs())
        return found

    def producer_pos(self, output) -> int | None:
        """Position of the operation producing `output`; None for constants and the graph's Parameters."""
        return self.pos.get(_key(output.get_node()))

    def state_spans(self) -> list[tuple[int, int]]:
        """For each state, the positions of its ReadValue and of the operation computing its Assign's value."""
        reads = {}
        for op in self.ops:
            if op.get_type_name() == "ReadValue":
                reads[op.get_variable_id()] = self.pos[_key(op)]
        spans: dict[str, tuple[int, int]] = {}
        for assign in self.assigns:
            value = self.producer_pos(assign.input(0).get_source_output())
            read = reads.get(assign.get_variable_id())
            if value is not None and read is not None:
                # one span for a layer's states (its key and its value): Gemma 4's first layers' keys and values
                # are read again by the layers sharing them, and a cut between a layer's key and its value left a
                # part whose input the CPU plugin sized from the empty initial state (ParameterMismatch)
                layer = _LAYER.search(assign.get_variable_id())
                name = layer.group(0) if layer else assign.get_variable_id()
                lo, hi = spans.get(name, (min(read, value), max(read, value)))
                spans[name] = (min(lo, read, value), max(hi, read, value))
        return list(spans.values())


def plan_parts(model, max_part_bytes: int, cost=None, experts_range_bytes: int | None = None,
               rows_range_bytes: int | None = None) -> PartPlan:
    """Cut `model` (an `openvino.Model`) into parts whose weights stay under `max_part_bytes` where possible.

    A part is never smaller than what cannot be cut (one state's span, one operation's weights), so a part can
    exceed the bound: `PartPlan.part_bytes` says what each part really reads. `cost(constant)`: the bytes a weight
    counts for against the bound (its own by default). `experts_range_bytes` / `rows_range_bytes`: first compute
    each MoE block over expert ranges, and each MatMul over ranges of its weight's rows, of at most that many bytes
    (`graph/experts.py`, on `model` in place), so parts can end inside them.
    """
    _split(model, experts_range_bytes, rows_range_bytes)
    g = _Graph(model)
    n = len(g.ops)
    # weight bytes at each operation reading them: a weight read in two places (a tied embedding and lm_head)
    # counts in both, as it does in the parts that hold them
    weight_at, sizes = [0] * (n + 1), {}
    for i, op in enumerate(g.ops):
        for c in g.const_inputs(op):
            sizes[_key(c)] = int(c.get_byte_size())
            weight_at[i] += int(cost(c)) if cost else sizes[_key(c)]
    total = sum(sizes.values())
    # values crossing each position p (a cut before operation p): produced before p, read at or after p
    delta = [0] * (n + 2)
    for i, op in enumerate(g.ops):
        for out in op.outputs():
            last = max((g.pos.get(_key(t.get_node()), -1) for t in out.get_target_inputs()), default=-1)
            if last > i:
                delta[i + 1] += 1
                delta[last + 1] -= 1
    crossing, running = [0] * (n + 1), 0
    for p in range(n + 1):
        running += delta[p]
        crossing[p] = running
    blocked = [False] * (n + 1)
    spans = g.state_spans()
    from .experts import whole_spans

    for start, stop in spans + whole_spans(model, lambda node: g.pos.get(_key(node))):
        for p in range(start + 1, stop + 1):
            blocked[p] = True
    # cut only where the fewest values cross (decoder-layer boundaries: the residual stream), as late as keeps
    # the part under the bound, or at the first such position past it when one layer alone exceeds the bound
    prefix = [0]
    for w in weight_at[:n]:
        prefix.append(prefix[-1] + w)
    inner = [p for p in range(1, n) if not blocked[p] and 0 < prefix[p] < prefix[n]]
    # what crosses a layer boundary in the middle of the graph (the residual stream and the values every layer
    # reads that depend on the state, such as the past length): the first and last operations cross fewer
    middle = [crossing[p] for p in inner if n // 4 <= p <= 3 * n // 4]
    fewest = min(middle or [crossing[p] for p in inner] or [0])
    # or the fewest within about half a decoder layer's operations either side (`reach`, from the number of states):
    # a value computed in one layer and read in a much later one crosses every boundary between (the MoE layers'
    # shared reshape targets, a mask computed from the state at Qwen3.5's first full-attention layer and read at the
    # next), so those boundaries cross more than the graph's fewest; counted against the whole graph, they were no
    # place to cut, and one part ran from the first such value to its last reader (262 MB of a 455 MB graph)
    reach = max(1, n // max(1, 2 * len(spans)))
    inner_set = set(inner)
    around = [crossing[p] if p in inner_set else n for p in range(n + 1)]
    good = [p for p in inner if crossing[p] <= fewest or crossing[p] <= min(around[max(0, p - reach):p + reach + 1])]
    # right after each expert range's sum (graph/experts.py): a layer's values other than its ranges' (the shapes
    # its later layers read too) cross there as well, so these are no local minimum of the crossing values
    from .experts import RANGE_END

    range_ends = {i + 1 for i, op in enumerate(g.ops) if RANGE_END in op.get_rt_info()} & set(inner)
    cuts, start = [], 0
    while prefix[n] - prefix[start] > max_part_bytes:
        later = [p for p in good if p > start and prefix[p] > prefix[start]]
        fits = [p for p in later if prefix[p] - prefix[start] <= max_part_bytes]
        if not fits:  # one layer (or the head) alone exceeds the bound: cut inside it where it can be (the end of
            # an expert range or of a range of lm_head's rows, graph/experts.py)
            fits = _inside_cuts(inner, crossing, prefix, start, min(later, default=n), max_part_bytes, range_ends)
        if not fits and not later:
            break
        start = max(fits) if fits else min(later)
        cuts.append(start)
    plan = PartPlan(cuts=cuts, part_bytes=[], crossing=[crossing[c] for c in cuts], total_bytes=total, _order=g.ops,
                    experts_range_bytes=experts_range_bytes, rows_range_bytes=rows_range_bytes)
    plan.part_bytes = [_part_bytes(g, lo, hi) for lo, hi in _bounds(cuts, n)]
    return plan


def _split(model, experts_range_bytes: int | None, rows_range_bytes: int | None) -> None:
    from .experts import split_experts, split_rows

    if experts_range_bytes:
        split_experts(model, experts_range_bytes)
    if rows_range_bytes:
        split_rows(model, rows_range_bytes)


def _inside_cuts(inner: list[int], crossing: list[int], prefix: list[int], start: int, stop: int,
                 max_part_bytes: int, range_ends: set[int]) -> list[int]:
    """Positions between `start` and the next layer boundary `stop` where a part from `start` stays under the
    bound, crossing no more values than the fewest there plus the few a MoE block's expert ranges carry (the
    tokens, the router's weights, the sum so far: `graph/experts.py`), or ending an expert range. Where one expert
    range alone exceeds the bound (a Mixtral expert is 352 MB), the end of the first range past it: a part per
    range, not the whole layer."""
    within = [p for p in inner if start < p < stop and prefix[start] < prefix[p] <= prefix[start] + max_part_bytes]
    past = [p for p in range_ends if start < p < stop and prefix[p] > prefix[start]]
    if past and not range_ends.intersection(within):
        return [min(past)]
    if not within:
        return []
    fewest = min(crossing[p] for p in within)
    return [p for p in within if crossing[p] <= fewest + 2 or p in range_ends]


def _bounds(cuts: list[int], n: int) -> list[tuple[int, int]]:
    edges = [0, *cuts, n]
    return list(zip(edges[:-1], edges[1:]))


def _part_bytes(g: _Graph, lo: int, hi: int) -> int:
    seen: dict[int, int] = {}
    for op in g.ops[lo:hi]:
        for c in g.const_inputs(op):
            seen[_key(c)] = int(c.get_byte_size())
    return sum(seen.values())


def _graph_inputs_of(node, g: _Graph, graph_inputs: dict) -> list:
    """The graph's Parameters an input-derived computation (or a Parameter itself) reads."""
    found, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if _key(n) in seen:
            continue
        seen.add(_key(n))
        if _key(n) in graph_inputs:
            found.append(n)
        elif _key(n) in g.derived:
            stack.extend(inp.get_source_output().get_node() for inp in n.inputs())
    return found


def _relaxed(shape):
    """`shape` with its static zero dimensions made dynamic: a state's initial value is an empty tensor whose
    length grows (a `Parameter` with a static 0 there would fix the state's length at 0)."""
    import openvino as ov

    if shape.rank.is_dynamic:
        return shape
    return ov.PartialShape([ov.Dimension() if d.is_static and d.get_length() == 0 else d for d in shape])


def build_parts(model, plan: PartPlan):
    """Yield the parts of `model`, one `openvino.Model` at a time, editing `model` in place (pass a clone).

    Part k's inputs are the graph's own inputs it reads and the values earlier parts computed for it
    (`cut.<i>`); its outputs are the values later parts read and, in the last part, the graph's outputs.
    Build part k only after part k-1 (each part rewires its own operations' inputs).
    """
    import openvino as ov

    _split(model, plan.experts_range_bytes, plan.rows_range_bytes)
    g = _Graph(model)
    if len(g.ops) != len(plan._order) or any(a.get_type_name() != b.get_type_name() for a, b in zip(g.ops, plan._order)):
        raise ValueError("the graph changed since its parts were planned")
    part_of = {}
    for k, (lo, hi) in enumerate(_bounds(plan.cuts, len(g.ops))):
        for op in g.ops[lo:hi]:
            part_of[_key(op)] = k
    for assign in g.assigns:
        pos = g.producer_pos(assign.input(0).get_source_output())
        part_of[_key(assign)] = part_of[_key(g.ops[pos])] if pos is not None else 0
    results = list(model.get_results())
    last = plan.count - 1
    for result in results:
        part_of[_key(result)] = last
    names: dict[tuple[int, int], str] = {}  # (producer id, port) -> cut name
    graph_inputs = {_key(p): p for p in model.get_parameters()}
    for k in range(plan.count):
        params, outputs = [], []
        members = [op for op in g.ops if part_of[_key(op)] == k] + (results if k == last else [])
        for op in members:
            for inp in op.inputs():
                src = inp.get_source_output()
                node = src.get_node()
                if _key(node) in graph_inputs or _key(node) in g.derived:
                    for param in _graph_inputs_of(node, g, graph_inputs):
                        if _key(param) not in {_key(p) for p in params}:
                            params.append(param)
                    continue
                owner = part_of.get(_key(node))
                if owner is None or owner == k:
                    continue
                key = (_key(node), src.get_index())
                param = names.get(key)
                if not isinstance(param, ov.Node):
                    param = ov.op.Parameter(src.get_element_type(), _relaxed(src.get_partial_shape()))
                    param.set_friendly_name(names[key])
                    param.output(0).set_names({names[key]})
                    names[key] = param  # later readers in this part share it
                    params.append(param)
                inp.replace_source_output(param.output(0))
            for out in ([] if op.get_type_name() == "Result" else op.outputs()):
                later = [t for t in out.get_target_inputs() if part_of.get(_key(t.get_node()), k) > k]
                if later:
                    name = f"{CUT_PREFIX}{len(names)}"
                    names[(_key(op), out.get_index())] = name
                    result = ov.op.Result(out)
                    result.output(0).set_names({name})
                    outputs.append(result)
        for key, value in list(names.items()):  # parameters are per part: the next part makes its own
            if isinstance(value, ov.Node):
                names[key] = value.output(0).get_any_name()
        if k == last:
            outputs += results
        sinks = [a for a in g.assigns if part_of[_key(a)] == k]
        part = ov.Model(outputs, sinks, params, f"{model.get_friendly_name()}.part{k}")
        yield part
