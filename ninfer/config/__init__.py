"""NInfer config package."""
