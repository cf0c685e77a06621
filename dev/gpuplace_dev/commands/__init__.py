"""The subcommands the development environment adds to `gpuplace` (entry points
`gpuplace.commands` in dev/pyproject.toml)."""
