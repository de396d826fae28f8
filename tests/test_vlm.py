"""`--task image-text-to-text-shared` (`pipeline/vlm.py`): the whole Qwen3.5, Gemma 3, LLaVA, Mistral 3, Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, Gemma 4, LLaVA-NeXT or LLaVA-NeXT-Video model in optimum-intel's VLM layout.

The checkpoints are laid out like the published ones, with their processor (`testing.build_tiny_multimodal(...,
processor=True)`: image processor, tokenizer with the image tokens, chat template), so a real image (a small
generated PIL image) and a text prompt go through PyTorch, OpenVINO GenAI's `VLMPipeline` and optimum-intel's
`OVModelForVisualCausalLM`. Greedy tokens are compared under f32 properties with EOS disabled on both sides.

optimum-intel 2.2's `_OVQwen3_5ForCausalLM.generate()` cannot run under transformers 5.5 (its
`prepare_inputs_for_generation` indexes a `cache_position` 5.5's `generate()` no longer passes, and its position
ids call 5.5's `get_rope_index` without the `mm_token_type_ids` it now requires), so the OVModelForVisualCausalLM
check drives the loaded model's own `forward()` greedily, with the (4, batch, seq) positions PyTorch starts from.
For the other types its `generate()` runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import EXACT, at_once, break_decode, edited_copy, run_cli, run_cli_in_process, stored_experts_mapped

from optimum_shared_graph import ArtifactValidationError, read_manifest

NEW_TOKENS = 12
# A random-init model's greedy tokens follow its last input token more than anything before it, and every prompt
# ends with the chat template's assistant turn: on these prompts the two images below give PyTorch greedy tokens
# that differ (from the first token, for every type), so each consumer's tokens show it ran the image, not only the
# text (checked in each test). For Gemma 3 the prompt is also one where the image's bidirectional attention decides
# some tokens: PyTorch without `token_type_ids` (a causal mask over the image) gives other tokens (checked too).
PROMPTS = {"qwen3_5": "hello", "qwen3_5_moe": "hello", "gemma3": "What is in the image?", "llava": "hello",
           "mistral3": "hello", "qwen2_vl": "hello", "qwen2_5_vl": "hello", "qwen3_vl": "hello",
           "gemma4": "hello", "llava_next": "hello", "llava_next_video": "hello"}
# The images' size: 64 x 64 (Qwen3.5: 4 x 4 patches of 16; the others resize it to their tower's size), but 56 x 56
# for Qwen2-VL and Qwen2.5-VL, which their processor does not resize (4 x 4 patches of 14): their VLMPipeline resizes
# a 64 x 64 image to 56 x 56 with its own bicubic filter, whose pixels differ from the processor's enough that the
# noise image gave other tokens than PyTorch's (the white one the same); at 56 x 56 both match.
IMAGE_SIZE = {"qwen2_vl": 56, "qwen2_5_vl": 56}
IMAGES = ("noise", "white")
# optimum-intel's image-text-to-text layout of each type (what OVModelForVisualCausalLM and VLMPipeline load), and
# its language model's inputs
_QWEN_GRAPHS = ["openvino_language_model.xml", "openvino_text_embeddings_model.xml",
                "openvino_vision_embeddings_merger_model.xml", "openvino_vision_embeddings_model.xml",
                "openvino_vision_embeddings_pos_model.xml"]
_QWEN_INPUTS = {"attention_mask": "[?,?]", "beam_idx": "[?]", "inputs_embeds": "[?,?,64]", "position_ids": "[4,?,?]"}
_PROJECTED_GRAPHS = ["openvino_language_model.xml", "openvino_text_embeddings_model.xml",
                     "openvino_vision_embeddings_model.xml"]
_PLAIN_INPUTS = {"attention_mask": "[?,?]", "beam_idx": "[?]", "inputs_embeds": "[?,?,64]", "position_ids": "[?,?]"}
_QWEN2_GRAPHS = [g for g in _QWEN_GRAPHS if "pos_model" not in g]
GRAPHS = {"qwen3_5": _QWEN_GRAPHS, "qwen3_5_moe": _QWEN_GRAPHS, "gemma3": _PROJECTED_GRAPHS,
          "llava": _PROJECTED_GRAPHS, "mistral3": sorted(_PROJECTED_GRAPHS + ["openvino_multi_modal_projector_model.xml"]),
          "qwen2_vl": _QWEN2_GRAPHS, "qwen2_5_vl": _QWEN2_GRAPHS, "qwen3_vl": _QWEN_GRAPHS, "llava_next": _PROJECTED_GRAPHS,
          "llava_next_video": sorted(_PROJECTED_GRAPHS + ["openvino_multi_modal_projector_model.xml",
                                                          "openvino_vision_resampler_model.xml"]),
          "gemma4": sorted(_PROJECTED_GRAPHS + ["openvino_text_embeddings_per_layer_model.xml"])}
LANGUAGE_INPUTS = {"qwen3_5": _QWEN_INPUTS, "qwen3_5_moe": _QWEN_INPUTS,
                   "gemma3": {**_PLAIN_INPUTS, "token_type_ids": "[?,?]"}, "llava": _PLAIN_INPUTS,
                   "mistral3": _PLAIN_INPUTS, "qwen2_vl": {**_QWEN_INPUTS, "position_ids": "[3,?,?]"},
                   "qwen2_5_vl": {**_QWEN_INPUTS, "position_ids": "[3,?,?]"},
                   "qwen3_vl": {**_QWEN_INPUTS, "position_ids": "[3,?,?]", "visual_pos_masks": "[?,?]",
                                "deepstack_visual_embeds": "[?,?,64]"},
                   "gemma4": {**_PLAIN_INPUTS, "per_layer_inputs": "[?,?,?,16]"}, "llava_next": _PLAIN_INPUTS,
                   "llava_next_video": _PLAIN_INPUTS}
FIXES = {"qwen3_5": "optimum_shared_graph.architectures.qwen3_5", "qwen3_5_moe": "optimum_shared_graph.architectures.qwen3_5",
         "gemma3": None, "llava": None, "mistral3": None, "qwen2_vl": "optimum_shared_graph.architectures.qwen2_vl",
         "qwen2_5_vl": "optimum_shared_graph.architectures.qwen2_vl", "qwen3_vl": "optimum_shared_graph.architectures.qwen2_vl",
         "gemma4": "optimum_shared_graph.architectures.gemma4", "llava_next": None,
         "llava_next_video": "optimum_shared_graph.architectures.llava_next_video"}
# the types of the parametrised tests (all that --task image-text-to-text-shared exports)
VLM_TYPES = ["qwen3_5", "qwen3_5_moe", "gemma3", "llava", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma4",
             "llava_next", "llava_next_video"]
IMAGE_TOKENS = {"qwen3_5": 4, "qwen3_5_moe": 4, "gemma3": 4, "llava": 16, "mistral3": 4, "qwen2_vl": 4, "qwen2_5_vl": 4,
                "qwen3_vl": 4, "gemma4": 64, "llava_next": 24, "llava_next_video": 24}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """`vlm("qwen3_5")` -> (checkpoint, artifact): a tiny checkpoint with its processor, exported once by the CLI."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    built = {}

    def get(model_type: str, **text_overrides):
        key = (model_type, *sorted(text_overrides.items()))
        if key not in built:
            root = tmp_path_factory.mktemp("vlm")
            build_tiny_multimodal(model_type, root / model_type, processor=True, **text_overrides)
            out = root / "out"
            proc = run_cli("export", "openvino", "-m", str(root / model_type), "--task", "image-text-to-text-shared",
                           str(out))
            assert proc.returncode == 0, proc.stderr[-3000:]
            built[key] = (root / model_type, out, proc)
        return built[key]

    return get


def _image(kind: str, size: int = 64):
    """A `size` x `size` image: random pixels, or all white."""
    from PIL import Image

    if kind == "white":
        return Image.new("RGB", (size, size), (255, 255, 255))
    return Image.fromarray((np.random.RandomState(0).rand(size, size, 3) * 255).astype("uint8"))


def _pytorch(path, model_type):
    """The model, and per image: the processor's inputs, PyTorch's greedy new tokens and its prefill's last logits."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(path)
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPTS[model_type]}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    runs, causal = {}, {}
    generate = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    for kind in IMAGES:
        enc = processor(images=_image(kind, IMAGE_SIZE.get(model_type, 64)), text=text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, **generate, output_logits=True, return_dict_in_generate=True)
            if "token_type_ids" in enc:  # Gemma 3: without them, the image is attended causally
                causal[kind] = model.generate(**{k: v for k, v in enc.items() if k != "token_type_ids"}, **generate)
        runs[kind] = (enc, out.sequences[0, enc["input_ids"].shape[1]:].tolist(), out.logits[0][0].numpy())
    assert runs["noise"][1] != runs["white"][1]  # the image decides some tokens: each consumer must have run it
    if model_type == "gemma3":  # and the bidirectional attention within the image decides some: it must run too
        assert any(causal[k][0, runs[k][0]["input_ids"].shape[1]:].tolist() != runs[k][1] for k in IMAGES)
    return model, runs


def _genai_tokens(out, kind: str, prompt: str, size: int) -> list[int]:
    import openvino as ov
    import openvino_genai as ov_genai

    class Tokens(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.tokens = []

        def write(self, token):
            self.tokens.extend(token if isinstance(token, list) else [token])
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    # the default attention backend (PagedAttention); GenAI's SDPA backend steps Gemma 3's decode positions one back
    # (docs/multimodal.md), with optimum-intel's own export as with this one
    pipe = ov_genai.VLMPipeline(str(out), "CPU", **EXACT)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    streamer = Tokens()
    pipe.generate(prompt, images=[ov.Tensor(np.array(_image(kind, size)))], generation_config=config, streamer=streamer)
    return streamer.tokens


def _optimum_tokens(ov_model, enc, model) -> tuple[list[int], np.ndarray]:
    """OVModelForVisualCausalLM's own forward(), greedy (see the module docstring for why not its generate()): the
    tokens, and the prefill's last logits."""
    vision, deltas = model.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"],
                                                image_grid_thw=enc["image_grid_thw"],
                                                attention_mask=enc["attention_mask"])
    positions = torch.cat([(enc["attention_mask"].cumsum(-1) - 1)[None], vision], 0)
    mask, prompt = enc["attention_mask"], enc["input_ids"].shape[1]
    result = ov_model(input_ids=enc["input_ids"], pixel_values=enc["pixel_values"], attention_mask=mask,
                      position_ids=positions, image_grid_thw=enc["image_grid_thw"])
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])

    def pick(logits):  # greedy, EOS suppressed as PyTorch's min_new_tokens does
        logits = logits.clone()
        logits[eos] = -float("inf")
        return int(logits.argmax())

    prefill = result.logits[0, -1].numpy().copy()
    tokens = [pick(result.logits[0, -1])]
    for step in range(1, NEW_TOKENS):
        mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
        text = prompt + step - 1
        positions = torch.tensor([text] + [text + int(deltas[0, 0])] * 3).view(4, 1, 1)
        result = ov_model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=result.past_key_values,
                          attention_mask=mask, position_ids=positions)
        tokens.append(pick(result.logits[0, -1]))
    return tokens, prefill


def _optimum_generate(ov_model, enc) -> tuple[list[int], np.ndarray]:
    """OVModelForVisualCausalLM's generate() (EOS suppressed by min_new_tokens): the tokens, the prefill's last logits
    (from generate(), which computes the positions: forward() alone does not for M-RoPE)."""
    prompt = enc["input_ids"].shape[1]
    out = ov_model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                            pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, prompt:].tolist(), out.logits[0][0].numpy().copy()


def _check_artifact(path, out, proc, model_type):
    import openvino as ov

    said = proc.stderr.strip().splitlines()[-1]
    assert said.startswith(f"image-text-to-text-shared: wrote {out} (shared; dynamic, logits=last, stateful=True); "
                           "validation: passed (greedy"), said
    graphs = sorted(p.name for p in out.glob("openvino_*.xml") if "tokenizer" not in p.name)
    assert graphs == GRAPHS[model_type]
    assert (out / "openvino_tokenizer.xml").is_file() and (out / "openvino_detokenizer.xml").is_file()
    manifest = read_manifest(out)
    source = json.loads((path / "config.json").read_text())
    assert manifest.task == "image-text-to-text-shared" and manifest.partitioning == "shared"
    assert manifest.model["model_type"] == source["model_type"]
    assert [fix["fix"] for fix in manifest.model.get("fixes", [])] == ([FIXES[model_type]] if FIXES[model_type] else [])
    assert manifest.graph["files"][0] == manifest.graph["language_model"] == "openvino_language_model.xml"
    validation = manifest.validation
    assert validation["status"] == "passed" and validation["greedy_match"], validation
    assert validation["vision"]["image_tokens"] == IMAGE_TOKENS[model_type]
    assert validation["vision"]["max_abs_diff_image_embeds"] < 1e-4
    # the language model: one stateful graph fed inputs_embeds (and Qwen3.5's (4, batch, seq) positions, Gemma 3's
    # token types), last-position logits
    language = ov.Core().read_model(out / "openvino_language_model.xml")
    inputs = {p.get_any_name(): str(p.get_partial_shape()) for p in language.inputs}
    assert inputs == LANGUAGE_INPUTS[model_type]
    assert [p.get_any_name() for p in language.outputs] == ["logits"]
    text = source.get("text_config", source)  # Qwen2-VL and Qwen2.5-VL are published flat
    assert str(language.outputs[0].get_partial_shape()) == f"[?,1,{text['vocab_size']}]"
    assert language.get_sinks()  # its states inside the graph
    # weights stored once: the graphs hold no more than the checkpoint's float32 weights, and a head tied to the
    # embeddings (Gemma 3) once more: optimum-intel's layout has the table in the text embeddings graph and the head
    # in the language model
    checkpoint = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    tied = source.get("tie_word_embeddings", False)
    checkpoint += 4 * text["vocab_size"] * text["hidden_size"] if tied else 0
    assert sum(p.stat().st_size for p in out.glob("openvino_*model.bin")) <= 1.02 * checkpoint


@pytest.mark.slow  # about 55 s each (an export through optimum-cli, PyTorch, VLMPipeline)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", VLM_TYPES)
def test_image_prompt_greedy_parity_through_genai(model_type, vlm):
    """The export, its layout and manifest, and VLMPipeline's greedy tokens on an image and a text prompt (Mistral 3:
    GenAI 2026.4 has no VLMPipeline for the type, which it says on load, as for optimum-intel's own export)."""
    import openvino_genai as ov_genai

    path, out, proc = vlm(model_type)
    _check_artifact(path, out, proc, model_type)
    if model_type == "mistral3":
        with pytest.raises(RuntimeError, match="Unsupported 'mistral3' VLM model type"):
            ov_genai.VLMPipeline(str(out), "CPU")
        return
    _model, runs = _pytorch(path, model_type)
    for kind, (_enc, reference, _logits) in runs.items():
        assert _genai_tokens(out, kind, PROMPTS[model_type], IMAGE_SIZE.get(model_type, 64)) == reference, kind


@pytest.mark.slow  # the export of the test above (shared by the module's fixture), then about 5 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", VLM_TYPES)
def test_image_prompt_greedy_parity_through_optimum(model_type, vlm, runtime_providers_declared):
    """OVModelForVisualCausalLM (its generate(); Qwen3.5's forward() stepped greedily, its generate() does not run)
    and optimum_shared_graph.runtime()'s generate() (Qwen3.5's included) give PyTorch's greedy tokens and prefill
    logits on both images."""
    from optimum.intel import OVModelForVisualCausalLM

    import optimum_shared_graph as osg

    path, out, _proc = vlm(model_type)
    model, runs = _pytorch(path, model_type)
    ov_model = OVModelForVisualCausalLM.from_pretrained(out, ov_config=EXACT)
    shared = osg.runtime(out, ov_config=EXACT)
    for kind, (enc, reference, logits) in runs.items():
        if model_type.startswith("qwen3_5"):
            tokens, prefill = _optimum_tokens(ov_model, enc, model)
        else:
            tokens, prefill = _optimum_generate(ov_model, enc)
        assert tokens == reference, kind
        assert np.max(np.abs(prefill - logits)) < 1e-4, kind
        tokens, prefill = _optimum_generate(shared, enc)
        assert tokens == reference, (kind, "runtime()")
        assert np.max(np.abs(prefill - logits)) < 1e-4, (kind, "runtime()")


@pytest.mark.slow  # the export of the tests above (the module's fixture), then PyTorch and about 15 s
@pytest.mark.timeout(900)
def test_runtime_gives_pytorchs_greedy_tokens_from_several_threads(vlm, runtime_providers_declared):
    """`optimum_shared_graph.runtime(OUT)` of a Qwen3.5-MoE artifact: its `generate(**processor(images=...,
    text=...))` gives PyTorch's greedy tokens on two images that give different ones (f32 properties), with
    Qwen3.5's generation fix applied by the provider (plain `OVModelForVisualCausalLM.generate()` fails on the same
    inputs); and from 4 threads at once on the one loaded model (two per image), each thread its own tokens."""
    from optimum.intel import OVModelForVisualCausalLM

    import optimum_shared_graph as osg

    path, out, _proc = vlm("qwen3_5_moe")
    _model, runs = _pytorch(path, "qwen3_5_moe")  # asserts the two images give PyTorch different tokens
    generate = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    plain = OVModelForVisualCausalLM.from_pretrained(str(out), ov_config=EXACT)
    # optimum-intel 2.2 under transformers 5.5: it refuses the processor's mm_token_type_ids, and without them its
    # position preparation calls get_rope_index without them
    with pytest.raises(ValueError, match="model_kwargs` are not used by the model: \\['mm_token_type_ids'\\]"):
        plain.generate(**runs["noise"][0], **generate)
    with pytest.raises(TypeError, match="get_rope_index\\(\\) missing 1 required positional argument: 'mm_token_type_ids'"):
        plain.generate(**{k: v for k, v in runs["noise"][0].items() if k != "mm_token_type_ids"}, **generate)
    del plain

    model = osg.runtime(out, ov_config=EXACT)
    assert isinstance(model.model, OVModelForVisualCausalLM)

    def tokens(kind):
        enc = runs[kind][0]
        return model.generate(**enc, **generate)[0, enc["input_ids"].shape[1]:].tolist()

    for kind in IMAGES:
        assert tokens(kind) == runs[kind][1], kind
    kinds = [IMAGES[i % 2] for i in range(4)]
    results = at_once([lambda kind=kind: tokens(kind) for kind in kinds])
    assert results == [runs[kind][1] for kind in kinds], results


@pytest.mark.slow  # the export of the tests above (the module's fixture), then about 10 s
@pytest.mark.timeout(900)
def test_llava_next_on_an_image_wider_than_tall(vlm):
    """A 64 x 32 image (best pinpoint 32 x 64: a grid of 1 x 2 crops): VLMPipeline gives PyTorch's greedy tokens;
    optimum-intel 2.2's OVModelForVisualCausalLM does not run it, as on its own export: its `pack_image_features`
    (copied from transformers) takes `get_anyres_image_grid_shape`'s (height, width) as (width, height), so it
    lays the crops out 2 x 1 and unpads them to other rows than the processor counted image tokens for. A square
    grid is the same either way, which is why the export's check and the tests above use square images."""
    from PIL import Image
    from optimum.intel import OVModelForVisualCausalLM
    from transformers import AutoModelForImageTextToText, AutoProcessor

    import openvino as ov
    import openvino_genai as ov_genai

    path, out, _proc = vlm("llava_next")
    processor = AutoProcessor.from_pretrained(path)
    image = Image.fromarray((np.random.RandomState(0).rand(32, 64, 3) * 255).astype("uint8"))
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "hello"}]}],
                                         add_generation_prompt=True)
    enc = processor(images=image, text=text, return_tensors="pt")
    assert enc["pixel_values"].shape[1] == 3 and enc["image_sizes"].tolist() == [[32, 64]]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    generate = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        reference = model.generate(**enc, **generate)[0, enc["input_ids"].shape[1]:].tolist()
    pipe = ov_genai.VLMPipeline(str(out), "CPU", **EXACT)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = []

    class Tokens(ov_genai.StreamerBase):
        def write(self, token):
            tokens.extend(token if isinstance(token, list) else [token])
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    pipe.generate("hello", images=[ov.Tensor(np.array(image))], generation_config=config, streamer=Tokens())
    assert tokens == reference
    ov_model = OVModelForVisualCausalLM.from_pretrained(out, ov_config=EXACT)
    with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
        ov_model.generate(**enc, **generate)


@pytest.mark.parametrize("model_type, why", [
    ("smolvlm", "optimum-intel's SmolVLMOpenVINOConfig caps transformers at 4.57.6 (5.5.4 is installed), and its "
                "OVModelForVisualCausalLM class inherits idefics3's vision patch positions, which are not transformers "
                "5.5.4's (the export's check refused idefics3 for them); not tried"),
    ("qwen3_5_text", "a text model type (the language model of a vision-language type), not a vision-language "
                     "checkpoint: --task text-generation-shared"),
    ("llama", "optimum-intel's OVModelForVisualCausalLM has no class for it (not a vision-language type of its "
              "image-text-to-text export)")], ids=["smolvlm", "qwen3_5_text", "llama"])
def test_type_it_cannot_export_is_refused_before_any_work(model_type, why, tmp_path, capsys):
    """A type with no image-text-to-text-shared export: one line at stage 1 saying why (`architectures._vlm_families.NOT_EXPORTED`)
    and which types it exports, nothing written (optimum-cli's entry point run in this process: no fresh
    interpreter's imports)."""
    from transformers import AutoConfig

    from optimum_shared_graph.architectures import supported_vlm_types

    model = tmp_path / model_type
    AutoConfig.for_model(model_type).save_pretrained(str(model))
    out = tmp_path / "out"
    with pytest.raises(AssertionError, match="exited with 2"):
        run_cli_in_process("export", "openvino", "-m", str(model), "--task", "image-text-to-text-shared", str(out))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1
    assert f"{model_type} is not a model type --task image-text-to-text-shared exports: {why} (it exports " \
        f"{', '.join(supported_vlm_types())})" in lines[0], lines[0]
    assert "gemma4" in supported_vlm_types() and "qwen3_vl" in supported_vlm_types()
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize("model_type,side", [("qwen2_5_vl", 84), ("qwen3_5", 64), ("gemma3", 64)])
def test_the_stored_image_is_one_the_processor_takes_as_it_is(model_type, side, tmp_path):
    """validate()'s image is not resized by a processor that cuts images into merged patches (a resize is done by
    GenAI's own code with other filters: Qwen2.5-VL's first token differed through VLMPipeline at 64 x 64)."""
    from PIL import Image

    from optimum_shared_graph.proof.vlm import image_side, validation_image
    from optimum_shared_graph.testing import build_vlm_processor

    processor = build_vlm_processor(model_type, tmp_path)
    assert image_side(processor) == side
    image = validation_image(side=side)
    assert image.shape == (side, side, 3) and np.array_equal(validation_image(side=side), image)
    if side != 64:  # the patch grid is the image's own: nothing resized
        patch = processor.image_processor.patch_size
        grid = processor.image_processor(images=Image.fromarray(image), return_tensors="pt")["image_grid_thw"]
        assert grid.tolist() == [[1, side // patch, side // patch]]


def test_mrope_is_transformers_interleaved_mrope():
    """The M-RoPE the language model is traced with (`architectures/qwen3_5.py`) gives transformers' cos and sin,
    with temporal, height and width positions that differ (image tokens), as the release's sections interleave them,
    and as transformers' slicing clips sections wider than the rotary frequencies (its default [11, 11, 10] on 8)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from optimum_shared_graph.architectures.qwen3_5 import _mrope, _mrope_selection
    from optimum_shared_graph.testing import tiny_config

    # the tiny model's, the release's, and the release's sections wider than the frequencies (2 of head_dim 16, 8 of
    # head_dim 64, at the tiny config's partial rotary factor 0.25)
    for section, head_dim in (([1, 1, 0], 16), ([11, 11, 10], 256), ([11, 11, 10], 16), ([11, 11, 10], 64)):
        config = tiny_config("qwen3_5_text", head_dim=head_dim)
        config.rope_parameters = dict(config.rope_parameters, mrope_section=section)
        rotary = Qwen3_5TextRotaryEmbedding(config)
        positions = torch.randint(0, 300, (3, 2, 7))
        x = torch.zeros(1, dtype=torch.float32)
        expected = rotary(x, positions)
        got = _mrope(rotary, _mrope_selection(rotary), x, positions)
        for e, g in zip(expected, got):
            assert torch.equal(e, g), section


@pytest.mark.slow  # an export through optimum-cli (about 40 s)
@pytest.mark.timeout(900)
def test_mrope_sections_wider_than_the_rotary_export_and_validate(tmp_path):
    """A Qwen3.5-MoE checkpoint with transformers' default M-RoPE sections [11, 11, 10] over a rotary of 8
    frequencies (PyTorch runs it: its slicing clips each section to the frequencies) exports through optimum-cli and
    validates against PyTorch on its image and prompt (it stopped at an IndexError in `_mrope_selection`)."""
    from transformers import AutoConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTextRotaryEmbedding

    from optimum_shared_graph.testing import VLM_PROCESSORS, build_tiny_multimodal

    rope = dict(VLM_PROCESSORS["qwen3_5_moe"]["text"]["rope_parameters"], mrope_section=[11, 11, 10])
    path, out = tmp_path / "wide", tmp_path / "out"
    build_tiny_multimodal("qwen3_5_moe", path, processor=True, rope_parameters=rope)
    text = AutoConfig.from_pretrained(path).text_config
    assert text.rope_parameters["mrope_section"] == [11, 11, 10]
    assert Qwen3_5MoeTextRotaryEmbedding(text).inv_freq.shape[0] == 8 < 3 * 10  # every section wider than clipped
    proc = run_cli("export", "openvino", "-m", str(path), "--task", "image-text-to-text-shared", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    said = proc.stderr.strip().splitlines()[-1]
    assert said.startswith(f"image-text-to-text-shared: wrote {out} (shared; dynamic, logits=last, stateful=True); "
                           "validation: passed (greedy"), said
    validation = read_manifest(out).validation
    assert validation["status"] == "passed" and validation["greedy_match"], validation
    assert validation["vision"]["image_tokens"] == IMAGE_TOKENS["qwen3_5_moe"]


def test_registered_and_fix_swapped_in_for_one_export():
    """`image-text-to-text-shared` sits beside optimum-intel's `image-text-to-text` in TasksManager; the fixed
    config stands in for optimum-intel's only inside `architectures.vlm_fix_applied`, its language part with the 5.5 patcher."""
    from optimum.exporters.tasks import TasksManager

    from optimum_shared_graph.architectures import vlm_fix_applied
    from optimum_shared_graph.registration import register_tasks
    from optimum_shared_graph.testing import tiny_multimodal_config

    register_tasks()
    for model_type in ("qwen3_5", "qwen3_5_moe"):
        entries = TasksManager._SUPPORTED_MODEL_TYPE[model_type]["openvino"]
        assert "image-text-to-text-shared" in entries
        original = entries["image-text-to-text"]
        with vlm_fix_applied(model_type) as fix:
            assert fix.module == "optimum_shared_graph.architectures.qwen3_5"
            config = entries["image-text-to-text"](tiny_multimodal_config(model_type))
            assert config.MAX_TRANSFORMERS_VERSION is None
            assert config.with_behavior("language").patcher_cls.__name__ == "Qwen3_5LanguagePatcher"
        assert entries["image-text-to-text"] is original


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_vision_merger_traced_on_a_small_dummy_image(model_type):
    """The vision merger (the tower's blocks and merger) traced on 4 x 4 merged patches per dummy frame
    (optimum-intel's batch of 2 frames), not optimum-intel's 420 x 420 (`architectures._qwen_vision`); the other parts'
    dummies unchanged, and outside `vlm_fix_applied` optimum-intel's own."""
    from optimum.exporters.tasks import TasksManager

    from optimum_shared_graph.architectures import vlm_fix_applied
    from optimum_shared_graph.registration import register_tasks
    from optimum_shared_graph.testing import tiny_multimodal_config

    register_tasks()
    config_of = TasksManager._SUPPORTED_MODEL_TYPE[model_type]["openvino"]["image-text-to-text"]
    tiny = tiny_multimodal_config(model_type)
    vision = tiny.vision_config
    optimum_intel = config_of(tiny).with_behavior("vision_embeddings_merger").generate_dummy_inputs(batch_size=2)
    with vlm_fix_applied(model_type):
        config = TasksManager._SUPPORTED_MODEL_TYPE[model_type]["openvino"]["image-text-to-text"](tiny)
        per_side = 4 * vision.spatial_merge_size
        merger = config.with_behavior("vision_embeddings_merger").generate_dummy_inputs(framework="pt", batch_size=2)
        assert merger["hidden_states"].shape[0] == 2 * per_side ** 2
        assert merger["attention_mask"].shape[-2:] == (2 * per_side ** 2,) * 2
        assert set(merger) == set(optimum_intel)
        embeddings = config.with_behavior("vision_embeddings").generate_dummy_inputs(framework="pt", batch_size=2)
        assert embeddings["hidden_states"].shape[0] == 2 * (420 // vision.patch_size) ** 2
    assert optimum_intel["hidden_states"].shape[0] == 2 * (420 // vision.patch_size) ** 2


def test_qwen3_5_moe_experts_load_as_stored_and_fuse(vlm, tmp_path):
    """The multimodal Qwen3.5-MoE loads its experts as the checkpoint stores them (fused per layer, memory-mapped:
    `architectures.moe_experts`, active inside `vlm_fix_applied`), and its language model graph is one OpenVINO's
    CPU plugin turns into three `GatherMatmul`s per MoE layer, from the CLI's validated export."""
    import openvino as ov
    from transformers import AutoModelForImageTextToText

    from optimum_shared_graph.architectures import moe_experts, vlm_fix_applied

    path, out, _proc = vlm("qwen3_5_moe")
    with vlm_fix_applied("qwen3_5_moe", scratch=tmp_path / "scratch"):
        layers = stored_experts_mapped(lambda: AutoModelForImageTextToText.from_pretrained(path, dtype="auto"), path)
    assert not isinstance(next(m for m in AutoModelForImageTextToText.from_pretrained(path).modules()
                               if type(m).__name__ == "Qwen3_5MoeExperts" or isinstance(m, moe_experts.StoredExperts)),
                          moe_experts.StoredExperts)  # outside: transformers' own experts

    assert read_manifest(out).validation["status"] == "passed"
    compiled = ov.Core().compile_model(out / "openvino_language_model.xml", "CPU")
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
    assert kinds.count("GatherMatmul") == 3 * layers, sorted(set(kinds))


def _input_rewired(name: str, make):
    """An `edited_copy` edit: every reader of the graph input `name` reads `make(input)` instead."""
    def edit(graph):
        port = next(p for p in graph.inputs if p.get_any_name() == name)
        readers = list(port.get_target_inputs())  # before `make` adds one
        replacement = make(port.get_node().output(0))
        for target in readers:
            target.replace_source_output(replacement.output(0))
    return edit


@pytest.mark.slow  # the export of the tests above (the module's fixture), then about 5 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type, architecture", [("qwen3_5", "Qwen3_5ForConditionalGeneration"),
                                                      ("qwen2_vl", "Qwen2VLForConditionalGeneration")])
def test_validation_refuses_a_language_model_that_ignores_the_image_positions(model_type, architecture, vlm, tmp_path):
    """The export's check of the language model is decisive for the M-RoPE: the artifact's graph fed its first
    positions row on every row (Qwen3.5: the text positions; Qwen2-VL: the temporal ones, the text positions at the
    text tokens; a language model that ignores where the image's patches are, as a text-only rotary would) is
    refused against the PyTorch reference, which the unchanged graph passes."""
    import openvino.opset13 as ops
    from transformers import AutoModelForImageTextToText

    from optimum_shared_graph import ExportValidationError
    from optimum_shared_graph.pipeline.vlm import LANGUAGE_XML, capture_reference, validate_parts

    path, out, _proc = vlm(model_type)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    reference = capture_reference(model, 4)
    assert validate_parts(out, reference, None)["status"] == "passed"

    def text_positions_only(positions):  # Qwen3.5: text, temporal, height, width; Qwen2-VL: the last 3
        rows = positions.get_partial_shape()[0].get_length()
        return ops.gather(positions, ops.constant(np.zeros(rows, dtype=np.int64)), ops.constant(0))

    broken = tmp_path / "broken"
    edited_copy(out, broken, LANGUAGE_XML, _input_rewired("position_ids", text_positions_only))
    with pytest.raises(ExportValidationError, match=f"does not reproduce {architecture}"):
        validate_parts(broken, reference, None)


@pytest.mark.slow  # the export of the tests above (the module's fixture), then about 5 s
@pytest.mark.timeout(900)
def test_validation_refuses_a_gemma3_language_model_that_attends_the_image_causally(vlm, tmp_path):
    """The export's check of the language model is decisive for Gemma 3's bidirectional attention within an image:
    the artifact's graph fed token types of 0 (no image tokens: a causal mask over the image, as a language model
    without `token_type_ids` has) is refused against the PyTorch reference, which the unchanged graph passes."""
    import openvino.opset13 as ops
    from transformers import AutoModelForImageTextToText

    from optimum_shared_graph import ExportValidationError
    from optimum_shared_graph.pipeline.vlm import LANGUAGE_XML, capture_reference, validate_parts

    path, out, _proc = vlm("gemma3")
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    reference = capture_reference(model, 4)
    assert reference.inputs["token_type_ids"].sum() == model.config.mm_tokens_per_image
    assert validate_parts(out, reference, None)["status"] == "passed"

    broken = tmp_path / "broken"
    edited_copy(out, broken, LANGUAGE_XML, _input_rewired(
        "token_type_ids", lambda types: ops.multiply(types, ops.constant(np.array(0, dtype=np.int64)))))
    with pytest.raises(ExportValidationError, match="does not reproduce Gemma3ForConditionalGeneration"):
        validate_parts(broken, reference, None)


@pytest.mark.slow  # the export of the tests above (the module's fixture), then about 5 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type, name, architecture", [
    ("qwen3_vl", "deepstack_visual_embeds", "Qwen3VLForConditionalGeneration"),
    ("gemma4", "per_layer_inputs", "Gemma4ForConditionalGeneration")])
def test_validation_refuses_a_language_model_that_ignores_an_input_other_graphs_compute(model_type, name,
                                                                                        architecture, vlm, tmp_path):
    """The export's check of the language model is decisive for the inputs it is fed besides the embeddings:
    Qwen3-VL's deepstack image features (added to the image tokens' hidden states in the first layers) and Gemma 4's
    per-layer token embeddings, each computed by other OpenVINO graphs. The artifact's graph with that input
    multiplied by 0 is refused against the PyTorch reference, which the unchanged graph passes."""
    import openvino.opset13 as ops
    from transformers import AutoModelForImageTextToText

    from optimum_shared_graph import ExportValidationError
    from optimum_shared_graph.pipeline.vlm import LANGUAGE_XML, capture_reference, validate_parts

    path, out, _proc = vlm(model_type)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    reference = capture_reference(model, 4)
    report = validate_parts(out, reference, None)
    assert report["status"] == "passed" and report["vision"][f"max_abs_diff_{name}"] < 1e-5, report["vision"]

    broken = tmp_path / "broken"
    edited_copy(out, broken, LANGUAGE_XML, _input_rewired(
        name, lambda x: ops.multiply(x, ops.constant(np.array(0, dtype=np.float32)))))
    with pytest.raises(ExportValidationError, match=f"does not reproduce {architecture}"):
        validate_parts(broken, reference, None)


def _stored_reference_is_pytorchs(path, out, model_type):
    """The artifact's stored reference: PyTorch's greedy generate() on the stored image and prompt through the
    checkpoint's own processor and chat template, each call's logits (recomputed here, in float32)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from optimum_shared_graph.proof.stored import Reference
    from optimum_shared_graph.proof.vlm import PROMPT, processor_inputs, validation_image

    record = read_manifest(out).validation["reference"]
    assert record["image"] == [64, 64] and record["prompt"] == PROMPT and record["judged_against"] == "pytorch"
    assert record["bytes"] < 64_000, record  # the image, a few KB, and 8 calls' logits
    reference = Reference.load(out, record)
    assert np.array_equal(reference.image, validation_image())
    processor = AutoProcessor.from_pretrained(path)
    inputs = processor_inputs(processor, reference.image, reference.prompt)
    assert np.array_equal(inputs["input_ids"].numpy(), reference.prompt_ids)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == IMAGE_TOKENS[model_type]  # the image
    with torch.no_grad():
        out_pt = model.generate(**inputs, max_new_tokens=reference.fed.shape[1], min_new_tokens=reference.fed.shape[1],
                                do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    prompt = inputs["input_ids"].shape[1]
    assert out_pt.sequences[0, prompt:].tolist() == reference.fed[0].tolist()
    assert np.max(np.abs(np.stack([s.numpy() for s in out_pt.logits]) - reference.logits)) < 1e-5
    return reference


@pytest.mark.slow  # the export of the tests above (the module's fixture), then about 8 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "qwen3_vl", "gemma4", "llava_next",
                                        "llava_next_video"])
def test_validate_through_the_vlm_consumers(model_type, vlm, tmp_path, runtime_providers_declared):
    """`validate()` of the artifact through optimum-vlm (OVModelForVisualCausalLM.generate(), teacher-forced),
    runtime-vlm (optimum_shared_graph.runtime(), teacher-forced) and genai-vlm (VLMPipeline, greedy) under f32
    properties: exact; the same artifact with its language model's decode logits negated fails all three, naming the
    tolerance; a text-generation consumer is refused in one line."""
    import optimum_shared_graph as osg
    from optimum_shared_graph import ArtifactValidationError


    path, out, _proc = vlm(model_type)
    reference = _stored_reference_is_pytorchs(path, out, model_type)
    calls = reference.fed.shape[1]
    optimum = osg.validate(out, consumer="optimum-vlm", properties=EXACT)
    assert optimum["status"] == "passed" and optimum["rule"] == "fp32" and optimum["terms"] == []
    assert optimum["greedy_match"] and optimum["greedy_tokens"] == calls
    assert optimum["max_abs_diff_prefill"] < 1e-4 and optimum["max_abs_diff_decode"] < 1e-4, optimum
    runtime = osg.validate(out, consumer="runtime-vlm", properties=EXACT)
    assert runtime["status"] == "passed" and runtime["rule"] == "fp32" and runtime["greedy_tokens"] == calls
    assert runtime["max_abs_diff_prefill"] < 1e-4 and runtime["max_abs_diff_decode"] < 1e-4, runtime
    genai = osg.validate(out, consumer="genai-vlm", properties=EXACT)
    assert genai["status"] == "passed" and genai["rule"] == "fp32" and genai["greedy_match"]
    assert genai["compared_tokens"] == [calls] and "not_compared" not in genai, genai

    broken = break_decode(out, tmp_path / "broken", "openvino_language_model.xml")
    for consumer in ("optimum-vlm", "runtime-vlm", "genai-vlm"):
        with pytest.raises(ArtifactValidationError, match=rf"{consumer} on CPU does not reproduce PyTorch: .*"
                                                          r"(above|exceeds) the tolerance 0\.00"):
            osg.validate(broken, consumer=consumer, properties=EXACT)

    with pytest.raises(ArtifactValidationError, match=r"is an image-text-to-text-shared artifact, which consumer "
                                                      r"'genai' does not run .* 'genai-vlm' .* 'optimum-vlm' .* 'runtime-vlm'"):
        osg.validate(out, consumer="genai")


# The default properties are judged on checkpoints whose language model has the published initializer range
# (`initializer_range=0.02`, as Qwen/Qwen3.5-35B-A3B's and google/gemma-3-4b-it's configurations have it), not the
# tiny models' 0.1. At 0.1 the tiny Qwen3.5 pair is a model that 16-bit arithmetic itself changes: PyTorch's own bf16
# differs from its float32 by 0.14 on the same inputs, and through OVModelForVisualCausalLM at a bf16 CPU's defaults
# the dense model's logits differ from PyTorch's by 0.27 to 0.28 against a tolerance of 0.094 (measured on an Intel
# Xeon with AMX and on an AMD EPYC with avx512_bf16: docs/multimodal.md has the figures), the text-generation-shared
# artifact of its language model alike. At the published range the same layout stays far inside the rule.
PUBLISHED_INIT = {"initializer_range": 0.02}


@pytest.mark.slow  # an export per type (about 30 s each), then about 2 s per consumer
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "gemma3"])
def test_validate_through_the_vlm_consumers_at_the_default_properties(model_type, vlm, tmp_path):
    """Judged by the margins (the 16-bit rule), as validate() judges any consumer computing in reduced precision, at
    this CPU's default properties; a copy with the language model's decode logits negated still fails so."""
    import openvino as ov

    import optimum_shared_graph as osg

    _path, out, _proc = vlm(model_type, **PUBLISHED_INIT)
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()
    for consumer in ("optimum-vlm", "genai-vlm"):
        report = osg.validate(out, consumer=consumer)
        assert report["status"] == "passed", report
        # the 32-bit rule only where the consumer computes in f32 with an f32 KV cache: the artifact's rt_info
        # asks for an f16 KV cache (optimum-intel's), so an f32 CPU is judged by the 16-bit rule too
        precision = report["precision"]
        assert precision["inference"] == default, report
        exact = default == "f32" and precision["kv_cache"] == "f32"
        assert report["rule"] == ("fp32" if exact else "fp16"), report
    broken = break_decode(out, tmp_path / "broken", "openvino_language_model.xml")
    for consumer in ("optimum-vlm", "genai-vlm"):
        with pytest.raises(ArtifactValidationError, match=r"does not reproduce PyTorch: .*tolerance"):
            osg.validate(broken, consumer=consumer)


@pytest.mark.slow  # the export of the test above (the module's fixture), then about 5 s
@pytest.mark.timeout(900)
def test_reduced_precision_judged_by_the_margins(vlm):
    """Reduced precision forced on this CPU (`sixteen_bit()`: bf16 where it has bf16 units, else f16, else an 8-bit
    KV cache): VLMPipeline with an f32 KV cache may pick differently only at near-ties, and is then restarted from the
    reference's context (the chat-templated prompt and the decoded tokens), so every call is compared;
    OVModelForVisualCausalLM computing so stays within the 16-bit rule, rounded."""
    import optimum_shared_graph as osg
    from conftest import sixteen_bit

    _path, out, _proc = vlm("qwen3_5", **PUBLISHED_INIT)
    reduced = sixteen_bit()
    genai = osg.validate(out, consumer="genai-vlm", properties={"KV_CACHE_PRECISION": "f32", **reduced})
    assert genai["status"] == "passed" and genai["rule"] == "fp16", genai
    ties = genai["differing_steps"]
    assert all(d["near_tie"] and d["margin"] <= genai["tolerance"] for d in ties), genai
    assert genai["compared_tokens"] == [genai["greedy_tokens"]] and genai["restarts"] == [len(ties)], genai
    optimum = osg.validate(out, consumer="optimum-vlm", properties=reduced)
    assert optimum["status"] == "passed" and optimum["rule"] == "fp16", optimum
    if "INFERENCE_PRECISION_HINT" in reduced:
        assert optimum["precision"]["inference"] == reduced["INFERENCE_PRECISION_HINT"], optimum
    # rounded, and within the rule: 16-bit compute rounds the prefill; an 8-bit KV cache only what reads it back
    rounded = "max_abs_diff_prefill" if "INFERENCE_PRECISION_HINT" in reduced else "max_abs_diff_decode"
    assert 1e-5 < optimum[rounded] < optimum["tolerance"], optimum


@pytest.mark.slow  # the checkpoint of the module's fixture, then an export (about 30 s)
@pytest.mark.timeout(900)
def test_a_checkpoint_without_its_image_processor_stores_no_reference(vlm, tmp_path):
    """The export still passes (its own check needs no processor); validate() says in one line why there is nothing
    to run and how to get it."""
    import shutil

    import optimum_shared_graph as osg

    path, _out, _proc = vlm("qwen3_5")
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        (bare / name).unlink()
    out = tmp_path / "out"
    run_cli_in_process("export", "openvino", "-m", str(bare), "--task", "image-text-to-text-shared", str(out))
    validation = read_manifest(out).validation
    assert validation["status"] == "passed" and "reference" not in validation
    assert validation["reference_missing"].startswith("the checkpoint's processor did not load (OSError: ")
    assert not (out / "shared_graph_reference.npz").exists()
    with pytest.raises(ArtifactValidationError, match=r"has no stored reference to validate against: the checkpoint's "
                                                      r"processor did not load .* re-export from the checkpoint "
                                                      r"directory with its processor files"):
        osg.validate(out, consumer="genai-vlm")


@pytest.mark.slow  # the checkpoint of the module's fixture, then an export (about 70 s)
@pytest.mark.timeout(900)
def test_compressed_weights_store_the_exported_models_own_logits(vlm, tmp_path):
    """`--weight-format int8`: the export records the language model's difference from PyTorch (not judged) and
    stores the exported model's own logits on the reference's inputs (OVModelForVisualCausalLM in f32 on this CPU,
    with its default int8 activations, whose group size is recorded): validate() under the same properties gives
    them back exactly, through both consumers; a copy with its decode logits negated fails."""
    import optimum_shared_graph as osg

    from conftest import break_decode

    path, _out, _proc = vlm("qwen3_5")
    out = tmp_path / "int8"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "image-text-to-text-shared",
                       "--weight-format", "int8", str(out))
    validation = read_manifest(out).validation
    assert validation["status"] == "recorded" and not validation["enforced"]
    assert validation["reference"]["judged_against"] == "graph"
    assert validation["compile_config"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] > 0
    optimum = osg.validate(out, consumer="optimum-vlm", properties=EXACT)
    assert optimum["status"] == "passed" and optimum["judged_against"] == "graph" and optimum["terms"] == []
    assert optimum["max_abs_diff_prefill"] < 1e-5 and optimum["max_abs_diff_decode"] < 1e-5, optimum
    genai = osg.validate(out, consumer="genai-vlm", properties=EXACT)
    assert genai["status"] == "passed" and genai["greedy_match"], genai
    broken = break_decode(out, tmp_path / "broken", "openvino_language_model.xml")
    with pytest.raises(ArtifactValidationError, match="optimum-vlm on CPU does not reproduce the exported graph "
                                                      "on the export machine: .*tolerance"):
        osg.validate(broken, consumer="optimum-vlm", properties=EXACT)
