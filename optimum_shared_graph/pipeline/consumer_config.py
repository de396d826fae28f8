"""The artifact's `config.json` completed with what OpenVINO consumers' loaders read and a model type's
transformers config lacks.

optimum-intel's `OVModelForCausalLM` builds its hybrid-model cache description (`OVCacheWithMambaStates`)
from `config.intermediate_size` for every model with state other than keys and values. A Qwen3.5-MoE
text config has no such key (`Qwen3_5MoeTextConfig` defines none, and the published configurations have
none): its MLP widths are `moe_intermediate_size` (each routed expert) and
`shared_expert_intermediate_size`. So a validated artifact failed at the first `generate()` with
`AttributeError: 'Qwen3_5MoeTextConfig' object has no attribute 'intermediate_size'`.

The key is added to the written `config.json` only where it is missing: transformers keeps an unknown
key as a plain attribute of the config, and no Qwen3.5-MoE module reads it, so the model transformers
builds from the artifact's config is the same. For a stateful graph (the default) optimum-intel reads the
value and never uses it (the states live in the graph); the per-expert width is the MLP width it stands for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

# model type -> {key the consumers read: its value from the config's own keys}
MISSING_KEYS: dict[str, dict[str, Callable[[dict], object]]] = {
    "qwen3_5_moe_text": {"intermediate_size": lambda config: config["moe_intermediate_size"]},
}


def complete(directory: Path) -> dict[str, str]:
    """Add the keys of `MISSING_KEYS` that `directory/config.json` lacks; return what was added (key ->
    where its value comes from), for the manifest."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text(encoding="utf-8"))
    added = {}
    for key, value in MISSING_KEYS.get(config.get("model_type"), {}).items():
        if key not in config:
            config[key] = value(config)
            added[key] = f"{config[key]!r}, for optimum-intel's OVModelForCausalLM (the config defines no {key})"
    if added:
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return added
