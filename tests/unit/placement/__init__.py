"""Unit tests of placement/: the pure core (compile, validate, bind, gate, annotations, keyring)."""
