"""`gpuplace demo`: the whole GitOps flow on a local control plane, with checks at every step."""
