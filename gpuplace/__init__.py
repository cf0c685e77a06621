"""The gpuplace command line and the tools around the components (local cluster, demo)."""
