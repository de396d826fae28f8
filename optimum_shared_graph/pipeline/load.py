"""Stage 1, load: every check that needs no model weights, before any work.

The model itself is loaded once, by optimum-intel's own export (`convert.py`), in the dtype optimum-intel
picks (16 bits for an fp16/bf16 checkpoint): the decomposition and the static trace run on that model.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidOptionsError, ModelNotSupportedError
from ..manifest import MANIFEST_NAME
from ..options import ExportOptions
from ..registration import supported_model_types
from ..tasks import TASK
from . import fallback, multimodal


def check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise InvalidOptionsError(f"output {output} exists and is not a directory: choose a directory path")
    if output.is_dir() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
        raise InvalidOptionsError(
            f"output directory {output} is not empty and holds no {MANIFEST_NAME}: choose a new or empty directory"
        )


def load_config(model: str, opts: ExportOptions):
    from transformers import AutoConfig

    # "org/name" is a hub id; anything that looks like a file system path must exist.
    looks_local = model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model
    if os.path.exists(model) and not os.path.isdir(model):
        raise ModelNotSupportedError(
            f"model path {model} is a file, not a model directory: pass the directory that holds its config.json "
            "(or a hub model id)"
        )
    if looks_local and not os.path.isdir(model):
        raise ModelNotSupportedError(f"model path {model} does not exist: pass a model directory or a hub model id")
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=opts.trust_remote_code)
    except ValueError as err:
        text = str(err)
        if "trust_remote_code" in text:
            raise ModelNotSupportedError(
                f"{model} needs custom code from its repository: pass --trust-remote-code if you trust it"
            ) from err
        raise ModelNotSupportedError(f"cannot read the configuration of {model}: {text.splitlines()[0]}") from err
    except (OSError, KeyError) as err:
        raise ModelNotSupportedError(
            f"cannot load {model}: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}; "
            "pass a model directory with a config.json or a hub model id"
        ) from err
    model_type = getattr(config, "model_type", None)
    supported = supported_model_types()
    if model_type not in supported:
        if fallback.is_vision_language(config) or (opts.trust_remote_code and getattr(config, "auto_map", None)):
            return config  # decomposition decides: a VLM falls back, a remote-code wrapper may delegate
        if multimodal.is_multimodal(config):
            multimodal.plan(config)  # one line when its language model cannot be exported
            return config
        from optimum.exporters.tasks import TasksManager

        tasks = TasksManager._SUPPORTED_MODEL_TYPE.get(model_type, {}).get("openvino")
        if tasks:
            raise ModelNotSupportedError(
                f"{model} is a {model_type} model, not a causal language model: the OpenVINO exporter supports it for "
                f"{', '.join(sorted(tasks))}, not for {TASK}"
            )
        raise ModelNotSupportedError(
            f"model type {model_type!r} is not known to optimum-intel's OpenVINO exporter, so {TASK} cannot export it; "
            "see `optimum_shared_graph.supported_model_types()`"
        )
    return config


def load_model(model: str, config, opts: ExportOptions):
    """Load a model optimum-intel cannot load as its own type (a remote-code wrapper), in the checkpoint's
    dtype, for the decomposition to find the inner causal LM its `generate()` drives."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model, config=config, dtype="auto",
                                                    trust_remote_code=opts.trust_remote_code).eval()
    except Exception as err:
        raise load_error(model, config, err) from err


def load_error(model: str, config, err: BaseException) -> ModelNotSupportedError:
    """The one line for a model optimum-intel could not load (its loader's exception is `err`)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, ValueError):
        return ModelNotSupportedError(
            f"{model} ({config.model_type}) is not a causal language model transformers can load: {first}")
    return ModelNotSupportedError(  # a corrupt or truncated weights file (safetensors, torch), a missing shard, ...
        f"cannot load the weights of {model}: {type(err).__name__}: {first}; check that its weight files are "
        "complete (re-download or re-save the model)"
    )
