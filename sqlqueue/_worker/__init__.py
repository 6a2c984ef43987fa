"""The worker's machinery: the claim loop and everything one worker process runs beside it.

``loop`` (the :class:`~sqlqueue.Worker` itself) claims due jobs into ``slots``; ``launch`` starts
each on a handler thread (``threads``) or the event loop, through the one attempt pipeline in
``attempt``; ``classify`` turns what happened into an outcome, and the ``outbox`` writes outcomes
in batches on the database thread (``dbthread``). Beside the loop run the ``heartbeat`` (leases),
the ``reaper`` (dead workers' jobs), the ``listener`` (wake-ups), the ``scheduler`` (periodic
jobs) and the operators' duties in ``upkeep`` (``pauses``, counts, ``retention``).
"""
