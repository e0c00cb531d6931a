"""NInfer engine package."""
