"""Templates for vendor backend packages (``accelkit new``).

``cuda_like/`` is the template of a cuda-like PrivateUse1 device package ``torch_<name>``;
:mod:`accelkit.device_templates.render` fills it in and renders the vendor-replaceable parts
(runtime, collectives transport) from accelkit's mock device, so nothing is copied.
"""
