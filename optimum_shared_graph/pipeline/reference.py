"""The validation reference of a 16-bit model: float32 compute, without a second copy of its weights.

optimum-intel loads an fp16/bf16 checkpoint in 16 bits, and its graph computes in float32 with those
16-bit weights. The export captures `generate()` on that one loaded model, with float32 compute, so the
reference is what the graph computes, not PyTorch's 16-bit rounding:

    result, report = capture_fp32(model, lambda: model.generate(...))

* each decoder layer (a child of the outermost `nn.ModuleList`): a forward pre-hook swaps the 16-bit
  parameters and buffers of its subtree for float32 copies, a forward hook puts the original Parameter
  objects back: at most one layer's float32 weights exist at a time, and code that reads a child's weight
  dtype inside the layer (Mamba's `x.to(self.norm.weight.dtype)`) sees float32;
* an `nn.Linear` outside the layers (`lm_head`) upcasts its weight in row chunks; an `nn.Embedding` looks up
  16-bit rows and upcasts them; any other module with 16-bit tensors (the final norm) is swapped alone;
* if 16-bit activations still reach a hooked module (a parent casting to a child's weight dtype, as
  Mamba's `lm_head(h.to(lm_head.weight.dtype))`), `capture_fp32` runs again with those modules held in
  float32 for the whole forward, and reports whatever still receives 16-bit activations.

Hidden states are float32 from the embedding on, so code that follows the input dtype (RMSNorm's
`.to(input_dtype)`, rotary `cos.to(x.dtype)`, masks from `inputs_embeds.dtype`, SDPA) stays in float32.
The model comes back as it was: the same Parameter objects, dtypes, no hooks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
import torch.nn.functional as F

LOW = (torch.float16, torch.bfloat16)


@dataclasses.dataclass
class Fp32Report:
    patched_linear: int = 0
    patched_embedding: int = 0
    swapped_modules: int = 0
    low_precision_inputs: dict = dataclasses.field(default_factory=dict)  # module name -> count
    peak_transient_bytes: int = 0


def _note_input(report, name, x):
    if isinstance(x, torch.Tensor) and x.dtype in LOW:
        report.low_precision_inputs[name] = report.low_precision_inputs.get(name, 0) + 1


# float32 buffers reused from call to call: upcasting into an existing buffer runs about 3.6x faster here than
# allocating a new tensor each time (fresh pages are faulted in and zeroed). Keyed by where a weight sits in
# its decoder layer, so every layer shares one set: one layer's float32 weights in all.
_Pool = dict


def _pooled(pool: _Pool, key, source: torch.Tensor) -> torch.Tensor:
    buf = pool.get(key)
    if buf is None or buf.shape != source.shape:
        buf = pool[key] = torch.empty(source.shape, dtype=torch.float32)
    return buf.copy_(source)


def _fp32_linear(module, name, report, chunk_bytes, pool, x):
    _note_input(report, name, x)
    x = x.float()
    w = module.weight
    b = None if module.bias is None else module.bias.float()
    if w.dtype == torch.float32:
        return F.linear(x, w, b)
    rows = max(1, chunk_bytes // (4 * w.shape[1]))
    if rows >= w.shape[0]:
        report.peak_transient_bytes = max(report.peak_transient_bytes, w.numel() * 4)
        return F.linear(x, _pooled(pool, ("linear", name), w), b)
    report.peak_transient_bytes = max(report.peak_transient_bytes, rows * w.shape[1] * 4)
    out = x.new_empty(*x.shape[:-1], w.shape[0])
    for start in range(0, w.shape[0], rows):
        stop = min(start + rows, w.shape[0])
        chunk = _pooled(pool, ("chunk", name, stop - start), w[start:stop])
        out[..., start:stop].copy_(F.linear(x, chunk, None if b is None else b[start:stop]))
    return out


def _fp32_embedding(module, name, report, ids):
    out = F.embedding(ids, module.weight, module.padding_idx, module.max_norm, module.norm_type,
                      module.scale_grad_by_freq, module.sparse)
    return out.float()


def _layers(model):
    """Children of the outermost nn.ModuleLists (decoder layers / blocks); nested lists (experts) are inside them."""
    found, seen = [], set()
    for name, mod in model.named_modules():
        if any(name.startswith(p + ".") for p in seen):
            continue
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0:
            seen.add(name)
            found += [(f"{name}.{i}" if name else str(i), child) for i, child in enumerate(mod)]
    return found


def _swap_in(mod, recurse, report, name, skip=(), pool=None, key=""):
    """Replace `mod`'s 16-bit tensors (its subtree's if recurse) with fp32 copies; return how to undo it.

    The copies go into `pool`'s buffers under `key` + their path inside `mod` (decoder layers pass one key,
    so they share buffers; a module held for the whole forward passes its own name)."""
    saved, nbytes = [], 0
    pool = {} if pool is None else pool
    own_fp32 = [path for path, m in mod.named_modules() if getattr(m, "computes_fp32_itself", False)] if recurse else []
    for path, owner in (mod.named_modules() if recurse else [("", mod)]):
        if any(path == p or path.startswith(p + ".") for p in own_fp32):
            continue  # upcasts its own weights as it computes (a mixture of experts' stored experts)
        for n, p in list(owner._parameters.items()):
            if p is not None and p.dtype in LOW and (owner, n) not in skip:
                w = _pooled(pool, (key, path, n), p.detach())
                nbytes += w.numel() * 4
                saved.append((owner, "p", n, p))
                owner._parameters[n] = torch.nn.Parameter(w, requires_grad=False)
        for n, b in list(owner._buffers.items()):
            if b is not None and b.dtype in LOW:
                saved.append((owner, "b", n, b))
                owner._buffers[n] = b.float()
    report.peak_transient_bytes = max(report.peak_transient_bytes, nbytes)
    return saved


_F_EMBEDDING = F.embedding


def _upcasting_embedding(table):
    """F.embedding that returns fp32 rows when looking up `table` (a 16-bit Parameter): no fp32 copy of the table."""
    def embedding(input, weight, *args, **kwargs):
        out = _F_EMBEDDING(input, weight, *args, **kwargs)
        return out.float() if weight is table else out
    return embedding


def _restore(saved):
    for owner, kind, n, t in saved:
        (owner._parameters if kind == "p" else owner._buffers)[n] = t


@contextlib.contextmanager
def fp32_compute(model: torch.nn.Module, chunk_bytes: int = 64 * 2**20, mode: str = "layer", whole_forward=()):
    """mode "layer": each decoder layer's whole subtree is swapped to fp32 for its forward (robust to code that
    reads a child's weight dtype, e.g. Mamba's `x.to(self.norm.weight.dtype)`, Qwen3-Next's `self.conv1d.weight`);
    transient = one layer in fp32. mode "module": per-module swaps, nn.Linear upcast in `chunk_bytes` row chunks;
    transient <= max(chunk_bytes, largest non-Linear module).
    whole_forward: names of modules whose fp32 copy is held for the model's whole forward (for a parent that reads
    their weight dtype, e.g. Mamba's `self.lm_head(h.to(self.lm_head.weight.dtype))`: see `capture_fp32`)."""
    report = Fp32Report()
    patched, handles, stash, pool = [], [], {}, _Pool()
    layer_ids = {id(m) for _, m in _layers(model)} if mode == "layer" else set()
    inside = set()
    if layer_ids:
        for _, m in _layers(model):
            inside.update(id(x) for x in m.modules())

    def add_swap(module, name, recurse):
        # an nn.Embedding subclass with its own forward (Gemma's scaled embedding, OPT's learned positions): its
        # table stays 16-bit and F.embedding upcasts the looked-up rows; its other tensors (embed_scale) are swapped
        table = module.weight if isinstance(module, torch.nn.Embedding) and not recurse else None

        def pre(mod, args, kwargs):
            for a in list(args) + list(kwargs.values()):
                _note_input(report, name, a)
            skip = {(mod, "weight")} if table is not None else ()
            key = f"layer:{type(mod).__name__}" if recurse else f"module:{name}"
            stash.setdefault(id(mod), []).append((_swap_in(mod, recurse, report, name, skip, pool, key), F.embedding))
            if table is not None:
                F.embedding = _upcasting_embedding(table)

        def post(mod, args, kwargs, output):
            frames = stash.get(id(mod))
            if frames:
                saved, f_embedding = frames.pop()
                _restore(saved)
                F.embedding = f_embedding
            return None

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
        report.swapped_modules += 1

    try:
        if whole_forward:
            held = [m for n, m in model.named_modules() if n in set(whole_forward)]

            def top_pre(mod, args, kwargs):
                stash.setdefault("top", []).append(([x for m in held for x in _swap_in(m, True, report, "top", pool=pool, key=f"held:{id(m)}")], F.embedding))

            def top_post(mod, args, kwargs, output):
                if stash.get("top"):
                    _restore(stash["top"].pop()[0])

            handles.append(model.register_forward_pre_hook(top_pre, with_kwargs=True))
            handles.append(model.register_forward_hook(top_post, with_kwargs=True, always_call=True))
            for m in held:
                inside.update(id(x) for x in m.modules())
        for name, module in model.named_modules():
            if id(module) in layer_ids:
                add_swap(module, name, recurse=True)
                continue
            if id(module) in inside:
                continue
            own = [t for t in list(module._parameters.values()) + list(module._buffers.values())
                   if t is not None and t.dtype in LOW]
            if not own:
                continue
            if type(module).forward is torch.nn.Linear.forward and "forward" not in module.__dict__:
                module.forward = functools.partial(_fp32_linear, module, name, report, chunk_bytes, pool)
                patched.append(module)
                report.patched_linear += 1
            elif type(module).forward is torch.nn.Embedding.forward and "forward" not in module.__dict__:
                module.forward = functools.partial(_fp32_embedding, module, name, report)
                patched.append(module)
                report.patched_embedding += 1
            else:  # RMSNorm, an nn.Embedding subclass (Gemma scaled embedding, OPT positions), conv, ...
                add_swap(module, name, recurse=False)
        yield report
    finally:
        for h in handles:
            h.remove()
        for mod in patched:
            del mod.forward  # back to the class's forward
        for frames in stash.values():  # left over only if a forward raised
            for saved, _ in reversed(frames):
                _restore(saved)
        F.embedding = _F_EMBEDDING
        stash.clear()




def capture_fp32(model, run, **kwargs):
    """`run()` under fp32_compute; if some module still got 16-bit activations (a parent cast to a child's weight
    dtype), run again with those modules held in fp32 for the whole forward. Returns (result, report); the caller
    must fall back to an fp32 load if report.low_precision_inputs is still non-empty."""
    with fp32_compute(model, **kwargs) as report:
        result = run()
    if report.low_precision_inputs:
        first = dict(report.low_precision_inputs)
        with fp32_compute(model, whole_forward=tuple(first), **kwargs) as report:
            result = run()
        report.retried_for = first
    return result, report
