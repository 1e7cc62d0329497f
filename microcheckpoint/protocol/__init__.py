"""The checkpoint protocol: pure, derived from checkpoint storage, no Airflow, Spark or clients.

Read it in the order of an epoch: ``layout`` (where files live), ``records`` (what they
hold), ``barrier`` and ``coordinator`` (trigger), ``plan`` (what the engine processes),
``pending`` (acks), ``metadata`` (the commit point), ``recovery``, ``retention``,
``savepoints`` and ``history``.
"""
