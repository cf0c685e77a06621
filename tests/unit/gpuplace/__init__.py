"""Unit tests of gpuplace/: the CLI and its commands, packaging."""
