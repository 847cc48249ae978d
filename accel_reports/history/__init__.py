"""The run history: every run's test records and benchmark samples kept in a database between reports.

``store`` (:class:`~accel_reports.history.store.History`, ``open_history``, ``append_results``) imports
and reads runs; ``db`` is the SQLite file or PostgreSQL database behind it; ``rows`` checks every stored
row on the way back; ``outputs`` proves an output folder writable before any work (the history's own
folder, ``accel report -o``, ``accel qualify --output``). Imports only the load and analyse stages.
"""
