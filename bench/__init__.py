"""sqlqueue's benchmark suite: ``python -m bench --help`` from the repository root."""
