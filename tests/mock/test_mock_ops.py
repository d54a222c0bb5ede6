"""The mock device's ops against the CPU: the zero-copy fallback (elementwise, reductions,
views, indexing, matmul, in-place, out=, non-contiguous inputs), copies, autograd, and the
classes of ops that bypass the fallback (fused RNN cells, zero tensors, composite kernels
that assume CPU or CUDA), and sparse and nested tensors. The module runs inside the mock
(tests/support/mock_process.py): on the zero-copy paths, through the copying paths a discrete device
takes (at::native::cpu_fallback, staged copies), and as a discrete asynchronous device (every
op queued on a stream; the `ops` area runs the zero-copy asynchronous mode in
conformance-modes)."""

from __future__ import annotations

import accelkit.backends.mock  # noqa: F401
import pytest
import torch

pytestmark = pytest.mark.mock_process(modes=("default", "discrete", "discrete-async"))


def _gen(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def _same(mock_result, cpu_result):
    if isinstance(cpu_result, (tuple, list)):
        assert len(mock_result) == len(cpu_result)
        for m, c in zip(mock_result, cpu_result, strict=True):
            _same(m, c)
        return
    if not isinstance(cpu_result, torch.Tensor):
        assert mock_result == cpu_result
        return
    assert mock_result.device.type == "mock", f"result on {mock_result.device}"
    assert mock_result.dtype == cpu_result.dtype
    assert mock_result.shape == cpu_result.shape
    assert mock_result.stride() == cpu_result.stride()
    torch.testing.assert_close(mock_result.cpu(), cpu_result, equal_nan=True)

A = _gen(6, 5)
B = _gen(6, 5, seed=1)
V = _gen(5, seed=2)
M = _gen(5, 7, seed=3)
IDX = torch.tensor([0, 3, 1])
I32 = _gen(6, 5, dtype=torch.int32)

# (name, fn(*tensors), inputs) — fn runs once on CPU tensors and once on mock copies.
CASES = [
    ("add", lambda a, b: a + b, (A, B)),
    ("add_alpha", lambda a, b: torch.add(a, b, alpha=2.5), (A, B)),
    ("sub_broadcast", lambda a, v: a - v, (A, V)),
    ("mul_scalar", lambda a: a * 3, (A,)),
    ("div", lambda a, b: a / b, (A, B)),
    ("pow", lambda a: a.abs().pow(1.5), (A,)),
    ("exp_log", lambda a: a.exp().log1p(), (A,)),
    ("sin_tanh", lambda a: torch.tanh(torch.sin(a)), (A,)),
    ("where", lambda a, b: torch.where(a > 0, a, b), (A, B)),
    ("clamp", lambda a: a.clamp(-0.5, 0.5), (A,)),
    ("int_ops", lambda i: (i * 3 + 1) // 2, (I32,)),
    ("bitwise", lambda i: (i & 3) | (i ^ 1), (I32,)),
    ("to_half", lambda a: a.half() * 2, (A,)),
    ("to_double", lambda a: a.double().sqrt(), (A,)),
    ("bf16_add", lambda a, b: a.bfloat16() + b.bfloat16(), (A, B)),
    ("compare", lambda a, b: a >= b, (A, B)),
    ("sum_dim", lambda a: a.sum(1), (A,)),
    ("mean_keepdim", lambda a: a.mean(0, keepdim=True), (A,)),
    ("max_dim", lambda a: a.max(1), (A,)),
    ("argmin", lambda a: a.argmin(), (A,)),
    ("var_std", lambda a: (a.var(0), a.std(1)), (A,)),
    ("cumsum", lambda a: a.cumsum(1), (A,)),
    ("sort", lambda a: a.sort(1), (A,)),
    ("topk", lambda a: a.topk(2, dim=1), (A,)),
    ("softmax", lambda a: torch.softmax(a, -1), (A,)),
    ("log_softmax", lambda a: torch.log_softmax(a, 0), (A,)),
    ("norm", lambda a: torch.linalg.vector_norm(a, dim=1), (A,)),
    ("mm", lambda a, m: a @ m, (A, M)),
    ("bmm", lambda a: torch.bmm(a.reshape(2, 3, 5), a.reshape(2, 5, 3)), (A,)),
    ("linear", lambda a, m: torch.nn.functional.linear(a, m.t(), m[0]), (A, M)),
    ("addmm", lambda v, a, m: torch.addmm(v[:1].expand(6, 7).contiguous(), a, m), (V, A, M)),
    ("transpose_contig", lambda a: a.t().contiguous(), (A,)),
    ("view_reshape", lambda a: a.view(3, 10).reshape(10, 3), (A,)),
    ("slice_step", lambda a: a[::2, 1::2] * 1, (A,)),
    ("noncontig_add", lambda a, b: a.t() + b.t(), (A, B)),
    ("noncontig_out", lambda a: a[:, ::2].exp(), (A,)),
    ("narrow_select", lambda a: a.narrow(1, 1, 3).select(0, 2), (A,)),
    ("unfold_view", lambda a: a.unfold(1, 2, 1), (A,)),
    ("diagonal", lambda a: a.diagonal(), (A,)),
    ("expand_add", lambda v: v.expand(4, 5) + 1, (V,)),
    ("cat", lambda a, b: torch.cat([a, b], 1), (A, B)),
    ("stack", lambda a, b: torch.stack([a, b]), (A, B)),
    ("split", lambda a: [t * 1 for t in a.split(2)], (A,)),
    ("chunk_views", lambda a: a.chunk(3, 1), (A,)),
    ("index_select", lambda a, i: a.index_select(0, i), (A, IDX)),
    ("gather", lambda a: a.gather(1, torch.zeros(6, 2, dtype=torch.long).to(a.device)), (A,)),
    ("advanced_index", lambda a, i: a[i], (A, IDX)),
    ("masked_select", lambda a: a[a > 0], (A,)),
    ("nonzero", lambda a: (a > 0).nonzero(), (A,)),
    ("scatter_add", lambda a, i: torch.zeros(4, 5, device=a.device).index_add_(
        0, i, a[:3]), (A, IDX)),
    ("flip_roll", lambda a: a.flip(0).roll(2, 1), (A,)),
    ("tril", lambda a: a.tril(), (A,)),
    ("conv2d", lambda a: torch.nn.functional.conv2d(
        a.reshape(1, 1, 6, 5), a[:3, :3].reshape(1, 1, 3, 3)), (A,)),
    ("layer_norm", lambda a: torch.nn.functional.layer_norm(a, (5,)), (A,)),
    ("gelu_relu", lambda a: torch.nn.functional.gelu(a).relu(), (A,)),
    ("cross_entropy", lambda a: torch.nn.functional.cross_entropy(
        a, torch.tensor([0, 1, 2, 3, 4, 0]).to(a.device)), (A,)),
    ("einsum", lambda a, m: torch.einsum("ij,jk->ik", a, m), (A, M)),
    ("unique", lambda i: torch.unique(i), (I32,)),
    ("complex_view", lambda a: torch.view_as_complex(a[:, :4].reshape(6, 2, 2).contiguous())
     .abs(), (A,)),
    ("zeros_like_fill", lambda a: torch.zeros_like(a).fill_(2.5), (A,)),
    ("arange_factory", lambda a: torch.arange(10, device=a.device) * 2, (A,)),
    ("full_factory", lambda a: torch.full((3, 2), 7.0, device=a.device), (A,)),
    ("eye_factory", lambda a: torch.eye(4, device=a.device), (A,)),
    ("linspace_factory", lambda a: torch.linspace(0, 1, 5, device=a.device), (A,)),
    ("equal", lambda a, b: torch.equal(a, b), (A, A)),
    ("allclose", lambda a, b: torch.allclose(a, b), (A, B)),
    ("item", lambda a: a[1, 2].item(), (A,)),
    ("tolist", lambda v: v.tolist(), (V,)),
]


@pytest.mark.parametrize("name,fn,inputs", CASES, ids=[c[0] for c in CASES])
def test_op_matches_cpu(name, fn, inputs):
    expected = fn(*[t.clone() for t in inputs])
    got = fn(*[t.to("mock") for t in inputs])
    _same(got, expected)

LAYOUTS = [((4, 6), (4, 6), False), ((4, 6), (6,), False), ((4, 1, 3), (5, 1), False),
           ((6, 4), (6, 4), True), ((3, 8), (8, 3), True), ((0, 3), (3,), False),
           ((), (2, 2), False)]


@pytest.mark.parametrize("shape_a,shape_b,transpose", LAYOUTS)
@pytest.mark.parametrize("op", [torch.add, torch.mul, torch.maximum, torch.atan2])
def test_binary_broadcast_and_strides(op, shape_a, shape_b, transpose):
    a, b = _gen(*shape_a, seed=5), _gen(*shape_b, seed=6)
    if transpose:
        a, b = a.t(), b if b.shape == a.t().shape else b.t()
    _same(op(a.to("mock"), b.to("mock")), op(a, b))
    dst_cpu = op(a, b).clone()
    dst = dst_cpu.to("mock")
    _same(op(a.to("mock"), b.to("mock"), out=dst), op(a, b, out=dst_cpu))

# Seeded random cases (a dependency-free property test): a random view of a random tensor
# (transpose, step slices, narrow, expand, storage offset), then a random op, in place or
# out of place, compared with the same on the CPU.
UNARY = [torch.neg, torch.exp, torch.abs, torch.sigmoid, lambda t: t * 2 + 1]
REDUCE = [lambda t: t.sum(-1), lambda t: t.amax(0), lambda t: t.mean(), lambda t: t.cumsum(0)]
INPLACE = [lambda t: t.mul_(3), lambda t: t.clamp_(-0.5, 0.5), lambda t: t.zero_().add_(2),
           lambda t: t.copy_(t.flip(0))]


def _random_view(rng, t):
    for _ in range(rng.randint(0, 3)):
        choice = rng.choice(["t", "step", "narrow"])
        if choice == "t" and t.dim() >= 2:
            t = t.transpose(0, t.dim() - 1)
        elif choice == "step" and t.size(0) > 2:
            t = t[rng.randint(0, 1)::rng.randint(1, 2)]
        elif choice == "narrow" and t.size(-1) > 2:
            t = t.narrow(-1, 1, t.size(-1) - rng.randint(1, 2))
    return t


@pytest.mark.parametrize("case", range(60))
def test_random_views_and_ops(case):
    import random

    rng = random.Random(case)
    shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
    base_cpu = _gen(*shape, seed=case)
    base = base_cpu.to("mock")
    steps = rng.getstate()
    view_cpu = _random_view(rng, base_cpu)
    rng.setstate(steps)
    view = _random_view(rng, base)
    assert view.stride() == view_cpu.stride() and view.storage_offset() == \
        view_cpu.storage_offset()
    kind = rng.choice(["unary", "reduce", "inplace", "binary"])
    if kind == "unary":
        fn = rng.choice(UNARY)
        _same(fn(view), fn(view_cpu))
    elif kind == "reduce":
        fn = rng.choice(REDUCE)
        _same(fn(view), fn(view_cpu))
    elif kind == "inplace":
        fn = rng.choice(INPLACE)
        fn(view)
        fn(view_cpu)
        _same(base, base_cpu)  # written through the view into the base, nothing else
    else:
        other_cpu = _gen(*view_cpu.shape, seed=case + 1000)
        _same(torch.add(view, other_cpu.to("mock"), alpha=0.5),
              torch.add(view_cpu, other_cpu, alpha=0.5))


def test_foreach_ops_in_place_and_out_of_place():
    cpu = [A.clone(), B.clone(), V.clone()]
    mock = [t.to("mock") for t in cpu]
    torch._foreach_mul_(cpu, 3.0)
    torch._foreach_mul_(mock, 3.0)
    for m, c in zip(mock, cpu, strict=True):
        _same(m, c)
    _same(torch._foreach_add(mock, mock), torch._foreach_add(cpu, cpu))


def test_ops_whose_meta_kernel_disagrees_with_the_cpu_kernel():
    """The ops whose meta kernel infers other outputs than the CPU kernel returns
    (meta_disagrees, core/csrc/aten/fallback.cpp) equal the CPU's, also queued on an asynchronous
    device: F.embedding_bag with and without autograd (_embedding_bag's offset2bag) and
    layer_norm in float32 (queued from its meta kernel) and bfloat16 (its statistics' dtype)."""
    weight = torch.randn(10, 8)
    indices, offsets = torch.tensor([0, 3, 5, 1, 9]), torch.tensor([0, 2])
    on_device = weight.to("mock").requires_grad_()
    with torch.no_grad():
        _same(torch.nn.functional.embedding_bag(indices.to("mock"), on_device, offsets.to("mock")),
              torch.nn.functional.embedding_bag(indices, weight, offsets))
    bags = torch.nn.functional.embedding_bag(indices.to("mock"), on_device, offsets.to("mock"),
                                             mode="max")
    bags.sum().backward()
    cpu_weight = weight.clone().requires_grad_()
    cpu_bags = torch.nn.functional.embedding_bag(indices, cpu_weight, offsets, mode="max")
    cpu_bags.sum().backward()
    _same(bags, cpu_bags)
    _same(on_device.grad, cpu_weight.grad)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 6, 8, dtype=dtype)
        _same(torch.ops.aten.native_layer_norm(x.to("mock"), [8], None, None, 1e-5),
              torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5))


def test_inplace_writes_through_views():
    base_cpu, base = A.clone(), A.to("mock")
    base_cpu[:, 1::2].mul_(10)
    view = base[:, 1::2]
    result = view.mul_(10)
    assert result is view
    _same(base, base_cpu)
    base_cpu.t()[2].add_(1)
    base.t()[2].add_(1)
    _same(base, base_cpu)


def test_inplace_keeps_storage_and_identity():
    x = A.to("mock")
    ptr = x.data_ptr()
    y = x.add_(1).relu_()
    assert y is x and x.data_ptr() == ptr
    _same(x, (A + 1).relu())


def test_out_argument_resized_and_in_place():
    out = torch.empty(0, device="mock")
    res = torch.add(A.to("mock"), B.to("mock"), out=out)
    assert res is out
    _same(out, A + B)
    exact = torch.empty(6, 5, device="mock")
    ptr = exact.data_ptr()
    torch.mul(A.to("mock"), 2, out=exact)
    assert exact.data_ptr() == ptr
    _same(exact, A * 2)
    strided = torch.zeros(6, 10, device="mock")[:, ::2]
    torch.sub(A.to("mock"), 1, out=strided)
    assert strided.stride() == (10, 2)
    torch.testing.assert_close(strided.cpu(), A - 1)
    vals, idx = torch.empty(0, device="mock"), torch.empty(0, dtype=torch.long, device="mock")
    torch.max(A.to("mock"), 1, out=(vals, idx))
    _same((vals, idx), A.max(1))


def test_view_of_fallback_output_shares_memory():
    x = A.to("mock")
    u = x.unfold(1, 2, 1)
    assert u.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    x.zero_()
    assert u.abs().sum().item() == 0


def test_copies_all_directions_and_dtypes():
    x = A.to("mock")
    _same(x.to("mock:1"), A)
    assert x.to("mock:1").device == torch.device("mock:1")
    _same(x.to(torch.float64), A.double())
    _same(x.t().to("cpu").to("mock"), A.t())
    dst = torch.zeros(5, 6, device="mock")
    dst.copy_(A.t())
    _same(dst, A.t().contiguous())
    dst2 = torch.zeros(10, 6, device="mock")[::2]
    dst2.copy_(x.t())
    torch.testing.assert_close(dst2.cpu(), A.t())
    assert torch.equal(x.t().cpu(), A.t())
    conj = torch.complex(A, B).to("mock").conj()
    torch.testing.assert_close(conj.cpu(), torch.complex(A, B).conj())


def test_autograd_through_mock():
    w_cpu = M.clone().requires_grad_()
    w = M.to("mock").requires_grad_()
    for weight, x in ((w_cpu, A), (w, A.to("mock"))):
        torch.nn.functional.gelu(x @ weight).pow(2).sum().backward()
    assert w.grad.device.type == "mock"
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_batch_norm_updates_running_stats_in_place():
    bn_cpu, bn = torch.nn.BatchNorm1d(5), torch.nn.BatchNorm1d(5).to("mock")
    mean = bn.running_mean
    for module, x in ((bn_cpu, A), (bn, A.to("mock"))):
        module(x)
        module(x * 2)
    assert bn.running_mean is mean  # optional mutable arguments written in place
    for name, value in bn.state_dict().items():
        _same(value, bn_cpu.state_dict()[name])


def test_module_training_step():
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.load_state_dict(model_cpu.state_dict())
    model.to("mock")
    for mdl, x in ((model_cpu, A), (model, A.to("mock"))):
        opt = torch.optim.SGD(mdl.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            mdl(x).square().mean().backward()
            opt.step()
    for p_cpu, p in zip(model_cpu.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), p_cpu)


@pytest.mark.parametrize("make,shape", [
    (lambda: torch.nn.LSTM(4, 8), (3, 2, 4)), (lambda: torch.nn.GRU(4, 8), (3, 2, 4)),
    (lambda: torch.nn.LSTMCell(4, 8), (3, 4)), (lambda: torch.nn.GRUCell(4, 8), (3, 4)),
], ids=["LSTM", "GRU", "LSTMCell", "GRUCell"])
def test_recurrent_modules_match_cpu(make, shape):
    """LSTM and GRU cells take aten's fused-cell ops on every device but the CPU
    (aten/src/ATen/native/RNN.cpp), which have CUDA kernels only; the layer composes them
    from the device's ops: outputs and every gradient equal the CPU's."""
    import copy

    torch.manual_seed(0)
    module_cpu = make()
    module = copy.deepcopy(module_cpu).to("mock")
    x = _gen(*shape)
    grads = []
    for mdl, inp in ((module_cpu, x.clone().requires_grad_()),
                     (module, x.to("mock").requires_grad_())):
        out = mdl(inp)
        outs = [t for o in (out if isinstance(out, tuple) else (out,))
                for t in (o if isinstance(o, tuple) else (o,))]
        sum(o.pow(2).sum() for o in outs).backward()
        grads.append([*(o.detach() for o in outs), inp.grad,
                      *(p.grad for p in mdl.parameters())])
    for on_cpu, on_mock in zip(*grads, strict=True):
        torch.testing.assert_close(on_mock.cpu(), on_cpu, atol=1e-5, rtol=1e-4)


def test_forward_mode_ad_and_zero_tensors():
    """Forward-mode AD makes zero tensors (no memory, the ZeroTensor key): on the device they
    are the device's own, so jvp works and they read as zeros."""
    x = _gen(4)
    out, tangent = torch.func.jvp(lambda t: t * 2, (x.to("mock"),),
                                  (torch.ones(4, device="mock"),))
    torch.testing.assert_close(out.cpu(), x * 2)
    torch.testing.assert_close(tangent.cpu(), torch.full((4,), 2.0))
    zero = torch._efficientzerotensor(3, device="mock")
    assert zero.device.type == "mock" and zero._is_zerotensor()
    torch.testing.assert_close(zero.cpu(), torch.zeros(3))
    torch.testing.assert_close((zero + 1).cpu(), torch.ones(3))


def test_composites_that_assume_cpu_or_cuda():
    """Ops whose composite kernel a device gets before the fallback assumes CPU or CUDA:
    group_norm views a channels_last input as contiguous, kaiser_window calls a DispatchStub
    with no PrivateUse1 entry. They run as the CPU's ops: same values, gradients too."""
    x = _gen(2, 4, 3, 3).to(memory_format=torch.channels_last)
    results = []
    for inp in (x.clone().requires_grad_(), x.to("mock").requires_grad_()):
        out = torch.nn.functional.group_norm(inp, 2)
        out.pow(2).sum().backward()
        results.append((out.detach(), inp.grad))
    for on_cpu, on_mock in zip(*results, strict=True):
        torch.testing.assert_close(on_mock.cpu(), on_cpu, atol=1e-5, rtol=1e-4)
    for args in ((8,), (8, False), (8, True, 5.0)):
        _same(torch.kaiser_window(*args, device="mock"), torch.kaiser_window(*args))


def test_normalisations_in_half_precision_match_the_cpu():
    """layer_norm of a float16 input accumulates in float as the CPU kernel does (the
    composite math_native_layer_norm a device gets first computes in float16); batch_norm
    takes float32 running statistics beside a float16 input, in eval and training mode; the
    statistics come back in the CPU's dtypes and sizes on a queued device too."""
    x, w, b = _gen(1, 2, 3, dtype=torch.half), _gen(2, 3, dtype=torch.half, seed=1), _gen(2, 3, dtype=torch.half, seed=2)
    _same(torch.nn.functional.layer_norm(x.to("mock"), (2, 3), w.to("mock"), b.to("mock")),
          torch.nn.functional.layer_norm(x, (2, 3), w, b))
    _same(torch.native_layer_norm(x.to("mock"), (3,), None, None, 1e-5),
          torch.native_layer_norm(x, (3,), None, None, 1e-5))
    inp = _gen(3, 4, dtype=torch.half)
    for training in (False, True):
        stats = [_gen(4, seed=3), _gen(4, seed=4).abs() + 0.5, _gen(4, seed=5), _gen(4, seed=6)]
        on_mock = [t.to("mock") for t in stats]
        _same(torch.nn.functional.batch_norm(inp.to("mock"), *on_mock, training=training),
              torch.nn.functional.batch_norm(inp, *stats, training=training))
        _same(on_mock[:2], stats[:2])  # the running statistics, updated alike
        _same(torch.native_batch_norm(inp.to("mock"), *on_mock[2:], *on_mock[:2], training, 0.1, 1e-5),
              torch.native_batch_norm(inp, *stats[2:], *stats[:2], training, 0.1, 1e-5))


def test_out_kernels_that_return_through_the_conjugate_bit():
    """linalg_lu_solve with left=False hands its result back by flipping the out tensor's
    conjugate bit (BatchLinearAlgebra.cpp); the device tensor gets the same values."""
    a, b = _gen(3, 3, dtype=torch.cfloat), _gen(4, 3, dtype=torch.cfloat, seed=1)
    lu, piv = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        want = torch.linalg.lu_solve(lu, piv, b, left=False, adjoint=adjoint)
        got = torch.linalg.lu_solve(lu.to("mock"), piv.to("mock"), b.to("mock"), left=False,
                                    adjoint=adjoint)
        torch.testing.assert_close(got.cpu().resolve_conj(), want.resolve_conj())


def test_empty_arguments_do_not_alias_each_other():
    """Tensors without elements (null storage) are distinct arguments: linalg_qr of a 3x0
    matrix writes an empty Q and R beside an empty input (a queued discrete device used to
    hand the CPU kernel one host image for all three)."""
    for mode in ("reduced", "complete"):
        got = torch.linalg.qr(torch.zeros(3, 0, dtype=torch.cfloat).to("mock"), mode=mode)
        want = torch.linalg.qr(torch.zeros(3, 0, dtype=torch.cfloat), mode=mode)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w)


def test_python_scalars_promote_as_on_the_cpu():
    """A Python number next to a tensor is a wrapped number: it does not promote a float32
    0-dim tensor or an int64 tensor to float64 (the queued path infers outputs from the
    meta kernel, which must see the flag)."""
    zero_dim, ints = torch.tensor(1.5), torch.arange(4)
    _same(zero_dim.to("mock") + 0.5, zero_dim + 0.5)
    _same(ints.to("mock") * 0.7, ints * 0.7)
    _same(ints.to("mock") + 1e-6, ints + 1e-6)


def _dense(t):
    return t.to_dense() if t.layout != torch.strided else t


def _same_values(mock_result, cpu_result):
    """As _same, strides aside (a sparse tensor's indices and values are copies, contiguous)."""
    assert mock_result.device.type == "mock", f"result on {mock_result.device}"
    torch.testing.assert_close(mock_result.cpu(), cpu_result, rtol=0, atol=0)


def test_sparse_coo_tensors_on_the_device():
    """Sparse COO tensors live on the device (indices and values device tensors) and their
    ops equal the CPU's: construction, coalesce, arithmetic, in-place ops, sparse x dense
    matmul with its gradient, conversion from and to dense (core/csrc/aten/layouts.cpp)."""
    import warnings
    warnings.filterwarnings("ignore", "Sparse")
    i, v = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]]), _gen(4)
    cpu = torch.sparse_coo_tensor(i, v, (2, 3))
    dev = torch.sparse_coo_tensor(i, v, (2, 3), device="mock")
    assert dev.layout == torch.sparse_coo and dev.device.type == "mock"
    assert dev._indices().device.type == "mock" and dev._values().device.type == "mock"
    assert (dev._nnz(), dev.is_coalesced()) == (4, False)
    coalesced = dev.coalesce()
    assert coalesced.is_coalesced() and coalesced._nnz() == 3
    _same_values(coalesced.indices(), cpu.coalesce().indices())
    _same_values(coalesced.values(), cpu.coalesce().values())
    _same(_dense(dev + dev), _dense(cpu + cpu))
    _same(_dense(dev * 2.5), _dense(cpu * 2.5))
    in_place = dev.clone()
    in_place.mul_(3)
    _same(_dense(in_place), _dense(cpu * 3))
    _same(_dense(dev), _dense(cpu))  # the clone was written, not its source
    weight = M[:3, :4].clone().to("mock").requires_grad_()
    torch.sparse.mm(dev, weight).sum().backward()
    _same(torch.sparse.mm(dev, weight.detach()), torch.sparse.mm(cpu, M[:3, :4]))
    _same(weight.grad, _dense(cpu).T @ torch.ones(2, 4))
    _same(A.to("mock").to_sparse().to_dense(), A)
    back = cpu.to("mock").cpu()
    assert back.layout == torch.sparse_coo and torch.equal(back.to_dense(), cpu.to_dense())


def test_sparse_compressed_tensors_on_the_device():
    """CSR and CSC tensors on the device: construction, accessors, conversion and
    sparse x dense matmul equal the CPU's."""
    import warnings
    warnings.filterwarnings("ignore", "Sparse")
    crow, col, v = torch.tensor([0, 1, 3]), torch.tensor([2, 0, 2]), _gen(3)
    cpu = torch.sparse_csr_tensor(crow, col, v, (2, 3))
    dev = torch.sparse_csr_tensor(crow, col, v, (2, 3), device="mock")
    assert dev.layout == torch.sparse_csr and dev._nnz() == 3
    _same_values(dev.crow_indices(), crow)
    _same_values(dev.col_indices(), col)
    _same(dev.to_dense(), cpu.to_dense())
    _same(dev @ M[:3].to("mock"), cpu @ M[:3])
    _same(A.to("mock").to_sparse_csr().to_dense(), A)
    _same(A.to("mock").to_sparse_csc().to_dense(), A)


def test_nested_tensors_on_the_device():
    """Nested tensors keep their buffer on the device: unbind gives device views, and
    elementwise ops, linear, padding and in-place ops equal the CPU's."""
    import warnings
    warnings.filterwarnings("ignore", "The PyTorch API of nested tensors")
    parts = [_gen(2, 4), _gen(3, 4, seed=1)]
    cpu = torch.nested.nested_tensor(parts)
    dev = torch.nested.nested_tensor(parts, device="mock")
    assert dev.is_nested and dev.device.type == "mock"
    _same(dev.unbind(), cpu.unbind())
    _same(dev.abs().unbind(), cpu.abs().unbind())
    _same(torch.nested.to_padded_tensor(dev, 0.5), torch.nested.to_padded_tensor(cpu, 0.5))
    linear = torch.nn.Linear(4, 5)
    dev_linear = torch.nn.Linear(4, 5).to("mock")
    dev_linear.load_state_dict(linear.state_dict())
    _same(dev_linear(dev).unbind(), linear(cpu).unbind())
    zeroed = dev.clone()
    zeroed.mul_(0)
    _same(zeroed.unbind(), (cpu * 0).unbind())
    _same(dev.unbind(), cpu.unbind())


def test_ops_with_a_cpu_kernel_and_a_composite_run_the_cpu_kernel():
    """mish_backward, silu_backward and native_channel_shuffle have a CPU kernel and a
    CompositeImplicitAutograd one, which a device without a kernel gets: the composites
    compute float16 in float16 and reshape channels_last input (core/csrc/aten/kernels.cpp
    sends them to the fallback, which runs the CPU kernels)."""
    x = torch.tensor([-2.4, -0.7, 0.3, 1.9, 3.3], dtype=torch.float16)
    grad = torch.tensor([1.3, -0.6, 2.2, 0.9, -1.7], dtype=torch.float16)
    for op in (torch.ops.aten.mish_backward, torch.ops.aten.silu_backward):
        cpu = op(grad, x)
        got = op(grad.to("mock"), x.to("mock"))
        assert torch.equal(got.cpu(), cpu), (op, got.cpu(), cpu)
    images = _gen(2, 6, 3, 3).to(memory_format=torch.channels_last)
    _same(torch.native_channel_shuffle(images.to("mock"), 3), torch.native_channel_shuffle(images, 3))
