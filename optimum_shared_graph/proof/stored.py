"""The reference an export validated against, stored in the artifact: `shared_graph_reference.npz`.

What it holds (numpy arrays, no pickled objects, no weights):

- `prompt_ids`, `prompt_mask` (`[batch, prompt]`): the prompt of the captured `generate()`;
- `fed` (`[batch, calls]`): the token `generate()` picked after each call, fed to the next one;
- `logits` (`[calls, batch, vocab]`, float32): the reference's last-position logits of each call. For fp32 and
  fp16 weights they are PyTorch's (the export's judge); for quantized weights, whose difference from PyTorch is
  the quantization's (recorded in the manifest at export), they are the exported graph's own, computed on the
  export machine's CPU in f32 (with the CPU plugin's default int8 quantization of the quantized matmuls'
  activations, whose group size the manifest's `validation.compile_config` records): a deployed check then asks
  "does this device compute what the export computed";
- for an image-text-to-text-shared artifact also `image` (`[height, width, 3]`, uint8) and `prompt` (the user's text):
  what the checkpoint's processor turned into `prompt_ids` through its chat template (`proof/vlm.py`); the
  logits are PyTorch's, of the whole model's greedy `generate()` on them.

The manifest records under `validation.reference` the file name, its sha256, its size and how it is judged;
`validate()` refuses a file whose sha256 differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ArtifactValidationError
from ..manifest import sha256_file

REFERENCE_NAME = "shared_graph_reference.npz"


def teacher_forced(prompt_ids, prompt_mask, fed, calls: int):
    """The (input_ids, attention_mask) of each of `calls` calls: the prompt, then the fed tokens one at a time
    (the mask None: the consumer extends it). Over a capture (the export) and a stored reference (`validate`)."""
    yield prompt_ids, prompt_mask
    for i in range(calls - 1):
        yield fed[:, i : i + 1], None


@dataclass
class Reference:
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    fed: np.ndarray
    logits: np.ndarray  # [calls, batch, vocab]
    judged_against: str = "pytorch"  # or "graph"
    image: np.ndarray | None = None  # [height, width, 3] uint8: an image-text reference's image
    prompt: str | None = None  # an image-text reference's user text (the processor's chat template around it)

    @property
    def calls(self) -> list[np.ndarray]:
        return list(self.logits)

    def teacher_forced(self):
        """Each stored call's (input_ids, attention_mask): see `teacher_forced`."""
        return teacher_forced(self.prompt_ids, self.prompt_mask, self.fed, self.fed.shape[1])

    @classmethod
    def from_capture(cls, capture, graph_logits: list[np.ndarray] | None = None) -> "Reference":
        """The reference of a captured `generate()`; `graph_logits` (each call's, from the exported graph) make
        the judge the graph's own logits, for quantized weights."""
        pytorch = None if graph_logits is not None else np.stack([c.last_logits.astype(np.float32) for c in capture.calls])
        fed = np.asarray(capture.tokens[:, : len(capture.calls)], dtype=np.int64)
        common = dict(prompt_ids=np.asarray(capture.prompt_ids, np.int64), prompt_mask=np.asarray(capture.prompt_mask, np.int64),
                      fed=fed)
        if graph_logits is None:
            return cls(**common, logits=pytorch)
        return cls(**common, logits=np.stack([g.astype(np.float32) for g in graph_logits]), judged_against="graph")

    def save(self, directory: Path) -> dict:
        """Write the reference into `directory`; return what the manifest records of it."""
        target = Path(directory) / REFERENCE_NAME
        arrays = {"prompt_ids": self.prompt_ids, "prompt_mask": self.prompt_mask, "fed": self.fed, "logits": self.logits}
        if self.image is not None:
            arrays.update(image=np.asarray(self.image, np.uint8), prompt=np.array(self.prompt or ""))
        with open(target, "wb") as f:
            np.savez_compressed(f, **arrays)
        record = {"file": REFERENCE_NAME, "sha256": sha256_file(target), "bytes": target.stat().st_size,
                  "judged_against": self.judged_against, "calls": int(self.logits.shape[0]),
                  "batch": int(self.logits.shape[1]), "prompt_tokens": int(self.prompt_ids.shape[1])}
        if self.image is not None:
            record.update(image=list(self.image.shape[:2]), prompt=self.prompt)
        return record

    @classmethod
    def load(cls, directory: Path, record: dict | None, missing: str | None = None) -> "Reference":
        """The reference the manifest's `validation.reference` names, checked against its sha256; `missing` is why
        the export stored none, where it said (`validation.reference_missing`).

        Raises:
            ArtifactValidationError: none recorded, the file is missing, or its sha256 differs.
        """
        directory = Path(directory)
        if not record and missing:
            raise ArtifactValidationError(f"{directory} has no stored reference to validate against: {missing}")
        if not record:
            raise ArtifactValidationError(
                f"{directory} has no stored reference to validate against (exported before optimum-shared-graph 0.2, "
                "with --skip-validation, as a fallback or by optimum-intel's own task): re-export it with "
                "`optimum-cli export openvino --task text-generation-shared` to get one")
        name = record.get("file", REFERENCE_NAME)
        target = directory / name
        if "/" in name or "\\" in name or not target.is_file():
            raise ArtifactValidationError(f"{directory} lacks its stored reference {name}: copy the whole artifact "
                                          "directory, or re-export it")
        if sha256_file(target) != record.get("sha256"):
            raise ArtifactValidationError(f"{target} does not match the sha256 in the manifest: copy the artifact "
                                          "again, or re-export it")
        with np.load(target, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        return cls(prompt_ids=arrays["prompt_ids"], prompt_mask=arrays["prompt_mask"], fed=arrays["fed"],
                   logits=arrays["logits"],
                   judged_against=record.get("judged_against", "pytorch"),
                   image=arrays.get("image"), prompt=str(arrays["prompt"]) if "prompt" in arrays else None)
