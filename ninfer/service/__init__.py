"""NInfer service package."""
