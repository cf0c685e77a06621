"""Shared Kubernetes plumbing for the controller, webhook and agent.

Only this package talks to the Kubernetes API: a thin JSON client over urllib3 configured by the
official `kubernetes` package (kubeconfig, in-cluster tokens), our own error classes, watch-fed
informers, Lease-based leader election, Events, and the small health/metrics HTTP server.
"""
