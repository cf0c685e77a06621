"""Unit tests of charts/gpuplace, argocd/ and the kustomizations, as rendered."""
