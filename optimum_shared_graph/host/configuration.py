"""optimum-intel's quantization configs (`optimum.intel.openvino.configuration`): their record as JSON.

optimum-intel writes a quantized model's config to `openvino_config.json`, each NNCF dataclass among a config's
arguments (`advanced_parameters`) made a dict with `dataclasses.asdict` (`OVQuantizationConfigBase.
_dataclasses_to_dict`), which keeps the enum members inside (a range estimator's `AggregatorType`, ...): JSON
cannot write them, and the save fails after quantization. A vision-language model's full quantization writes
its language model's config so (`OVPipelineQuantizationConfig.to_dict`); a text model's does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from typing import Any, Iterator

from ._swap import replaced


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


@contextlib.contextmanager
def config_enums_serialized() -> Iterator[None]:
    """While active, optimum-intel's `OVQuantizationConfigBase._dataclasses_to_dict` also writes each enum member
    inside a dataclass as its value (module docstring); the class's own entry is back on exit."""
    from optimum.intel.openvino.configuration import OVQuantizationConfigBase

    def _dataclasses_to_dict(d: dict) -> None:
        for k in d:
            v = d[k]
            if isinstance(v, dict):
                _dataclasses_to_dict(v)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                d[k] = _plain(dataclasses.asdict(v))

    with replaced(OVQuantizationConfigBase, "_dataclasses_to_dict", staticmethod(_dataclasses_to_dict)):
        yield
