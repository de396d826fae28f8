"""The documentation site builds with --strict (broken links, missing API objects fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()


def test_every_page_is_in_the_nav():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {next(iter(item.values())) for item in nav}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= listed, f"pages missing from mkdocs.yml nav: {sorted(pages - listed)}"
