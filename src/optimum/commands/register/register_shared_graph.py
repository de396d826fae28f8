"""optimum-cli hook of optimum-shared-graph: adds `--task text-generation-shared` to `export openvino`.

Kept tiny: optimum-cli imports every file here at start-up.
"""

from optimum_shared_graph import register

register()

REGISTER_COMMANDS = []
