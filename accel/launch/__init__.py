"""The launcher's runtime half: what ``accel launch`` and the ranks it starts share while a job runs.

The ranks' progress heartbeat read by the hang watchdog (:mod:`.heartbeat`), the one precedence rule
for settings (:mod:`.precedence`) and launching on Amazon SageMaker (:mod:`.sagemaker`, with the
estimator's arguments in :mod:`.sagemaker_args`). The command line itself is :mod:`accel.commands.launch`;
Accelerate's helper names stay in :mod:`accel.utils.launch`. Importing this package imports none of its
modules.
"""
