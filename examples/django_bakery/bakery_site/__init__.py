"""The bakery's settings."""
