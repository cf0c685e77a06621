"""Unit tests of dev/ (gpuplace_dev): local cluster, local ArgoCD, docs reference."""
