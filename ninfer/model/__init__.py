"""NInfer model package."""
