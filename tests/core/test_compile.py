"""torch.compile on accelkit devices: the compiler registration (accelkit.core.compiler) and the
mock's Inductor codegen (accelkit.core.host_codegen). Every test registers devices, so each runs
in an interpreter of its own; compiled programs are few and batched (a compile costs seconds).
The multi-rank behaviour (collectives, DTensor, TP) is the conformance area ``compile``."""

from __future__ import annotations

import pytest
from support.python import json_result, run_python

#: One compiled function that covers what Inductor's C++ path decides by device type: masked
#: loads (pad, cat), indirect indexing (gather), atomic scatter (index_add), a reduction and an
#: argmax, a scan, a matmul with an epilogue, a division by a constant; then a training step
#: (backward), an input mutation and a view output. Prints JSON: the max differences to eager,
#: the devices, and how many kernel calls went through the staged (copying) path.
_OPS = """
    import json, torch
    import accelkit.backends.mock
    import accelkit.core.host_codegen as hc

    staged = [0]
    _run_staged = hc.run_staged
    def counting(*args):
        staged[0] += 1
        return _run_staged(*args)
    hc.run_staged = counting

    def ops(x, w, i):
        padded = torch.nn.functional.pad(x, (1, 2)) * 2
        joined = torch.cat([x, x.flip(0)], 1).sum(0)
        gathered = x[i] / 3.0
        scattered = torch.zeros(6, 5, device=x.device).index_add(0, i, gathered[:, :5])
        y = torch.nn.functional.gelu(x @ w + 1)
        return (padded, joined, gathered, scattered, x.argmax(1), x.cumsum(1),
                torch.softmax(y, -1), y.sum())

    def step(w, x):
        loss = (torch.tanh(x @ w) ** 2).mean()
        loss.backward()
        return loss

    def mutate(x):
        x.add_(1)
        x[:2].mul_(3)
        return (x * 2).t()[1:]

    torch.manual_seed(0)
    dev = "mock:1"
    x = torch.randn(6, 7, device=dev)
    w = torch.randn(7, 4, device=dev)
    i = torch.tensor([0, 5, 2, 2, 4], device=dev)
    diffs = {}
    got, want = torch.compile(ops)(x, w, i), ops(x, w, i)
    for k, (g, e) in enumerate(zip(got, want)):
        diffs[f"ops[{k}]"] = float((g.cpu().double() - e.cpu().double()).abs().max())
    devices = sorted({str(g.device) for g in got})
    wg, we = w.clone().requires_grad_(), w.clone().requires_grad_()
    torch.compile(step)(wg, x), step(we, x)
    diffs["grad"] = float((wg.grad - we.grad).abs().max().cpu())
    a, b = x.clone(), x.clone()
    ga, gb = torch.compile(mutate)(a), mutate(b)
    diffs["mutated input"] = float((a - b).abs().max().cpu())
    diffs["view output"] = float((ga - gb).abs().max().cpu())
    print(json.dumps({"diffs": diffs, "devices": devices, "grad_device": str(wg.grad.device),
                      "view_stride": [ga.stride(), gb.stride()], "staged": staged[0]}))
"""


@pytest.mark.parametrize("host_accessible", ["1", "0"])
def test_mock_compiles_what_eager_computes(host_accessible):
    """Compiled results equal eager's (within Inductor's float reordering) on the inputs' own
    device index, in both memory modes; with memory the host cannot address every kernel call
    goes through the runtime (host copies), with host memory none does."""
    result = json_result(run_python(_OPS, timeout=600, env={
        "ACCELKIT_MOCK_HOST_ACCESSIBLE": host_accessible}))
    assert all(d <= 1e-4 for d in result["diffs"].values()), result["diffs"]
    assert result["devices"] == ["mock:1"] and result["grad_device"] == "mock:1"
    assert result["view_stride"][0] == result["view_stride"][1]
    if host_accessible == "1":
        assert result["staged"] == 0
    else:
        assert result["staged"] >= 3, result


def test_autoloaded_mock_compiles_out_of_the_box():
    """With the mock autoloaded by `import torch`, torch.compile(fn)(mock tensor) works with the
    default backend; loading the device imported neither Dynamo nor Inductor (they register it
    when torch loads them), and compiler_status reports both halves."""
    proc = run_python("""
        import json, sys, torch
        lazy = not any(m in sys.modules for m in ("torch._dynamo", "torch._inductor.compile_fx"))
        x = torch.arange(12.0, device="mock:0").reshape(3, 4)
        out = torch.compile(lambda t: (t.sin() + 1).sum(1))(x)
        from accelkit.core.compiler import compiler_status
        status = compiler_status("mock")
        print(json.dumps({"lazy": lazy, "owner": torch._C._get_privateuse1_backend_name(),
                          "match": bool(torch.allclose(out.cpu(), (x.cpu().sin() + 1).sum(1))),
                          "device": str(out.device), "status": status.__dict__}))
    """, timeout=300, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "ACCELKIT_AUTOLOAD": "mock"})
    result = json_result(proc)
    assert result["lazy"] and result["owner"] == "mock" and result["match"]
    assert result["device"] == "mock:0"
    assert result["status"] == {"interface": "MockInterface", "scheduling": "HostScheduling",
                                "wrapper": "HostKernelWrapper[mock]", "inductor": True,
                                "reason": None}


def test_staged_call_keeps_aliasing_and_copies_back_what_is_written():
    """run_staged hands the kernel host tensors only, one host copy per device storage (two
    views of one storage stay views of one copy), and copies back the written storages."""
    proc = run_python("""
        import json, torch
        import accelkit.backends.mock
        from accelkit.core.host_codegen import run_staged
        base = torch.arange(8.0, device="mock:0")
        other = torch.full((3,), 5.0, device="mock:0")
        seen = {}
        def kernel(src, dst, extra, n):
            seen["cpu"] = all(t.device.type == "cpu" for t in (src, dst, extra))
            seen["shared"] = src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr()
            dst.copy_(src * 10 + n)   # dst is a view of src's storage
            extra.fill_(-1)           # not in writes: must not reach the device
        run_staged(kernel, (base[:4], base[4:], other, 1), (1,))
        print(json.dumps({"base": base.cpu().tolist(), "other": other.cpu().tolist(), **seen}))
    """, env={"ACCELKIT_MOCK_HOST_ACCESSIBLE": "0"})
    result = json_result(proc)
    assert result["cpu"] and result["shared"]
    assert result["base"] == [0.0, 1.0, 2.0, 3.0, 1.0, 11.0, 21.0, 31.0]
    assert result["other"] == [5.0, 5.0, 5.0]


def test_registration_errors_and_refusals():
    """A codegen that is not callable is refused at once; a device module without the functions
    the Dynamo interface needs gets no interface, a device without an Inductor backend, one whose codegen is unusable and one that torch already
    gave another backend get a refusal (NotImplementedError with the reason, naming aot_eager
    where that is the way out) instead of Inductor's KeyError; the interface is built from the
    device module (current device, exchange, properties recorded for compile workers)."""
    proc = run_python("""
        import json, torch
        from support import pydevice
        from accelkit.core.compiler import (CompilerRegistrationError, InductorCodegen,
                                            compiler_status, register_compiler)
        out = {}
        try:
            register_compiler("bad", pydevice.make_module("bad"), inductor="HostKernels")
        except CompilerRegistrationError as exc:
            out["not_callable"] = str(exc)
        register_compiler("nodev", pydevice.make_module("nodev", synchronize=None))
        register_compiler("plain", pydevice.make_module("plain"))
        register_compiler("broken", pydevice.make_module("broken"),
                          inductor=lambda: InductorCodegen(object, object, None))
        from torch._inductor.codegen import common
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen
        common.register_backend_for_device("taken", CppScheduling, PythonWrapperCodegen)
        register_compiler("taken", pydevice.make_module("taken"))
        for name in ("nodev", "plain", "broken", "taken"):
            status = compiler_status(name)
            try:
                common.get_scheduling_for_device(name)(None) if name != "taken" else None
                refused = None
            except NotImplementedError as exc:
                refused = str(exc)
            out[name] = {"status": status.__dict__, "refused": refused}
        from torch._dynamo.device_interface import get_interface_for_device
        iface = get_interface_for_device("plain")
        previous = iface.exchange_device(1)
        props = iface.Worker.get_device_properties(1)
        out["interface"] = {"name": iface.__name__, "previous": previous,
                            "current": iface.current_device(), "count": iface.device_count(),
                            "props": [props.name, props.multi_processor_count > 0],
                            "capability": iface.get_compute_capability()}
        print(json.dumps(out))
    """)
    result = json_result(proc)
    assert result["not_callable"].startswith("inductor='HostKernels' for 'bad' is not callable")
    nodev = result["nodev"]
    assert nodev["status"]["interface"] is None and not nodev["status"]["inductor"]
    assert nodev["refused"] == nodev["status"]["reason"] == (
        "torch.nodev lacks synchronize: Dynamo's DeviceInterface for 'nodev' is built from these "
        "device-module functions; add them (accelkit's build_device_module provides them)")
    plain = result["plain"]
    assert plain["status"]["interface"] == "PlainInterface" and not plain["status"]["inductor"]
    assert "no Inductor backend" in plain["refused"]
    assert 'torch.compile(fn, backend="aot_eager")' in plain["refused"]
    assert plain["refused"] == plain["status"]["reason"]
    broken = result["broken"]
    assert broken["refused"].startswith("the Inductor codegen registered for 'broken' is "
                                        "unusable: TypeError: scheduling=<class 'object'> is not")
    assert "device_op_overrides=None is not a DeviceOpOverrides instance" in broken["refused"]
    taken = result["taken"]["status"]
    assert taken["scheduling"] == "CppScheduling" and not taken["inductor"]
    assert taken["reason"].startswith("Inductor already has a backend for 'taken'")
    assert result["interface"] == {"name": "PlainInterface", "previous": 0, "current": 1,
                                   "count": 2, "props": ["plain:1", True], "capability": ""}
