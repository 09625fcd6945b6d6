"""In-repo runs load the plugin from the source tree (installed, it also loads through its pytest11 entry
point, registered under the same name, so it is loaded once either way).

The harness's own tests call kernels directly too, so on a machine without CUDA the Triton interpreter
is switched on (and made faithful) here, before any test module imports triton.
"""

from harness.runtime.device import use_triton_interpreter
from harness.runtime.interpreter import make_faithful

use_triton_interpreter()
make_faithful()

pytest_plugins = ["harness.plugin", "pytester"]
