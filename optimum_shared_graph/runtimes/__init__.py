"""Running artifacts: `runtime()` and its provider registry (`registry`), the OpenVINO provider
(`openvino`), and the sessions that feed a dynamic (`session`) or static (`static_session`) graph call by call."""
