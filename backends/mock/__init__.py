"""The ``mock`` accelerator: importing this package registers ``torch.mock`` under
PrivateUse1 and the ``mccl`` collective library. See issue #4 / #5."""

raise NotImplementedError("the mock device is not built yet, see issue #4")
