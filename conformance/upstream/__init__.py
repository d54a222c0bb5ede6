"""accelkit.conformance.upstream: ``accelkit upstream``, PyTorch's own distributed tests
(``test/distributed/...`` of a PyTorch checkout, or any folder of tests written on
``torch.testing._internal``) on an accelkit backend. See ``docs/upstream.md``.

- :mod:`~accelkit.commands.upstream`: the command;
- :mod:`~accelkit.conformance.upstream.selection`: the default file set, ``--tests``/``--area``;
- :mod:`~accelkit.conformance.upstream.runner`: one pytest process per file;
- :mod:`~accelkit.conformance.upstream.hook` (started by ``startup/sitecustomize.py`` in every
  process of a run): backend set-up before the harness, adaptations, group recording;
- :mod:`~accelkit.conformance.upstream.adaptations`: what is changed in torch's harness, why,
  for which torch versions;
- :mod:`~accelkit.conformance.upstream.groups`: proof of the process groups the tests used;
- :mod:`~accelkit.conformance.upstream.plugin`: the pytest plugin (expectations, results);
- :mod:`~accelkit.conformance.upstream.report`, :mod:`~accelkit.conformance.upstream.markdown`,
  :mod:`~accelkit.conformance.upstream.bridge` (JUnit through the suite's writer),
  :mod:`~accelkit.conformance.upstream.compare`: the report.
"""
