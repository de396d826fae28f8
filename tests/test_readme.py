"""The README's headline figures are the generated pages' own: each row's figure is read from the page it links to.

A page regenerated with new results (`scripts/coverage.py`, `benchmarks/`) changes its figures; this test then
fails until the README says the same, so a figure in the README cannot go stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_ROW = re.compile(r"^\| (?P<what>[^|]+?) \| (?P<figure>[^|]+?) \| \[[^\]]+\]\((?P<page>docs/[^)#]+)(?:#[^)]*)?\) \|$")


def _architectures(text: str) -> str:
    m = re.search(r"\*\*(\d+) model types exported as one graph with parity\*\* \([^)]*\), (\d+) exported with a runtime "
                  r"difference, (\d+) refused, (\d+) not buildable", text)
    return f"{m[1]} of {sum(int(g) for g in m.groups())}"


def _npu(text: str) -> str:
    m = re.search(r"at released width, of the (\d+) exported types measured there: (\d+) with parity", text)
    return f"{m[2]} of {m[1]}"


def _benchmark_row(label: str):
    def read(text: str) -> str:
        m = re.search(rf"^\| {re.escape(label)} \| [^|]+ \| [^|]+ \| ([0-9.]+x) \|", text, re.M)
        return m[1]
    return read


def _fp16(text: str) -> str:
    section = text.split("## llama at meta-llama/Llama-3.2-1B-Instruct's widths", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^\| 1024 \| [^|]+ \| ([0-9.e+-]+) \(\w+\) \| ([0-9.e+-]+) \(\w+\) \|", section, re.M)
    return f"{m[1]}, {m[2]}"


def _memory(text: str) -> str:
    section = text.split("## qwen3-4b", 1)[1].split("\n## ", 1)[0]
    limits = [float(m[1]) for m in re.finditer(r"^\| text-generation-shared \| fp16 \| ([0-9.]+) GiB \| yes \| [^|]+ \| "
                                               r"[^|]+ \| passed", section, re.M)]
    return f"{min(limits):g} GiB"


def _export_wall(text: str) -> str:
    return re.search(r"^\| qwen3-4b \| shared wall \| ([0-9.]+x) \|", text, re.M)[1]


def _moe(text: str) -> str:
    return re.search(r"^\| qwen3_moe \([^)]*\) \| 2 \| \d+ \| [^|]+ \| [^|]+ \| [^|(]+\(([0-9.]+x)\) \|", text, re.M)[1]


def _vlm(text: str) -> str:
    m = re.search(r"^\| gemma3 \| 2 \| optimum-intel [^|]+ \| [^|]+ \| [^|]+ \| ([0-9.]+x)[^|]* \| ([0-9.]+x)[^|]* \|",
                  text, re.M)
    return f"{m[1]}, {m[2]}"


# a row's `what` starts with one of these: how its figure is read from its page
READERS = {
    "model types of optimum-intel's": _architectures,
    "of those measured through GenAI's NPU pipeline": _npu,
    "time to first token at a 1,024-token prompt": _benchmark_row("time to first token"),
    "peak memory during generation": _benchmark_row("peak memory during generation"),
    "fp16 artifact at a 1,024-token prompt": _fp16,
    "smallest memory limit under which a validated fp16 export": _memory,
    "wall time of a validated fp16 export": _export_wall,
    "peak anonymous memory of a validated fp16 export of a mixture of experts": _moe,
    "wall time and peak anonymous memory of a validated fp16 vision-language export": _vlm,
}


def _rows():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    return [m.groupdict() for line in table.splitlines() if (m := _ROW.match(line))]


def test_every_row_has_a_reader():
    rows = _rows()
    assert len(rows) >= 4
    for row in rows:
        assert [p for p in READERS if row["what"].startswith(p)], f"no reader for the README row {row['what']!r}"


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["what"][:40])
def test_the_readme_figure_is_its_page_s(row):
    read = next(reader for prefix, reader in READERS.items() if row["what"].startswith(prefix))
    page = (ROOT / row["page"]).read_text(encoding="utf-8")
    assert row["figure"] == read(page), f"README: {row['figure']!r}; {row['page']}: {read(page)!r}"
