"""Unit tests of agent/: node checks and the NVML probe (with the fake libnvidia-ml)."""
