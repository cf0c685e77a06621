"""Unit tests of webhook/: admission, map checks, TLS, processes."""
