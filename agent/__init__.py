"""gpuplace agent."""
