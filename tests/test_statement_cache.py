"""The store's statement cache (``sqlqueue/_store/statement_cache.py``): a statement is built
once per key, and the cache stays bounded in a long-lived process whose keys vary (queue sets):
when full it is emptied and statements are built again on demand, never served for another key.
"""

from __future__ import annotations

from collections import Counter

from sqlqueue._store import statement_cache
from sqlqueue._store.statement_cache import cached_statement


def test_a_statement_is_built_once_per_key_and_the_full_cache_starts_over():
    builds: Counter[tuple[str, int]] = Counter()

    def get(n: int) -> tuple[str, int]:
        key = ("test_statement_cache", n)

        def build() -> tuple[str, int]:
            builds[key] += 1
            return key

        return cached_statement(key, build)

    assert get(0) == ("test_statement_cache", 0)
    assert get(0) == ("test_statement_cache", 0)
    assert builds[("test_statement_cache", 0)] == 1  # the second call reused it

    limit = statement_cache._MAX_STATEMENTS
    for n in range(1, limit + 1):  # more keys than the cache holds: it is emptied on the way
        assert get(n) == ("test_statement_cache", n)
    assert len(statement_cache._STATEMENTS) <= limit  # bounded, however many keys come
    assert get(limit) == ("test_statement_cache", limit)  # kept since the emptying: reused
    assert builds[("test_statement_cache", limit)] == 1
    assert get(0) == ("test_statement_cache", 0)  # emptied away: its own statement, built again
    assert builds[("test_statement_cache", 0)] == 2
