"""The pure placement domain: schema, parsers, validation, compilation and codecs.

Nothing here talks to Kubernetes, Flask, NVML or git; the components carry out what this decides.
"""
