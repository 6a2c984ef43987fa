"""The operators' side of a :class:`~sqlqueue.Queue`: ``operations`` (``Operations``: stats,
health, search, dead-letter actions, pauses, prune), the values it returns (``stats``) and
times as operators type them (``moments``). The CLI, the web page and the metrics read the
queue through these, and these through the store's one read model."""
