"""optimum-cli hook of optimum-shared-graph: adds `--task text-generation-shared` to `export openvino`, and
the `shared-graph validate` command.

Installed as `optimum/commands/register/register_shared_graph.py` (see setup.cfg), where optimum-cli
imports every file at start-up; so it only patches the command and imports nothing heavy.
"""

from optimum_shared_graph.cli import register
from optimum_shared_graph.validate_cli import SharedGraphCommand

register()

REGISTER_COMMANDS = [SharedGraphCommand]
