"""Where ranks run: the worker pool and its workers (processes kept across checks), the torchrun
mode, simulated ranks on torch's fake process group, simulated hosts (network namespaces), and
the process helpers they share."""
