"""NInfer media package."""
