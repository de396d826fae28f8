"""ExportOptions: one frozen set of options, checked when built."""

from __future__ import annotations

import dataclasses

import pytest

from optimum_shared_graph import ExportOptions, InvalidOptionsError


def test_defaults():
    opts = ExportOptions()
    assert (opts.shape_mode, opts.logits, opts.fallback, opts.stateful) == ("dynamic", "last", "auto", True)
    assert not opts.is_static


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExportOptions().logits = "all"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"logits": "first"}, "--logits must be one of last, all"),
        ({"shape_mode": "fixed"}, "--shape-mode must be one of dynamic, static"),
        ({"fallback": "maybe"}, "--fallback must be one of auto, never"),
        ({"weight_format": "int3"}, "--weight-format must be one of"),
        ({"max_cache_len": 128}, "only applies to static artifacts"),
        ({"shape_mode": "static", "max_cache_len": 0}, "--max-cache-len must be at least 1"),
        ({"shape_mode": "static", "static_batch_size": 0}, "--static-batch-size must be at least 1"),
        ({"shape_mode": "static", "static_query_len": 0}, "--static-query-len must be at least 1"),
        ({"shape_mode": "static", "static_query_len": 16, "max_cache_len": 8}, "cannot exceed --max-cache-len"),
        ({"validation_new_tokens": 2}, "at least 4"),
    ],
)
def test_invalid(kwargs, message):
    with pytest.raises(InvalidOptionsError, match=message.replace("(", r"\(")):
        ExportOptions(**kwargs)


def test_dict_round_trip_and_unknown_keys():
    opts = ExportOptions(logits="all", skip_validation=True)
    assert ExportOptions.from_dict(opts.to_dict()) == opts
    with pytest.raises(InvalidOptionsError, match="unknown export option.*logit_mode"):
        ExportOptions.from_dict({"logit_mode": "all"})


def test_cli_and_api_share_the_options():
    import argparse

    from optimum.commands.export.openvino import parse_args_openvino

    from optimum_shared_graph import cli as _cli

    parser = argparse.ArgumentParser()
    parse_args_openvino(parser)
    _cli.add_arguments(parser)
    args = parser.parse_args(["-m", "x", "out", "--task", "text-generation-shared", "--logits", "all",
                              "--disable-stateful", "--weight-format", "int8"])
    opts = _cli.options_from_args(args)
    assert opts == ExportOptions(logits="all", stateful=False, weight_format="int8")
