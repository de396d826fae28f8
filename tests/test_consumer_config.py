"""The artifact's config.json completed with what OpenVINO consumers read (`pipeline/consumer_config.py`).

The end-to-end check, `OVModelForCausalLM.generate()` on an export of a Qwen3.5-MoE config without
`intermediate_size`, is in `tests/test_multimodal.py` (the published layout) and `tests/test_architectures.py`
(the text model type, `pytest -m coverage`).
"""

from __future__ import annotations

import json

from optimum_shared_graph.pipeline.consumer_config import complete


def _write(directory, **config):
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_intermediate_size_added_to_a_qwen3_5_moe_text_config(tmp_path):
    from transformers import AutoConfig

    directory = _write(tmp_path, model_type="qwen3_5_moe_text", moe_intermediate_size=32, hidden_size=64)
    added = complete(directory)
    assert list(added) == ["intermediate_size"] and "OVModelForCausalLM" in added["intermediate_size"]
    config = json.loads((directory / "config.json").read_text())
    assert config["intermediate_size"] == 32 and config["moe_intermediate_size"] == 32
    assert AutoConfig.from_pretrained(directory).intermediate_size == 32  # what optimum-intel reads


def test_nothing_changed_when_the_key_is_there_or_not_needed(tmp_path):
    moe = _write(tmp_path / "moe", model_type="qwen3_5_moe_text", moe_intermediate_size=32, intermediate_size=7)
    text = (moe / "config.json").read_text()
    assert complete(moe) == {} and (moe / "config.json").read_text() == text
    llama = _write(tmp_path / "llama", model_type="llama", hidden_size=64)
    text = (llama / "config.json").read_text()
    assert complete(llama) == {} and (llama / "config.json").read_text() == text
    assert complete(tmp_path / "nowhere") == {}
