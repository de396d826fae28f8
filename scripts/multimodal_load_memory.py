"""Peak memory of loading a multimodal checkpoint's language model, two ways (docs/multimodal.md).

- `view`: what `--task text-generation-shared` does (`pipeline/multimodal.py`): transformers loads the
  language model alone from a directory with the text config and links to the checkpoint's weight files.
- `whole`: the alternative: load the whole multimodal model, then `save_pretrained` its language model (with
  the head) as a causal LM of its own for optimum-intel to load again.

Each runs in its own process (peak RSS from `getrusage`) on a tiny Qwen3.5-MoE checkpoint laid out like the
published one, made larger so the weights dominate (text: hidden 768, 8 layers, 16 experts of 512; vision:
4 blocks of 512). Usage: `PYTHONPATH=. python scripts/multimodal_load_memory.py [--rounds 2]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(checkpoint: Path) -> None:
    from optimum_shared_graph.testing import MULTIMODAL, build_tiny_multimodal

    MULTIMODAL["qwen3_5_moe"]["vision"].update(depth=4, hidden_size=512, intermediate_size=2048, num_heads=8)
    build_tiny_multimodal("qwen3_5_moe", checkpoint, hidden_size=768, num_hidden_layers=8, num_experts=16,
                          moe_intermediate_size=512, shared_expert_intermediate_size=512, tokenizer=False)


def view(checkpoint: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from optimum_shared_graph.pipeline import multimodal

    language = multimodal.plan(AutoConfig.from_pretrained(checkpoint))
    directory = multimodal.text_view(str(checkpoint), language, Path(tempfile.mkdtemp()) / "text")
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype="auto")


def whole(checkpoint: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype="auto")
    with torch.device("meta"):
        language = AutoModelForCausalLM.from_config(model.config.get_text_config())
    language.model, language.lm_head = model.model.language_model, model.lm_head
    language.save_pretrained(tempfile.mkdtemp())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", choices=["view", "whole", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one == "build":
        build(Path(args.checkpoint))
        return
    if args.one:
        import torch  # noqa: F401  (counted before the load, as the imports are)

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        model = {"view": view, "whole": whole}[args.one](Path(args.checkpoint))
        seconds = time.monotonic() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"how": args.one, "peak_mb": round(peak / 1024), "imports_mb": round(before / 1024),
                          "weights_loaded_mb": round(weights / 2**20), "seconds": round(seconds, 1)}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        # every step in a process of its own: a child inherits its parent's peak RSS across fork and exec
        subprocess.run([sys.executable, __file__, "--one", "build", "--checkpoint", str(checkpoint)],
                       capture_output=True, text=True, check=True)
        for _ in range(args.rounds):
            for how in ("view", "whole"):
                proc = subprocess.run([sys.executable, __file__, "--one", how, "--checkpoint", str(checkpoint)],
                                      capture_output=True, text=True, check=True)
                print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
