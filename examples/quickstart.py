"""Quickstart: build a small model locally, export it as one shared graph, generate with it.

Run from the repository root after `pip install .`:

    python examples/quickstart.py [WORKDIR]

Nothing is downloaded: the model is a random-init Llama-shaped model and the tokenizer is trained
locally. It runs `optimum-cli export openvino --task text-generation-shared` exactly as a user would,
then generates with `OVModelForCausalLM` and OpenVINO GenAI, proves the artifact again through GenAI's
continuous-batching pipeline (`optimum-cli shared-graph validate`) and prints what was checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main(workdir: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_shared_graph.testing import build_tiny_model

    model_dir, out = workdir / "tiny-llama", workdir / "tiny-llama-ov"
    print(f"1. building a random-init llama model in {model_dir}")
    build_tiny_model("llama", model_dir, hidden_size=128, intermediate_size=256, num_hidden_layers=4)

    print(f"2. optimum-cli export openvino --task text-generation-shared -> {out}")
    cli = Path(sys.executable).parent / "optimum-cli"
    cmd = [str(cli) if cli.exists() else "optimum-cli", "export", "openvino", "-m", str(model_dir),
           "--task", "text-generation-shared", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    print("   " + proc.stderr.strip().splitlines()[-1])

    manifest = json.loads((out / "shared_graph.json").read_text())
    graphs = [p.name for p in out.glob("openvino_*.xml") if "tokenizer" not in p.name]
    logits = next(o["shape"] for o in manifest["graph"]["outputs"] if o["name"] == "logits")
    v = manifest["validation"]
    print(f"3. the artifact: {graphs} ({manifest['partitioning']}), logits {logits}, "
          f"validation {v['status']}: {v['greedy_tokens']} greedy tokens identical={v['greedy_match']}, "
          f"max |logits diff| prefill {v['max_abs_diff_prefill']:.1e} / decode {v['max_abs_diff_decode']:.1e}")

    from optimum.intel import OVModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = ["The quick brown fox", "OpenVINO runs one decoder graph for the prompt and"]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    exact = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=exact)
    pt_model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    ours, ref = ov_model.generate(**enc, **gen), pt_model.generate(**enc, **gen)
    same = torch.equal(ours, ref)
    print(f"4. OVModelForCausalLM, left-padded batch of {len(prompts)}: greedy tokens identical to PyTorch: {same}")

    import openvino_genai

    pipe = openvino_genai.LLMPipeline(str(out), "CPU")
    text = pipe.generate(prompts[0], max_new_tokens=16)
    print(f"5. OpenVINO GenAI LLMPipeline loads it and generates: {text!r} (random weights: gibberish is expected)")

    # the proof where it is deployed: the calls the export checked, stored in the artifact, run through the consumer
    # and device it is served with (here GenAI's continuous-batching pipeline on the CPU; docs/deploy.md has the rest)
    check = [str(cli) if cli.exists() else "optimum-cli", "shared-graph", "validate", str(out),
             "--consumer", "continuous-batching"]
    proof = subprocess.run(check, capture_output=True, text=True)
    print("6. optimum-cli shared-graph validate OUT --consumer continuous-batching:\n   "
          + ((proof.stdout if proof.returncode == 0 else proof.stderr).strip().splitlines() or ["(no output)"])[-1])
    return 0 if same and v["status"] == "passed" and proof.returncode == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(tmp)))
