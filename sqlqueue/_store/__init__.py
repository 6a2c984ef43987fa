"""The store: every SQL statement sqlqueue runs, above the dialect seam.

Statements are SQLAlchemy Core with bound values; anything that differs between databases is
asked of the :class:`~sqlqueue.dialects.Dialect`. Driver errors leave the store already
translated into sqlqueue's hierarchy.
"""
