"""Unit tests of kubeio/: the apiserver client, request loop, informers, leases, pod reader."""
