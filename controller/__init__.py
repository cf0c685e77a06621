"""gpuplace controller."""
