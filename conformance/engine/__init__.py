"""The engine: a run's options and session, the plan (checks x world sizes x expectations), the
runner that executes it on a launcher's ranks, and the verdict that turns a step's rank results
into its result; :mod:`~accelkit.conformance.engine.execute` is the part that runs in a rank."""
