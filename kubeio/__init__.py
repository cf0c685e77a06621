"""gpuplace kubeio."""
