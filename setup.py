"""Only here to ship `optimum_shared_graph.pth` at the top of site-packages (pyproject.toml has the rest).

The .pth file installs the start-up guard in `_optimum_shared_graph_hooks.py`, which makes
`OVModelForCausalLM.from_pretrained()` refuse static artifacts with a clear error.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "optimum_shared_graph.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)


setup(cmdclass={"build_py": BuildPyWithPth})
