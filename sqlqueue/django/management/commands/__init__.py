"""``sqlqueue_worker`` and ``sqlqueue_migrate``."""
