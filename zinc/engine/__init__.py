"""zinc package."""
