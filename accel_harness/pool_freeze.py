"""Imported last by a rank pool's fork server: it freezes what the server imported, so that the ranks'
garbage collections skip it.

A rank forked from the server starts with every object the server's imports made (torch, Dynamo, sympy,
...: hundreds of thousands). Python's collector would traverse all of them in every full collection of
every rank (``Accelerator.free_memory`` runs one after each test), and touch, so copy, the pages the fork
shared. ``gc.freeze`` moves them into a generation no collection visits, as
:func:`accel.launch.forking.garbage_frozen_for_fork` does for ranks forked from the controller itself.
The server runs nothing after its imports but forks, so the freeze stays for its whole life.
"""

from __future__ import annotations

from .session_freeze import freeze_collected_session

freeze_collected_session()
