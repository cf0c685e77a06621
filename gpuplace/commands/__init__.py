"""One module a subcommand; each exposes `register(subparsers)` and is found by `gpuplace.cli`."""
