"""In-repo runs load the plugin from the source tree (installed, it also loads through its pytest11 entry
point, registered under the same name, so it is loaded once either way)."""

pytest_plugins = ["harness.plugin", "pytester"]
