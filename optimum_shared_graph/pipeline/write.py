"""Stages 5 and 6, validate and write: the graph checked against the captured calls, then the artifact
(graph with the manifest in its rt_info, configs, tokenizer, `shared_graph.json`) moved into place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .. import progress
from ..errors import ModelNotSupportedError
from ..graph.logits import is_sliced, slice_logits
from ..graph.static import shapes_of
from ..manifest import GRAPH_XML, RT_INFO_KEY, DigestsBeside, Manifest, build_manifest, digest_graph_files
from ..proof.stored import Reference
from ..tasks import VLM_TASK
from . import fallback


def prepare(raw: Path, graph_xml: str, config, capture, opts, model, quantization, calibration=None, *,
            model_extra: dict | None = None):
    """The shared graph `graph_xml` (the plan's) optimum-intel (or the static trace) wrote into `raw`, with its
    logits slice, and the manifest that describes it (no validation yet); return
    `(graph_xml, ov_model, unchanged, manifest)`.

    `model_extra` adds to the manifest's `model` (the architecture fix the export ran with, the `config.json` keys
    completed, a multimodal checkpoint's language model: `pipeline/export.py`'s `_model_facts`).
    """
    import openvino as ov

    graphs = sorted(p.name for p in raw.glob("openvino_*model*.xml") if "tokenizer" not in p.name)
    if graphs != [graph_xml]:
        raise ModelNotSupportedError(
            f"optimum-intel wrote {len(graphs)} graphs ({', '.join(graphs)}) for {config.model_type}, not one "
            "decoder graph: use --fallback auto for this model"
        )
    ov_model = ov.Core().read_model(raw / graph_xml)
    unchanged = True  # the graph is as optimum-intel (or the static trace) wrote it
    if opts.logits == "last" and not opts.is_static and not is_sliced(ov_model):  # static graphs slice their own
        slice_logits(ov_model)
        unchanged = False
    notes = {"notes": list(capture.notes)} if capture is not None and capture.notes else {}
    manifest = build_manifest(
        partitioning="shared", config=config, source=model, opts=opts, decoder=ov_model, files=[graph_xml],
        quantization=quantization, calibration=calibration,
        static=shapes_of(ov_model).to_dict() if opts.is_static else None,
        model_extra={**exported_module(capture), **notes, **(model_extra or {})},
    )
    return graph_xml, ov_model, unchanged, manifest


def prepare_parts(raw: Path, plan, quantization, calibration, validation: dict, *,
                  model_extra: dict | None = None) -> Manifest:
    """The manifest of an image-text-to-text-shared export: every graph optimum-intel wrote into `raw` (the tokenizer's
    aside), the shared one (`plan.shared_graph`, the language model) first and described, with the `validation`
    report; `model_extra` adds to its `model` (the architecture fix the export ran with)."""
    import openvino as ov

    graphs = sorted(p.name for p in raw.glob("openvino_*.xml")
                    if p.name not in ("openvino_tokenizer.xml", "openvino_detokenizer.xml"))
    files = [plan.shared_graph] + [g for g in graphs if g != plan.shared_graph]
    language = ov.Core().read_model(raw / plan.shared_graph)  # its ports and states are described
    manifest = build_manifest(partitioning="shared", config=plan.config, source=plan.model, opts=plan.opts,
                              decoder=language, files=files, quantization=quantization, calibration=calibration,
                              graph_task=VLM_TASK, model_extra=model_extra)
    del language
    manifest.task = plan.task
    manifest.graph["language_model"] = plan.shared_graph
    manifest.validation = validation
    return manifest


def exported_module(capture) -> dict:
    """What the manifest records when the shared graph is a wrapper's inner causal LM."""
    if capture is None or capture.module is None:
        return {}
    inner = capture.exported
    return {"exported_module": capture.module, "exported_model_type": inner.config.model_type,
            "exported_architecture": getattr(inner, "architecture", type(inner).__name__)}


def digests_beside(raw: Path) -> DigestsBeside:
    """The digests of the graph's `.bin` in `raw` (as optimum-intel or the static trace wrote it), computed in a
    thread from now on; `write_artifact` uses them where the `.bin` is moved into the artifact unchanged."""
    return DigestsBeside({p.name: p for p in sorted(raw.glob("openvino_*model*.bin")) if "tokenizer" not in p.name})


def write_artifact(raw: Path, final: Path, graphs: dict, manifest: Manifest, *, reference: Reference | None = None,
                   digests: DigestsBeside | None = None) -> None:
    """Write the artifact into `final`: every file optimum-intel wrote into `raw`, the `graphs` (name ->
    `openvino.Model`, or None to read it from `raw`) with the manifest under `shared_graph` in their
    rt_info, the validation's `reference` (its sha256 under `validation.reference`), the sha256 of every
    graph file (remembered in this machine's cache of verified files; `digests`' where a file is moved unchanged),
    and `shared_graph.json`."""
    import openvino as ov

    graph_files = {n for name in graphs for n in (name, name[: -len(".xml")] + ".bin")}
    if digests is not None:
        progress.step("digests beside: waited for")
    digested = digests.result() if digests is not None else None  # before any file moves
    final.mkdir()
    if reference is not None:
        progress.step("reference saved")
        manifest.validation["reference"] = reference.save(final)
    progress.step("files moved, graph rt_info written")
    for item in raw.iterdir():
        if item.name not in graph_files:
            shutil.move(str(item), final / item.name)
    rt_info = manifest.rt_info()
    core = ov.Core()
    for name, graph in graphs.items():
        if graph is None and _add_rt_info_to_xml(raw / name, final / name, rt_info):
            bin_name = name[: -len(".xml")] + ".bin"
            os.replace(raw / bin_name, final / bin_name)
            continue  # the weights were written once, by optimum-intel: moved, not rewritten
        graph = graph if graph is not None else core.read_model(raw / name)
        for key, value in rt_info.items():
            graph.set_rt_info(value, [RT_INFO_KEY, key])
        ov.save_model(graph, final / name, compress_to_fp16=False)
        del graph
    graphs.clear()
    # Remembered as verified on this machine: the first load after the export does not hash them again.
    progress.step("hashing")
    manifest.files, manifest.files_xxh3_128 = digest_graph_files(
        final, sorted(n for n in graph_files if (final / n).is_file()), remember=True, digested=digested)
    manifest.write(final)


def _add_rt_info_to_xml(xml: Path, target: Path, rt_info: dict[str, str]) -> bool:
    """Write `xml` to `target` with `rt_info` under `shared_graph` in its rt_info, editing the XML text only
    (the `.bin` is untouched); True when OpenVINO reads the result back with every value, else False and
    nothing written (the caller saves the graph instead)."""
    import openvino as ov
    from xml.sax.saxutils import quoteattr

    text = xml.read_text(encoding="utf-8")
    entries = "".join(f"\n\t\t\t<{key} value={quoteattr(value)} />" for key, value in rt_info.items())
    block = f"\n\t\t<{RT_INFO_KEY}>{entries}\n\t\t</{RT_INFO_KEY}>"
    end = text.rfind("</rt_info>")
    if end >= 0:
        edited = text[:end].rstrip() + block + "\n\t" + text[end:]
    else:
        net = text.rfind("</net>")
        if net < 0:
            return False
        edited = text[:net].rstrip() + f"\n\t<rt_info>{block}\n\t</rt_info>\n" + text[net:]
    target.write_text(edited, encoding="utf-8")
    try:
        model = ov.Core().read_model(target, xml.with_suffix(".bin"))
        written = model.get_rt_info()[RT_INFO_KEY]
        ok = all(written[key].astype(str) == value for key, value in rt_info.items())
    except (RuntimeError, KeyError):
        ok = False
    if not ok:
        target.unlink()
    return ok


def move_into_place(final: Path, output: Path) -> None:
    """Put `final` at `output` by renames on the same filesystem; an old artifact there is replaced."""
    if output.is_dir():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.rename(output, old)
        try:
            os.rename(final, output)
        except OSError:
            os.rename(old, output)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(final, output)


def _model_graphs(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.glob("openvino_*.xml")
        if p.name not in ("openvino_tokenizer.xml", "openvino_detokenizer.xml")
    )


def finish_fallback(raw: Path, final: Path, config: Any, reason: str, opts: Any, model: str,
                    quantization: dict[str, Any] | None, model_extra: dict[str, Any] | None = None) -> Manifest:
    """Turn optimum-intel's own export in `raw` into the artifact in `final`, with its manifest.

    Every graph optimum-intel wrote (one for with-past; the language model, text embeddings and
    vision graphs for image-text-to-text) gets the manifest facts in its rt_info and its sha256 in
    the manifest.

    Args:
        raw: optimum-intel's export directory.
        final: the artifact directory to create.
        config: the model's transformers config.
        reason: why decomposition failed.
        opts: the `ExportOptions`.
        model: the model id or directory, as given.
        quantization: what the manifest records of the quantization flags.
        model_extra: more facts about the model (the architecture fix applied).

    Returns:
        The manifest, already written into `final`.
    """
    import openvino as ov

    task = fallback.fallback_task(config)
    graphs = _model_graphs(raw)
    decoder = GRAPH_XML if GRAPH_XML in graphs else next((g for g in graphs if "language_model" in g), None)
    if decoder is None:
        raise ModelNotSupportedError(
            f"optimum-intel's {task} export of {config.model_type} wrote no decoder graph "
            f"({', '.join(graphs) or 'no graphs'}): export it with --task {task} directly"
        )
    decoder_model = ov.Core().read_model(raw / decoder)
    if opts.logits == "last":  # the same slice as the shared graph's: logits for the last position only
        slice_logits(decoder_model)
    files = [decoder] + [g for g in graphs if g != decoder]
    manifest = build_manifest(
        partitioning="fallback", config=config, source=model, opts=opts, decoder=decoder_model, files=files,
        quantization=quantization, fallback_reason=reason, graph_task=task, model_extra=model_extra,
    )
    manifest.validation = {
        "status": "skipped",
        "reason": "fallback: optimum-intel's own partitioning, with no captured generate() calls to check it against",
    }
    write_artifact(raw, final, {g: (decoder_model if g == decoder else None) for g in files}, manifest)
    return manifest
