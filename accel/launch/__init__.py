"""The launcher's runtime half: what ``accel launch`` and the ranks it starts do while a job runs.

* the plan as a value (:mod:`.plan`) and carrying it out through torch elastic (:mod:`.execution`);
* what every rank runs (:mod:`.bootstrap`), the ranks' progress heartbeat (:mod:`.heartbeat`) and the
  parent-death signal that ends a child with its parent (:mod:`.lifetime`, the harness's ranks use it too);
* the hang watchdog (:mod:`.watchdog`), the evidence and the rules of whom to blame (:mod:`.diagnosis`),
  the report printed on a failure (:mod:`.report`) and the channel between the nodes' launchers
  (:mod:`.nodes`);
* the rendezvous on this host (:mod:`.network`), the one precedence rule for settings
  (:mod:`.precedence`) and launching on Amazon SageMaker (:mod:`.sagemaker`, :mod:`.sagemaker_args`).

The command line (flags, config file, building the plan) is :mod:`accel.commands.launch`; Accelerate's
helper names stay in :mod:`accel.utils.launch`. Importing this package imports none of its modules, so
a rank's ``python -m accel.launch.bootstrap`` loads only what it runs.
"""
