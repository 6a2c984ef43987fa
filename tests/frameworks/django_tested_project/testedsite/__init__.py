"""The project's settings."""
