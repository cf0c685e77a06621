"""Unit tests of controller/: binder, caches, reconcilers, DRA, metrics, web view."""
