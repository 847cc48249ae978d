"""The operator sweep: torch's own test databases (OpInfo, ModuleInfo, OptimInfo) run on a device
against the host, crash-isolated, with an outcome and a reason code for every operator x variant x
dtype x direction, and a dispatcher census of how the device runs each aten overload.

Layout, by job: :mod:`.plan` (work items and rows, torch-free), :mod:`.outcomes` (reason codes),
:mod:`.catalog` (the plan from torch's databases), :mod:`.metadata` (torch's skips, expected
failures and tolerances), :mod:`.transfer` and :mod:`.compare` (moving samples, comparing results),
:mod:`.execute` and :mod:`.nn_entries` (running operators, modules, optimizers), :mod:`.worker` and
:mod:`.runner` (processes, crashes, hangs), :mod:`.fold`, :mod:`.summary` and :mod:`.output`
(rows, figures, files), :mod:`.census` (the dispatcher), :mod:`.profile_rules` (a device profile's
tolerances and claims). ``accel ops`` is the command; ``docs/ops.md`` the reference.
"""
