"""gpuplace's development environment: the local cluster (control plane, kwok nodes, a real node),
ArgoCD run out of cluster, and the demo. Not part of the product: the wheel and the image hold none
of it, and the product never imports it (an import-linter contract). Installed into the checkout's
`.venv` (`make venv`: `pip install -e ./dev`), it adds `gpuplace cluster` and `gpuplace demo` to the
command line through the `gpuplace.commands` entry points."""
