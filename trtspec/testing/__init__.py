"""Test and warm-up helpers shipped with the package (tiny models, fakes)."""
