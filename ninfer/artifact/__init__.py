"""NInfer artifact package."""
