"""``python -m accel_reports.census LAST.json THIS.json``: the documented command, kept at its place.

The comparison itself lives in :mod:`accel_reports.analyse.census` (import it from there); this module
only runs it, so scripts and cron jobs that call the command keep working.
"""

if __name__ == "__main__":
    from accel_reports.analyse.census import main

    raise SystemExit(main())
