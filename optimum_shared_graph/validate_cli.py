"""`optimum-cli shared-graph validate ARTIFACT`: `validate()` from the command line.

Registered the way the export task is: the optimum-cli hook (`_cli_hook/register_shared_graph.py`, installed
in Optimum's `commands/register/`) lists `SharedGraphCommand` in `REGISTER_COMMANDS`, so it sits beside
`optimum-cli export` and `optimum-cli env`. `python -m optimum_shared_graph validate ...` runs the same
command where the hook is not installed (an editable install).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import InvalidOptionsError, SharedGraphError

CONSUMERS = ("openvino", "optimum", "runtime", "genai", "continuous-batching", "optimum-vlm", "genai-vlm",
             "runtime-vlm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("artifact", help="the artifact directory (the OUT of an export)")
    parser.add_argument("--consumer", choices=CONSUMERS, default="openvino",
                        help="openvino (default): the graph compiled by OpenVINO Runtime; optimum: OVModelForCausalLM; "
                             "runtime: optimum_shared_graph.runtime() (static artifacts too); these three compare every "
                             "call's logits, teacher-forced. genai: OpenVINO GenAI's LLMPipeline (the NPU pipeline on "
                             "--device NPU); continuous-batching: its ContinuousBatchingPipeline; these two compare "
                             "greedy tokens. An image-text-to-text-shared artifact: optimum-vlm "
                             "(OVModelForVisualCausalLM) or runtime-vlm (optimum_shared_graph.runtime()), "
                             "teacher-forced, or genai-vlm (GenAI's VLMPipeline, greedy tokens), on the stored image "
                             "and prompt.")
    parser.add_argument("--device", default="CPU", help="the OpenVINO device (CPU, GPU, NPU, ...). Default: CPU")
    parser.add_argument("--property", "-p", action="append", default=[], metavar="KEY=VALUE", dest="properties",
                        help="a compile property for the consumer (repeat the flag for several), e.g. "
                             "-p INFERENCE_PRECISION_HINT=f32 -p KV_CACHE_PRECISION=f32; on this machine's CPU, "
                             "the NPU pipeline: --device NPU -p NPU_USE_NPUW=YES -p NPUW_DEVICES=CPU")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON on stdout (the one-line verdict then goes to stderr)")


def parse_properties(items: list[str]) -> dict:
    properties = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOptionsError(f"--property {item!r} is not KEY=VALUE: write it as -p INFERENCE_PRECISION_HINT=f32")
        properties[key] = int(value) if value.lstrip("-").isdigit() else value
    return properties


def run(args: argparse.Namespace) -> int:
    from .proof.check import validate

    try:
        report = validate(args.artifact, consumer=args.consumer, device=args.device,
                          properties=parse_properties(args.properties))
    except SharedGraphError as err:
        if os.environ.get("OPTIMUM_SHARED_GRAPH_DEBUG"):
            raise
        if args.json and getattr(err, "report", None):
            print(json.dumps({**err.report, "error": str(err)}, indent=2))
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:  # stdout stays one JSON document (`--json > report.json`); the verdict line goes beside it
        print(json.dumps(report, indent=2))
        print(summary(args.artifact, report), file=sys.stderr)
    else:
        print(summary(args.artifact, report))
    return 0


def summary(artifact: str, report: dict) -> str:
    """One line: what ran, against what, and the figures."""
    against = "PyTorch" if report["judged_against"] == "pytorch" else "the exported graph"
    if "max_abs_diff_prefill" in report:
        figures = (f"{report['greedy_tokens']} calls, max |dlogits| prefill {report['max_abs_diff_prefill']:.2e}, "
                   f"decode {report['max_abs_diff_decode']:.2e}, top-1 agreement {report['top1_agreement']:.2f}")
    else:
        figures = f"greedy tokens compared: {', '.join(map(str, report['compared_tokens']))} of {report['greedy_tokens']}"
        if report.get("not_compared"):
            figures += f" ({report['not_compared'][0]['reason']})"
    ties = [d for d in report["differing_steps"] if d["near_tie"]]
    if ties:
        figures += f", {len(ties)} near-tie{'s' if len(ties) > 1 else ''}"
    rule = f"{report['rule']} rule" + "".join(f" + {term}" for term in report.get("terms") or ())
    return (f"validate: {artifact} reproduces {against} through {report['consumer']} on {report['device']} "
            f"({figures}; tolerance {report['tolerance']:.3g}, {rule})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimum_shared_graph")
    commands = parser.add_subparsers(dest="command", required=True)
    add_arguments(commands.add_parser("validate", help=VALIDATE_HELP))
    return run(parser.parse_args(argv))


VALIDATE_HELP = "Run an artifact's stored reference through an OpenVINO consumer on a device, judged as the export was."

try:  # the optimum-cli command (optimum is a dependency; guarded so `python -m` works without it)
    from optimum.commands.base import BaseOptimumCLICommand, CommandInfo

    class ValidateCommand(BaseOptimumCLICommand):
        @staticmethod
        def parse_args(parser):
            add_arguments(parser)

        def run(self):
            raise SystemExit(run(self.args))

    class SharedGraphCommand(BaseOptimumCLICommand):
        COMMAND = CommandInfo(name="shared-graph", help="optimum-shared-graph: check an exported artifact.")
        SUBCOMMANDS = (CommandInfo(name="validate", help=VALIDATE_HELP, subcommand_class=ValidateCommand),)
except ImportError:  # pragma: no cover
    SharedGraphCommand = None
