"""One Flask blueprint a file: pod mutation, map validation, health and metrics."""
