"""The gpuplace command line (`gpuplace.cli`, a subcommand per module of `gpuplace.commands`) and
the client-side views it shows (status, explain, gpus, keys, preflight). The local cluster and the
demo are the development environment's, in dev/ (package `gpuplace_dev`), which the product never
imports."""
