"""In-repo runs load the plugin from the source tree (installed, it loads through its pytest11 entry point)."""

import importlib.metadata

_installed = any(ep.value == "harness.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["harness.plugin"]
pytest_plugins.append("pytester")
