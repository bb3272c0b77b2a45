"""The reaper: cancels the jobs that outlived their task instance (``orphans.decide`` says which).

Two ways in, one rule (see "Orphaned jobs" in docs/architecture.md):

- **What Airflow announces** (``listeners.py``, registered by the UI plugin). A task instance
  set failed or success, or a DAG run's end: in the api-server the reaper's own thread applies
  the table at once (no grace: a user set the state); in the scheduler the loop is woken.
- **What it does not** (``loop.py``): a process of its own beside the scheduler lists the live
  jobs every ``RECONCILE_EVERY`` seconds and cancels what the table says once
  ``[torchx] orphan_grace`` has passed.

Both read the settings (``settings.py``), list the live jobs (``listing.py``), read their task
instances' states (``views.py``) and apply the table (``decisions.py``). ``[torchx]
cancel_orphaned_jobs = False`` turns both off (the UI still shows orphans as such).
"""
