"""NInfer api package."""
