"""gpuplace webhook."""
