"""NInfer text package."""
