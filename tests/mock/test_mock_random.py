"""The mock's Philox generator and random kernels: state round trips, offset
arithmetic, the offset-exact property (a Shard(0) slice drawn at the shard's offset equals
the slice of the full draw), every random op drawing from the mock generator and never from
torch's CPU generator, dtypes and distributions. Runs inside the mock (tests/support/mock_process.py):
random numbers written in place, then generated on the host and copied, as for a discrete
device."""

from __future__ import annotations

import accelkit.backends.mock  # noqa: F401
import pytest
import torch

pytestmark = pytest.mark.mock_process(modes=("default", "discrete"))


def _state(seed: int, offset: int) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


def _seed_offset(state: torch.Tensor) -> tuple[int, int]:
    s, o = state.view(torch.int64).tolist()
    return s, o


def _set(seed: int, offset: int, device: int = 0) -> None:
    torch.mock.set_rng_state(_state(seed, offset), device)


def test_state_is_16_bytes_seed_then_offset():
    torch.mock.manual_seed(1234)
    state = torch.mock.get_rng_state()
    assert state.dtype == torch.uint8 and state.shape == (16,)
    assert _seed_offset(state) == (1234, 0)
    torch.rand(10, device="mock")
    assert _seed_offset(torch.mock.get_rng_state()) == (1234, 12)


@pytest.mark.parametrize("device", [1, "mock:1", torch.device("mock", 1)])
def test_get_set_rng_state_accepts_int_str_device(device):
    _set(7, 40, 1)
    assert _seed_offset(torch.mock.get_rng_state(device)) == (7, 40)
    torch.mock.set_rng_state(_state(9, 8), device)
    assert _seed_offset(torch.mock.get_rng_state(1)) == (9, 8)


def test_round_trip_reproduces_draws():
    torch.mock.manual_seed(3)
    torch.randn(7, device="mock")
    saved = torch.mock.get_rng_state()
    a = torch.rand(100, device="mock")
    torch.mock.set_rng_state(saved)
    b = torch.rand(100, device="mock")
    assert torch.equal(a.cpu(), b.cpu())
    states = torch.mock.get_rng_state_all()
    assert len(states) == torch.mock.device_count()
    c = torch.rand(5, device="mock")
    torch.mock.set_rng_state_all(states)
    assert torch.equal(torch.rand(5, device="mock").cpu(), c.cpu())


def test_offset_advances_by_ceil4_numel():
    _set(5, 0)
    for numel, expected in [(1, 4), (4, 8), (5, 16), (0, 16), (13, 32)]:
        torch.empty(numel, device="mock").uniform_()
        assert _seed_offset(torch.mock.get_rng_state())[1] == expected
    torch.empty(3, 3, device="mock").normal_()  # 9 -> 12
    assert _seed_offset(torch.mock.get_rng_state())[1] == 44


def test_manual_seed_restarts_offset_and_seeds_devices():
    torch.rand(9, device="mock:2")
    torch.manual_seed(77)  # torch.manual_seed seeds every mock device (manual_seed_all)
    for i in range(torch.mock.device_count()):
        assert _seed_offset(torch.mock.get_rng_state(i)) == (77, 0)
    assert torch.mock.initial_seed() == 77
    torch.mock.seed()
    assert torch.mock.initial_seed() != 77


def test_per_device_generators_are_independent():
    torch.mock.manual_seed_all(11)
    torch.rand(8, device="mock:1")
    assert _seed_offset(torch.mock.get_rng_state(0)) == (11, 0)
    assert _seed_offset(torch.mock.get_rng_state(1)) == (11, 8)


def test_generator_object_api():
    g = torch.Generator(device="mock")
    assert g.device == torch.device("mock", 0)
    g.manual_seed(21)
    g.set_offset(8)
    assert g.get_offset() == 8 and g.initial_seed() == 21
    a = torch.rand(6, device="mock", generator=g)
    assert g.get_offset() == 16
    g2 = torch.Generator(device="mock")
    g2.set_state(g.get_state())
    g.set_offset(8)
    assert torch.equal(torch.rand(6, device="mock", generator=g).cpu(), a.cpu())
    assert g2.get_offset() == 16


def test_bad_state_and_generator_errors():
    with pytest.raises(RuntimeError, match=r"Expected a mock RNG state of 16 bytes \(uint64 "
                                           r"seed, int64 offset\), got 5056 bytes"):
        torch.mock.set_rng_state(torch.zeros(5056, dtype=torch.uint8))
    with pytest.raises(RuntimeError,
                       match="Expected a 'mock' device type for generator but found 'cpu'"):
        torch.rand(3, device="mock", generator=torch.Generator())


def test_fake_state_is_ignored():
    from torch._subclasses.fake_tensor import FakeTensorMode

    _set(4, 12)
    with FakeTensorMode():
        fake = torch.empty(16, dtype=torch.uint8)
        torch.mock.set_rng_state(fake)
    assert _seed_offset(torch.mock.get_rng_state()) == (4, 12)


def test_fork_rng_restores_mock_state():
    _set(8, 20)
    with torch.random.fork_rng(devices=[0], device_type="mock"):
        torch.rand(100, device="mock")
    assert _seed_offset(torch.mock.get_rng_state()) == (8, 20)

# The offset-exact property: element i of an op at offset o depends only on (seed, o + i).
SHARDED_OPS = {
    "rand": lambda n, dt: torch.rand(n, device="mock", dtype=dt),
    "randn": lambda n, dt: torch.randn(n, device="mock", dtype=dt),
    "normal_": lambda n, dt: torch.empty(n, device="mock", dtype=dt).normal_(2.0, 3.0),
    "exponential_": lambda n, dt: torch.empty(n, device="mock", dtype=dt).exponential_(),
    "bernoulli_p": lambda n, dt: torch.empty(n, device="mock", dtype=dt).bernoulli_(0.3),
    "dropout": lambda n, dt: torch.nn.functional.dropout(
        torch.ones(n, device="mock", dtype=dt), 0.4),
    "randint": lambda n, dt: torch.randint(0, 1000, (n,), device="mock"),
    "randint_big": lambda n, dt: torch.randint(0, 2**40, (n,), device="mock"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("op", sorted(SHARDED_OPS))
def test_shard_slice_equals_full_draw(op, dtype):
    fn = SHARDED_OPS[op]
    numel, shards, start = 64, 4, 1000
    _set(2024, start)
    full = fn(numel, dtype).cpu()
    assert _seed_offset(torch.mock.get_rng_state())[1] == start + numel
    local = numel // shards
    for rank in range(shards):
        _set(2024, start + rank * local)
        part = fn(local, dtype).cpu()
        assert torch.equal(part, full[rank * local:(rank + 1) * local]), (op, rank)


def test_element_depends_on_offset_plus_index():
    _set(99, 0)
    full = torch.rand(20, device="mock").cpu()
    _set(99, 7)  # not a multiple of 4: still element i at offset 7 == element 7 + i
    assert torch.equal(torch.rand(5, device="mock").cpu(), full[7:12])


def test_noncontiguous_target_in_logical_order():
    _set(5, 0)
    flat = torch.rand(12, device="mock").cpu()
    _set(5, 0)
    t = torch.empty(4, 3, device="mock").t()
    t.uniform_()
    assert torch.equal(t.cpu().flatten(), flat)

# Every random op draws from the mock generator: reproducible from (seed, offset),
# advancing it, and never touching torch's CPU default generator.
def _p():
    return torch.full((8, 8), 0.5, device="mock")

SWEEP = {
    "rand": lambda: torch.rand(8, 8, device="mock"),
    "randn": lambda: torch.randn(8, 8, device="mock"),
    "randint": lambda: torch.randint(3, 9, (8, 8), device="mock"),
    "rand_like": lambda: torch.rand_like(_p()),
    "randn_like": lambda: torch.randn_like(_p()),
    "randint_like": lambda: torch.randint_like(_p(), 10),
    "randperm": lambda: torch.randperm(50, device="mock"),
    "multinomial": lambda: torch.multinomial(_p()[0] + 1, 4),
    "bernoulli": lambda: torch.bernoulli(_p()),
    "bernoulli_p": lambda: torch.bernoulli(_p(), 0.2),
    "bernoulli_tensor_": lambda: torch.empty(8, 8, device="mock").bernoulli_(_p()),
    "dropout": lambda: torch.nn.functional.dropout(_p(), 0.5),
    "native_dropout": lambda: torch.native_dropout(_p(), 0.5, True)[1],
    "alpha_dropout": lambda: torch.nn.functional.alpha_dropout(_p(), 0.5, True),
    "dropout2d": lambda: torch.nn.functional.dropout2d(_p().reshape(2, 4, 4, 2), 0.5),
    "normal_tensor_tensor": lambda: torch.normal(_p(), _p()),
    "normal_tensor_float": lambda: torch.normal(_p(), 2.0),
    "normal_float_tensor": lambda: torch.normal(1.0, _p()),
    "normal_size": lambda: torch.normal(0.0, 1.0, (8, 8), device="mock"),
    "exponential_": lambda: _p().exponential_(),
    "geometric_": lambda: _p().geometric_(0.3),
    "cauchy_": lambda: _p().cauchy_(),
    "log_normal_": lambda: _p().log_normal_(),
    "random_": lambda: _p().random_(),
    "random_to": lambda: _p().random_(5),
    "random_from_to": lambda: _p().random_(-3, 5),
    "poisson": lambda: torch.poisson(_p()),
    "rrelu": lambda: torch.nn.functional.rrelu(_p() - 1, training=True),
    "init_uniform": lambda: torch.nn.init.uniform_(_p()),
    "init_normal": lambda: torch.nn.init.normal_(_p()),
    "init_trunc_normal": lambda: torch.nn.init.trunc_normal_(_p()),
    "init_kaiming_uniform": lambda: torch.nn.init.kaiming_uniform_(_p()),
    "init_kaiming_normal": lambda: torch.nn.init.kaiming_normal_(_p()),
    "init_xavier_uniform": lambda: torch.nn.init.xavier_uniform_(_p()),
    "init_xavier_normal": lambda: torch.nn.init.xavier_normal_(_p()),
    "init_orthogonal": lambda: torch.nn.init.orthogonal_(_p()),
}  # (nn.init.sparse_ is left out: it draws torch.randperm on the CPU by design)


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_random_op_uses_mock_generator_only(name):
    op = SWEEP[name]
    cpu_before = torch.get_rng_state()
    _set(31337, 64)
    first = op().cpu()
    seed, offset = _seed_offset(torch.mock.get_rng_state())
    assert (seed, offset) != (31337, 64) and offset > 64, "the mock offset did not advance"
    second = op().cpu()
    _set(31337, 64)
    again = op().cpu()
    assert torch.equal(first, again), "not reproducible from the mock (seed, offset)"
    if name not in ("bernoulli_p",):  # a 0/1 mask of 64 elements may repeat; values below
        assert not torch.equal(first, second), "two draws gave the same values"
    assert torch.equal(torch.get_rng_state(), cpu_before), "the CPU generator was used"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64])
def test_float_distributions(dtype):
    torch.mock.manual_seed(0)
    n = 200_000
    u = torch.empty(n, device="mock", dtype=dtype).uniform_(-2, 3).cpu().double()
    assert u.min() >= -2 and u.max() <= 3 and abs(u.mean() - 0.5) < 0.03
    z = torch.empty(n, device="mock", dtype=dtype).normal_(1, 2).cpu().double()
    assert abs(z.mean() - 1) < 0.03 and abs(z.std() - 2) < 0.03
    e = torch.empty(n, device="mock", dtype=dtype).exponential_(4).cpu().double()
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.01


def test_complex_draws_are_pairs_of_reals():
    _set(12, 0)
    c = torch.empty(6, dtype=torch.complex64, device="mock").normal_()
    _set(12, 0)
    r = torch.empty(6, 2, device="mock").normal_(0, 2 ** -0.5)
    assert torch.equal(torch.view_as_real(c).cpu(), r.cpu())
    _set(12, 0)
    u = torch.rand(4, dtype=torch.complex128, device="mock")
    _set(12, 0)
    assert torch.equal(torch.view_as_real(u).cpu(), torch.rand(4, 2, dtype=torch.float64,
                                                               device="mock").cpu())


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16,
                                   torch.int32, torch.int64, torch.float16, torch.float32])
def test_integer_ranges(dtype):
    torch.mock.manual_seed(0)
    x = torch.empty(20_000, device="mock", dtype=dtype)
    lo, hi = (0, 2) if dtype == torch.bool else (0, 7)
    vals = x.random_(lo, hi).cpu().long()
    assert set(vals.unique().tolist()) == set(range(lo, hi))
    b = torch.empty(20_000, device="mock", dtype=dtype).bernoulli_(0.25).cpu().double()
    assert abs(b.mean() - 0.25) < 0.02
    full = torch.empty(20_000, device="mock", dtype=dtype).random_().cpu()
    if dtype.is_floating_point:
        digits = {torch.float16: 11, torch.float32: 24}[dtype]
        assert full.min() >= 0 and full.max() <= 2 ** digits
    elif dtype != torch.bool:
        assert full.min() >= 0 and full.double().max() > torch.iinfo(dtype).max / 2


def test_random_errors():
    x = torch.empty(4, device="mock")
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range, "
                                           r"but found from=2 > to=1"):
        x.uniform_(2, 1)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0, but found std -1"):
        x.normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\], but got "
                                           r"p=1.5"):
        x.bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to', but "
                                           "got from=5 >= to=5"):
        x.random_(5, 5)


def test_dropout_scales_and_masks():
    torch.mock.manual_seed(1)
    x = torch.ones(10_000, device="mock")
    out, mask = torch.native_dropout(x, 0.25, True)
    kept = mask.cpu()
    assert mask.dtype == torch.bool and abs(kept.double().mean() - 0.75) < 0.02
    torch.testing.assert_close(out.cpu(), kept.float() / 0.75)
    same, ones = torch.native_dropout(x, 0.25, False)
    assert torch.equal(same.cpu(), x.cpu()) and bool(ones.all())
